"""sapo-experiment: configurations, the measure by hand (final held-out solve rates, the per-seed
difference and its t-interval), its outputs, and a real dry run (tiny-random nodes in one process,
a real swarm on loopback for the sharing configuration)."""

from __future__ import annotations

import csv
import sys

import pytest

from sapo_core.experiment import (
    CSV_FIELDS,
    PLOT_NEEDS_MATPLOTLIB,
    build_parser,
    difference,
    final_solve_rates,
    main,
    mean_ci,
    node_config,
    parse_configs,
    training_difference,
    write_outputs,
)


def test_parse_configs():
    assert parse_configs("4/0, 2/2") == [(4, 0), (2, 2)]
    for bad in ("4", "0/4", "a/b", "4/-1"):
        with pytest.raises(SystemExit):
            parse_configs(bad)


def _row(seed, config, node, rnd, held=""):
    return {
        "seed": seed,
        "config": config,
        "node": node,
        "round": rnd,
        "reward_mean": 0.0,
        "solve_rate": 0.0,
        "groups_local_with_signal": 0,
        "groups_external": 1 if config == "1/1" else 0,
        "groups_trained": 1,
        "round_seconds": 1.0,
        "eval_solve_rate": held,
        "eval_solve_rate_base": 0.1,
    }


ROWS = [
    # seed 0: isolated nodes end at 0.2 and 0.4, sharing at 0.5 and 0.5 -> +0.2
    _row(0, "2/0", 0, 1, 0.1),
    _row(0, "2/0", 0, 2, 0.2),
    _row(0, "2/0", 1, 2, 0.4),
    _row(0, "2/0", 1, 1),
    _row(0, "1/1", 0, 2, 0.5),
    _row(0, "1/1", 1, 2, 0.5),
    _row(0, "1/1", 1, 1, 0.9),
    # seed 1: 0.3 against 0.3 -> 0; seed 2: 0.5 against 0.4 -> -0.1
    _row(1, "2/0", 0, 2, 0.3),
    _row(1, "1/1", 0, 2, 0.3),
    _row(2, "2/0", 0, 2, 0.5),
    _row(2, "1/1", 0, 2, 0.4),
]


def test_final_solve_rates_take_each_nodes_last_evaluation():
    finals = final_solve_rates(ROWS)
    assert finals[(0, "2/0")] == [0.2, 0.4] and finals[(0, "1/1")] == [0.5, 0.5] and finals[(2, "1/1")] == [0.4]


def test_difference_per_seed_and_its_t_interval_by_hand():
    diffs, (m, lo, hi) = difference(ROWS, "2/0", "1/1")
    assert diffs == pytest.approx([0.2, 0.0, -0.1])
    # mean 0.0333, sd 0.1528, t(2) = 4.303: half-width 4.303 * 0.1528 / sqrt(3) = 0.3795
    assert m == pytest.approx(0.0333, abs=1e-4) and hi - m == pytest.approx(0.3795, abs=1e-3) and m - lo == hi - m
    assert mean_ci([0.25]) == (0.25, 0.25, 0.25)


def test_training_solve_rate_difference_by_hand():
    rows = [dict(_row(0, "2/0", n, r), solve_rate=v) for n, r, v in ((0, 1, 0.0), (0, 2, 0.5), (1, 1, 0.25))]
    rows += [dict(_row(0, "1/1", 0, r), solve_rate=v) for r, v in ((1, 0.5), (2, 0.5))]
    rows += [dict(_row(1, "2/0", 0, 1), solve_rate=0.5), dict(_row(1, "1/1", 0, 1), solve_rate=0.25)]
    diffs, (m, lo, hi) = training_difference(rows, "2/0", "1/1")
    assert diffs == pytest.approx([0.5 - 0.25, 0.25 - 0.5]) and m == pytest.approx(0.0) and lo < 0 < hi


def test_outputs(tmp_path):
    lines = write_outputs(ROWS, tmp_path, "title", ["2/0", "1/1"])
    with open(tmp_path / "experiment.csv") as f:
        read = list(csv.DictReader(f))
    assert list(read[0]) == list(CSV_FIELDS) and len(read) == len(ROWS)
    assert (tmp_path / "experiment.png").stat().st_size > 1000
    assert any(line.startswith("1/1 - 2/0: +0.033 (95% CI -0.346..+0.413) over 3 seeds") for line in lines)
    assert lines[-1].startswith("  training solve rate over all rounds")
    assert (tmp_path / "summary.txt").read_text().startswith("title\n")


def test_outputs_without_matplotlib_say_what_to_install(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # `import matplotlib` raises ImportError
    lines = write_outputs(ROWS, tmp_path, "title", ["2/0", "1/1"])
    assert lines[-1] == PLOT_NEEDS_MATPLOTLIB and "pip install 'sapo-swarm[experiment]'" in lines[-1]
    assert not (tmp_path / "experiment.png").exists()
    assert (tmp_path / "experiment.csv").is_file() and (tmp_path / "summary.txt").is_file()


def test_node_configs_share_identities_across_configurations_not_swarms(tmp_path):
    args = build_parser().parse_args(["--nodes", "2"])
    args.stamp = "x"
    a = node_config(args, tmp_path, 0, "2/0", 1, 2, 0, None)
    b = node_config(args, tmp_path, 0, "1/1", 1, 1, 1, "/ip4/127.0.0.1/tcp/1/p2p/QmX")
    c = node_config(args, tmp_path, 1, "1/1", 1, 1, 1, None)
    assert a.swarm.identity_path == b.swarm.identity_path != c.swarm.identity_path
    assert not a.swarm.enabled and b.swarm.enabled and b.swarm.initial_peers
    assert a.run_dir != b.run_dir and b.swarm.swarm_name != c.swarm.swarm_name
    assert a.round.local_groups + a.round.external_groups == b.round.local_groups + b.round.external_groups
    assert a.eval.enabled and a.eval.every_rounds == 50


@pytest.mark.network
def test_a_dry_run_of_two_seeds_end_to_end(tmp_path, data_dir):
    out = tmp_path / "out"
    assert (
        main(
            [
                "--model",
                "tiny-random",
                "--nodes",
                "2",
                "--seeds",
                "2",
                "--rounds",
                "2",
                "--configs",
                "1/0,1/1",
                "--eval-every",
                "1",
                "--eval-questions",
                "1",
                "--eval-samples",
                "1",
                "--group-size",
                "2",
                "--max-new-tokens",
                "4",
                "--threads",
                "1",
                "--out",
                str(out),
            ]
        )
        == 0
    )
    with open(out / "experiment.csv") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 2 * 2 * 2 * 2  # seeds x configs x nodes x rounds
    assert all(r["eval_solve_rate"] != "" for r in rows)
    assert "1/1 - 1/0" in (out / "summary.txt").read_text()
    assert (out / "experiment.png").is_file()


@pytest.mark.network
def test_runs_in_parallel_processes_write_the_same_rows(tmp_path, data_dir):
    """--jobs 2: each (seed, configuration) in a spawned process of its own; the rows come back in
    the order one process writes them, the sharing run's identities made before the runs start."""
    out = tmp_path / "out"
    assert (
        main(
            [
                "--model",
                "tiny-random",
                "--nodes",
                "2",
                "--seeds",
                "1",
                "--rounds",
                "2",
                "--configs",
                "1/0,1/1",
                "--eval-every",
                "2",
                "--eval-questions",
                "1",
                "--eval-samples",
                "1",
                "--group-size",
                "2",
                "--max-new-tokens",
                "4",
                "--threads",
                "1",
                "--jobs",
                "2",
                "--out",
                str(out),
            ]
        )
        == 0
    )
    with open(out / "experiment.csv") as f:
        rows = list(csv.DictReader(f))
    assert [(r["config"], r["round"], r["node"]) for r in rows] == [
        (c, str(r), str(n)) for c in ("1/0", "1/1") for r in (1, 2) for n in (0, 1)
    ]
    assert sorted(p.name for p in (out / "identities").iterdir()) == ["seed0-node0.key", "seed0-node1.key"]
    assert "1/1 - 1/0" in (out / "summary.txt").read_text()


def test_rows_of_several_files_are_summarised_together(tmp_path):
    """Seeds run at different times: --from-csv merges their rows (a later file's row replaces the
    same seed, configuration, node and round) and summarises them as one run would."""
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir()
    b.mkdir()
    write_outputs(ROWS[:7], a, "SAPO: 4 nodes x 100 rounds x 1 seeds, m", ["2/0", "1/1"])  # seed 0
    write_outputs(ROWS[5:], b, "title b", ["2/0", "1/1"])  # seeds 1 and 2, and two of seed 0's rows again
    out = tmp_path / "merged"
    assert main(["--from-csv", str(a / "experiment.csv"), str(b / "experiment.csv"), "--out", str(out)]) == 0
    with open(out / "experiment.csv") as f:
        assert len(list(csv.DictReader(f))) == len(ROWS)
    summary = (out / "summary.txt").read_text()
    assert summary.startswith("SAPO: 4 nodes x 100 rounds x 3 seeds, m (seeds 0, 1, 2 from 2 file(s))")
    assert "1/1 - 2/0: +0.033 (95% CI -0.346..+0.413) over 3 seeds" in summary
    (tmp_path / "bad.csv").write_text("x,y\n1,2\n")
    with pytest.raises(SystemExit, match="not an experiment.csv"):
        main(["--from-csv", str(tmp_path / "bad.csv"), "--out", str(out)])
