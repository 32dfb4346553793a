"""The run store: rows survive reopening, figures come back as series, bad files give clear errors."""

import io
import math

import pytest

from sapo_core.store import RunStore, StoreError, export_csv


def test_rounds_persist_and_series(tmp_path):
    s = RunStore(tmp_path / "r.sqlite")
    s.record_round(1, {"reward/mean": 0.1, "loss/policy": 0.5}, started=10.0, ended=11.0)
    s.record_round(2, {"reward/mean": 0.3}, started=11.0, ended=12.0)
    s.close()
    s = RunStore(tmp_path / "r.sqlite")
    assert s.last_round() == 2 and s.count() == 2
    assert s.series("reward/mean") == ([1, 2], [0.1, 0.3])
    assert s.series("loss/policy") == ([1], [0.5])
    assert s.keys() == ["cpu/seconds", "loss/policy", "reward/mean"]  # cpu/seconds: every row
    assert [r.round for r in s.rounds(since=1)] == [2]


def test_rerecording_a_round_replaces_it(tmp_path):
    s = RunStore(tmp_path / "r.sqlite")
    s.record_round(1, {"a": 1.0}, 0.0)
    s.record_round(1, {"a": 2.0}, 0.0)
    assert s.count() == 1 and s.series("a") == ([1], [2.0])


def test_non_finite_figures_are_dropped(tmp_path):
    s = RunStore(tmp_path / "r.sqlite")
    s.record_round(1, {"a": math.nan, "b": math.inf, "c": 1.0}, 0.0)
    assert {k: v for k, v in s.rounds()[0].metrics.items() if k != "cpu/seconds"} == {"c": 1.0}


def test_reader_sees_writer(tmp_path):
    w = RunStore(tmp_path / "r.sqlite")
    r = RunStore(tmp_path / "r.sqlite", readonly=True)
    w.record_round(1, {"a": 1.0}, 0.0)
    assert r.last_round() == 1


def test_garbage_file_gives_a_clear_error(tmp_path):
    p = tmp_path / "r.sqlite"
    p.write_bytes(b"this is not a database" * 100)
    with pytest.raises(StoreError, match="unreadable"):
        RunStore(p)


def test_missing_store_readonly(tmp_path):
    with pytest.raises(StoreError, match="no run store"):
        RunStore(tmp_path / "nope.sqlite", readonly=True)


def test_export_csv(tmp_path):
    s = RunStore(tmp_path / "r.sqlite")
    s.record_round(1, {"b": 2.0, "a": 1.0, "cpu/seconds": 3.0}, 1.0, 2.0)
    out = io.StringIO()
    export_csv(s.rounds(), out)
    lines = out.getvalue().splitlines()
    assert lines[0] == "round,started,ended,a,b,cpu/seconds"
    assert lines[1] == "1,1.000,2.000,1.0,2.0,3.0"


# --- what each row bills: CPU given since the previous row ----------------------------------------


def test_each_row_carries_the_cpu_given_since_the_previous_one(tmp_path):
    from sapo_core.cpu import tree_cpu_seconds

    s = RunStore(tmp_path / "r.sqlite")
    before = tree_cpu_seconds()
    sum(i * i for i in range(2_000_000))  # burn some CPU in this process
    s.record_round(1, {"a": 1.0}, 0.0)
    spent = tree_cpu_seconds() - before
    s.record_round(2, {"a": 1.0}, 0.0)
    s.record_round(3, {"a": 1.0, "cpu/seconds": 5.0}, 0.0)  # a figure given by the node is kept
    _, cpu = s.series("cpu/seconds")
    assert 0 < cpu[0] <= spent + 0.05 and cpu[1] < cpu[0] and cpu[2] == 5.0
