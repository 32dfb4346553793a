"""The shipped base results (sapo_core/evalbase.py): one entry per llama.cpp kernel set measured,
a node takes its own kernels' entry where there is one, else the reference machine's, else any;
`sapo-bench baseeval --write` adds or replaces one kernel set's entries and drops stale settings."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from sapo_core.evalbase import load_shipped, measured_where, write_shipped
from sapo_core.evaluation import EvalScores
from sapo_core.sampler.base import build_features

AVX2 = "AVX AVX2 BMI2 F16C FMA LLAMAFILE OPENMP REPACK SSE3 SSSE3"
AVX512 = "AVX AVX2 AVX512 BMI2 F16C FMA LLAMAFILE OPENMP REPACK SSE3 SSSE3"
KEY = {"set": "start", "model": "m"}
STALE = {"set": "start", "model": "m", "prompt": "one_shot"}
QUESTIONS = [SimpleNamespace(id=SimpleNamespace(key=lambda k=k: k)) for k in ("q1", "q2")]


def scores(first: float) -> EvalScores:
    return EvalScores(
        keys=["q1", "q2"], datasets=["a", "a"], solved=[[first, 0.0], [1.0, 1.0]], rewards=[[0.0] * 2] * 2
    )


def shipped_file(tmp_path, entries) -> list:
    path = tmp_path / "m.json"
    path.write_text(json.dumps({"results": entries}))
    return [path]


def entry(first: float, kernels=..., key=KEY) -> dict:
    e = {"key": key, "scores": scores(first).to_json()}
    if kernels is not ...:
        e["kernels"] = kernels
    return e


@pytest.mark.parametrize(
    "system_info, features",
    [
        (
            "CPU : SSE3 = 1 | SSSE3 = 1 | AVX = 1 | AVX2 = 1 | F16C = 1 | FMA = 1 | BMI2 = 1 | LLAMAFILE = 1 | "
            "OPENMP = 1 | REPACK = 1 | ",
            AVX2,
        ),  # fmt: skip
        ("CPU : AVX2 = 1 | AVX512 = 0 | SSE3 = 1 |", "AVX2 SSE3"),  # what is off does not count
        ("CUDA : ARCHS = 890 | USE_GRAPHS = 1 | CPU : SSE3 = 1 | AMX_INT8 = 1 |", "AMX_INT8 SSE3 USE_GRAPHS"),
        ("", ""),
    ],
)
def test_a_builds_kernels_are_its_features_that_are_on(system_info, features):
    assert build_features(system_info) == features


@pytest.mark.parametrize(
    "entries, kernels, taken",
    [
        # (first completion of the entry taken, and the kernels it says it was measured with)
        ([entry(0.0), entry(1.0, AVX2)], AVX2, (1.0, AVX2)),  # this CPU's kernels first
        ([entry(0.0), entry(1.0, AVX2)], AVX512, (0.0, None)),  # else the reference machine's
        ([entry(1.0, AVX2)], AVX512, (1.0, AVX2)),  # else any: a few completions apart beats a minute
        ([entry(1.0, AVX2, STALE)], AVX2, None),  # never another key's
        ([entry(1.0, 7), entry(0.0)], 7, (0.0, None)),  # kernels that are not text: not an entry
        ([{"key": KEY, "kernels": AVX2, "scores": {"keys": []}}, entry(0.0)], AVX2, (0.0, None)),  # broken
    ],
)
def test_a_node_takes_its_own_kernels_result_then_the_references_then_any(tmp_path, entries, kernels, taken):
    found = load_shipped(KEY, QUESTIONS, kernels, shipped_file(tmp_path, entries))
    assert (found and (found.scores.solved[0][0], found.kernels)) == taken


def test_a_result_for_other_questions_is_not_taken(tmp_path):
    assert load_shipped(KEY, QUESTIONS[:1], AVX2, shipped_file(tmp_path, [entry(1.0, AVX2)])) is None


def test_writing_one_kernel_sets_result_keeps_the_others_and_drops_stale_settings(tmp_path):
    [path] = shipped_file(tmp_path, [entry(0.0), entry(0.0, AVX2), entry(0.0, AVX512, STALE)])
    write_shipped(path, [(KEY, scores(1.0))], AVX2)
    kept = [(e["key"], e.get("kernels"), e["scores"]["solved"][0][0]) for e in json.loads(path.read_text())["results"]]
    assert kept == [(KEY, None, 0.0), (KEY, AVX2, 1.0)]
    write_shipped(path, [(KEY, scores(0.0))], AVX512)
    assert len(json.loads(path.read_text())["results"]) == 3


def test_the_log_says_where_the_shipped_result_was_measured():
    assert measured_where(AVX2, AVX2) == "measured with this CPU's kernels"
    assert "reference machine" in measured_where(None, AVX2) and f"this CPU's ({AVX2})" in measured_where(None, AVX2)
    assert f"other kernels ({AVX512})" in measured_where(AVX512, AVX2)
