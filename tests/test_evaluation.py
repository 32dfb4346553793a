"""Held-out evaluation: the set is fixed and never drawn by training, the bootstrap is right by
hand, the figures carry the names the GUI reads, the base model's result is cached, and a real
(tiny-random) policy is measured through a real sampler."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch

from sapo_core.config import DEFAULT_TASK_WEIGHTS, PAPER_SPECIALTIES, NodeConfig, TaskConfig
from sapo_core.evalbase import base_weights, load_cached
from sapo_core.evaluation import (
    EVAL_SEED,
    MAX_EVAL_QUESTIONS,
    EvalScores,
    EvalSettings,
    HeldOut,
    eval_question,
    eval_set,
    gains_by_dataset,
    paired_bootstrap,
    set_name,
    summarize,
)
from sapo_core.evaluator import Evaluator
from sapo_core.tasks import LEVELS, MAX_INDEX, MAX_SEED, TaskSet, _generate

from helpers import tiny_random_policy

DEFAULT = tuple(DEFAULT_TASK_WEIGHTS)

# --- the set ------------------------------------------------------------------------------------


@pytest.mark.parametrize("dataset", PAPER_SPECIALTIES)
def test_reasoning_gym_item_i_of_seed_s_is_item_0_of_seed_s_plus_i(dataset):
    """What disjointness rests on: an item depends on seed + index alone, so every training draw
    (seed < MAX_SEED, index < MAX_INDEX) is an item below MAX_SEED + MAX_INDEX <= EVAL_SEED."""
    assert _generate(dataset, 0, 1000, 37)["question"] == _generate(dataset, 0, 1037, 0)["question"]
    assert EVAL_SEED >= MAX_SEED + MAX_INDEX


def test_the_set_is_the_same_every_time_and_in_a_fresh_process():
    levels = {d: 0 for d in DEFAULT}
    a = eval_set(DEFAULT, levels, 5)
    b = eval_set(DEFAULT, levels, 5)
    assert [(q.id, q.text, q.answer) for q in a] == [(q.id, q.text, q.answer) for q in b]
    assert len(a) == 15 and all(q.id.seed == EVAL_SEED for q in a)
    script = (
        "import json\nfrom sapo_core.evaluation import eval_set, set_name\n"
        f"print(json.dumps(set_name(eval_set({list(DEFAULT)!r}, {levels!r}, 5))))"
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True)
    assert json.loads(out.stdout.strip().splitlines()[-1]) == set_name(a)


def test_levels_give_other_questions_and_indices_are_bounded():
    assert eval_question("basic_arithmetic", 0, 3).text != eval_question("basic_arithmetic", 2, 3).text
    with pytest.raises(ValueError):
        eval_question("basic_arithmetic", 0, MAX_EVAL_QUESTIONS)


def test_training_never_draws_a_held_out_question():
    """Easy basic_arithmetic has ~240 texts, so seeds alone do not keep them apart: the texts do."""
    held = HeldOut(32)
    tasks = TaskSet(TaskConfig(), seed=7, held_out=held)
    drawn = [q for r in range(150) for q in tasks.sample_questions(r, 4)]
    for q in drawn:
        assert q.text not in held.texts(q.id.dataset, 0)
    unfiltered = TaskSet(TaskConfig(), seed=7)
    collisions = [
        q for r in range(150) for q in unfiltered.sample_questions(r, 4) if q.text in held.texts(q.id.dataset, 0)
    ]
    assert collisions  # without the filter training would see some of them


# --- the figures ------------------------------------------------------------------------------


def test_held_out_completions_are_as_long_as_training_ones_unless_eval_says():
    cfg = NodeConfig().replace(**{"sampler.max_new_tokens": 48})
    assert EvalSettings.for_config(cfg).max_new_tokens == 48
    assert EvalSettings.for_config(cfg.replace(**{"eval.max_new_tokens": 96})).max_new_tokens == 96
    hot = NodeConfig().replace(**{"sampler.temperature": 0.7})
    assert EvalSettings.for_config(hot).temperature == 0.7
    assert EvalSettings.for_config(hot.replace(**{"eval.temperature": 1.0})).temperature == 1.0


def test_paired_bootstrap_by_hand():
    assert paired_bootstrap([0.5, 0.25], [0.5, 0.25]) == (0.0, 0.0, 0.0)
    assert paired_bootstrap([0.75, 1.0, 0.5], [0.5, 0.75, 0.25]) == pytest.approx((0.25, 0.25, 0.25))
    gain, lo, hi = paired_bootstrap([1.0, 0.0, 1.0, 1.0], [0.0, 0.0, 0.0, 1.0], seed=3)
    assert gain == 0.5 and 0.0 <= lo <= gain <= hi <= 1.0 and lo < hi
    assert paired_bootstrap([1.0, 0.0, 1.0, 1.0], [0.0, 0.0, 0.0, 1.0], seed=3) == (gain, lo, hi)
    with pytest.raises(ValueError):
        paired_bootstrap([1.0], [])


def _scores(solved, datasets=None, greedy=()):
    n = len(solved)
    return EvalScores(
        keys=[f"q{i}" for i in range(n)],
        datasets=datasets or ["a"] * n,
        solved=solved,
        rewards=[[x * 1.0 for x in s] for s in solved],
        greedy=list(greedy),
    )


def test_summarize_names_the_figures_as_the_interface_says():
    base = _scores([[0, 0], [0, 1], [0, 0], [1, 1]], ["a", "a", "b", "b"], greedy=[0, 0, 0, 1])
    now = _scores([[1, 0], [1, 1], [0, 1], [1, 1]], ["a", "a", "b", "b"], greedy=[1, 1, 0, 1])
    m = summarize(now, base)
    assert m["eval/solve_rate"] == 6 / 8 and m["eval/solve_rate_base"] == 3 / 8
    assert m["eval/gain"] == pytest.approx(3 / 8) and m["eval/gain_ci_low"] <= 3 / 8 <= m["eval/gain_ci_high"]
    assert m["eval/greedy_solve_rate"] == 0.75 and m["eval/reward_mean"] == 6 / 8
    assert m["eval/a/solve_rate"] == 0.75 and m["eval/b/solve_rate"] == 0.75
    assert m["eval/a/gain"] == pytest.approx(0.5) and m["eval/b/gain"] == pytest.approx(0.25)
    assert m["eval/a/gain_ci_low"] <= 0.5 <= m["eval/a/gain_ci_high"]
    assert (m["eval/questions"], m["eval/samples"]) == (4, 2)
    assert "eval/gain" not in summarize(now, None)
    by = gains_by_dataset(now, base)
    assert by["a"]["base"] == 0.25 and by["a"]["current"] == 0.75 and by["all"]["gain"] == pytest.approx(3 / 8)
    assert by["all"]["greedy_base"] == 0.25 and by["all"]["greedy_current"] == 0.75


# --- measuring a real policy ------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    from sapo_core.sampler.transformers import TransformersSampler

    policy = tiny_random_policy(seed=1)
    return policy, TransformersSampler(policy)


def test_the_base_is_measured_once_then_read_from_the_cache(tiny, tmp_path):
    policy, sampler = tiny
    tasks = TaskSet(TaskConfig(), seed=0)
    settings = EvalSettings(samples=2, greedy=True, temperature=1.0, top_p=1.0, max_new_tokens=6)
    first = Evaluator(tasks, settings, 2, tmp_path)
    m = first.run(sampler, policy, _Hooks())
    assert m["eval/questions"] == 6 and m["eval/samples"] == 2 and m["eval/gain"] == 0.0
    assert m["eval/level_solve_rate"] == m["eval/solve_rate"]
    cached = list((tmp_path / "eval").glob("base-*.json"))
    assert len(cached) == 1 and load_cached(cached[0], first.questions).keys == first.base.keys
    cached[0].write_text(json.dumps({**json.loads(cached[0].read_text()), "solved": [[1.0, 1.0]] * 6}))
    second = Evaluator(tasks, settings, 2, tmp_path)  # reads the (doctored) cache, measures nothing new
    m2 = second.run(sampler, policy, _Hooks())
    assert m2["eval/solve_rate_base"] == 1.0


def test_base_weights_zero_the_adapter_and_restore_it(tiny):
    policy, sampler = tiny
    before = policy.trainable_state_dict()
    with torch.no_grad():
        for name, p in policy.model.named_parameters():
            if "lora_B" in name:
                p.add_(0.01)
    trained = policy.trainable_state_dict()
    version = policy.version
    with base_weights(policy, sampler):
        assert policy.version == -1
        assert all(float(p.detach().abs().sum()) == 0 for n, p in policy.model.named_parameters() if "lora_B" in n)
    after = policy.trainable_state_dict()
    assert policy.version == version and all(torch.equal(trained[k], after[k]) for k in trained)
    policy.load_trainable_state_dict(before)


class _Hooks:
    def __init__(self):
        self.phases = set()

    def checkpoint(self):
        return None

    def progress(self, phase, done, total, **info):
        self.phases.add(phase)


def test_levels_above_the_start_are_measured_too(tiny, tmp_path):
    policy, sampler = tiny
    tasks = TaskSet(TaskConfig(weights={"basic_arithmetic": 1.0}, curriculum_window=4), seed=0)
    q = tasks.sample_questions(0, 1)[0]
    from sapo_core.rollouts import Completion, Group

    tasks.observe(Group(question=q, completions=[Completion(text=f"Answer: {q.answer}")] * 4))
    assert tasks.curriculum.level("basic_arithmetic") == 1
    hooks = _Hooks()
    m = Evaluator(
        tasks, EvalSettings(samples=1, greedy=False, temperature=1.0, top_p=1.0, max_new_tokens=4), 2, tmp_path
    ).run(sampler, policy, hooks)
    assert "eval/basic_arithmetic/level_solve_rate" in m and "eval/level_solve_rate" in m
    assert hooks.phases == {"eval"}
    assert LEVELS  # the module's levels are what the set is built from


# --- sapo-node eval and the worker's last round ------------------------------------------------------


def test_sapo_node_eval_compares_a_checkpoint_with_the_base(tmp_path, data_dir):
    from sapo_core.cli import main
    from sapo_core.commands.eval import checkpoint_dir, evaluate_run, format_table
    from sapo_core.node import Node

    from helpers import light_config

    run = tmp_path / "run"
    node = Node(light_config(run, max_new_tokens=6, **{"eval.questions": 2, "eval.samples": 2}))
    node.setup()
    node.run_round()
    node.run_round()
    node.close()
    with pytest.raises(SystemExit, match="there are: 1, 2"):
        checkpoint_dir(run, 7)
    result = evaluate_run(run, round=1)
    assert result["round"] == 1 and result["questions"] == 2 and result["samples"] == 2
    assert set(result["datasets"]) == {*DEFAULT, "all"} and result["datasets"]["all"]["questions"] == 6
    assert "95% CI" in format_table(result)
    assert main(["eval", "--run-dir", str(run), "--json", "--questions", "1"]) == 0


@pytest.mark.node_process
def test_a_run_of_set_length_ends_with_an_evaluation_in_its_last_round(tmp_path, tmp_path_factory):
    from sapo_core.control import protocol as P
    from sapo_core.control.client import NodeClient

    from helpers import light_config, light_env

    client = NodeClient(env=light_env(tmp_path, tmp_path_factory), heartbeat_timeout=None)
    cfg = light_config(
        tmp_path / "run",
        max_new_tokens=4,
        **{"eval.enabled": True, "eval.questions": 1, "eval.samples": 1, "eval.every_rounds": 0},
    )
    client.start(cfg, rounds=2)
    done = {}
    try:
        for ev in client.events(timeout=600):
            if isinstance(ev, P.RoundDone):
                done[ev.round] = ev.metrics
            if isinstance(ev, P.State) and ev.state in (P.STOPPED, P.CRASHED):
                break
    finally:
        client.stop()
    assert "eval/solve_rate" in done[1] and "eval/solve_rate_base" in done[1]  # the baseline
    assert "eval/solve_rate" in done[2] and done[2]["eval/questions"] == 3  # the end of the run


def test_capability_is_the_mean_of_the_cells_by_hand():
    """Each (dataset, level) cell weighs alike, however many questions it has; the gain's interval
    resamples questions within each cell, so a cell that moved by the same amount on every question
    gives a zero-width interval around that amount."""
    from sapo_core.evaluation import capability

    cells = [([1.0, 0.5, 0.0, 0.5], [0.5, 0.0, 0.0, 0.5]), ([0.25, 0.25], [0.0, 0.0])]
    m = capability(cells, resamples=200)
    assert m["eval/capability"] == pytest.approx((0.5 + 0.25) / 2)
    assert m["eval/capability_base"] == pytest.approx((0.25 + 0.0) / 2)
    assert m["eval/capability_gain"] == pytest.approx(0.25)
    assert m["eval/capability_gain_ci_low"] <= 0.25 <= m["eval/capability_gain_ci_high"]
    even = capability([([0.5, 0.5], [0.25, 0.25]), ([1.0], [0.75])], resamples=50)
    assert even["eval/capability_gain_ci_low"] == pytest.approx(0.25) == even["eval/capability_gain_ci_high"]
    assert set(capability([([1.0], None)])) == {"eval/capability"}  # no base: no gain


def test_the_all_levels_cells_lie_above_the_start_level_and_training_skips_them():
    """The cells: every level above each dataset's start level, the same first questions of the
    held-out seed as the start set uses, so the texts training skips (HeldOut) cover them."""
    from sapo_core.evaluation import HeldOut, cell_questions, upper_cells
    from sapo_core.tasks import LEVELS, TaskSet

    cfg = TaskConfig(weights={"basic_arithmetic": 1.0, "bf": 1.0}, levels={"bf": "medium"})
    tasks = TaskSet(cfg, seed=0)
    cells = upper_cells(tasks.datasets, {"basic_arithmetic": 0, "bf": 1}, 3)
    assert [(c.dataset, c.level_name, c.start, c.count) for c in cells] == [
        ("basic_arithmetic", "medium", 0, 3),
        ("basic_arithmetic", "hard", 3, 3),
    ]  # bf has two levels: from medium there is none above
    assert len(LEVELS["bf"]) == 2
    held = HeldOut(per_dataset=8)
    questions = cell_questions(cells)
    assert all(held(q.id.dataset, 1 + (i >= 3), q.text) for i, q in enumerate(questions))
    medium = TaskConfig(weights={"basic_arithmetic": 1.0}, levels={"basic_arithmetic": "medium"})
    drawn = [q for r in range(60) for q in TaskSet(medium, seed=r, held_out=held).sample_questions(r, 4)]
    assert not {q.text for q in drawn} & {q.text for q in questions[:3]}  # the medium cell's texts


def test_a_shipped_base_result_is_used_for_its_model_file_only(tiny, tmp_path, monkeypatch):
    """With the model file's SHA-256 the evaluator looks for a shipped result of exactly its key
    (evalbase.py) before measuring the base model; another file's (another SHA-256) is never used,
    and what it used goes into the cache like a measured one."""
    from sapo_core import evalbase

    policy, sampler = tiny
    tasks = TaskSet(TaskConfig(), seed=0)
    settings = EvalSettings(samples=2, greedy=False, temperature=1.0, top_p=1.0, max_new_tokens=6)
    probe = Evaluator(tasks, settings, 2, tmp_path / "probe", model_sha256="ab" * 32)
    fake = EvalScores(
        keys=[q.id.key() for q in probe.questions],
        datasets=[q.id.dataset for q in probe.questions],
        solved=[[1.0, 0.0]] * len(probe.questions),
        rewards=[[1.0, 0.0]] * len(probe.questions),
    )
    key = evalbase.shipped_key(policy.model_id, "ab" * 32, probe.questions, settings, tasks, sampler.name)
    shipped = tmp_path / "shipped.json"
    evalbase.write_shipped(shipped, [(key, fake)], sampler.kernels)
    monkeypatch.setattr(evalbase, "shipped_files", lambda: [shipped])
    m = Evaluator(tasks, settings, 2, tmp_path / "a", model_sha256="ab" * 32).run(sampler, policy, _Hooks())
    assert m["eval/solve_rate_base"] == 0.5 == m["eval/solve_rate"]  # version 0: the base itself, as shipped
    assert len(list((tmp_path / "a" / "eval").glob("base-*.json"))) == 1
    other = Evaluator(tasks, settings, 2, tmp_path / "b", model_sha256="cd" * 32).run(sampler, policy, _Hooks())
    assert other["eval/solve_rate_base"] == 0.0  # measured: random weights solve nothing


@pytest.mark.slow
def test_the_shipped_base_result_is_what_this_machine_measures(capsys):
    """resources/eval-base/: the embedded model's base result at the default settings, measured again
    here completion by completion (sapo-bench baseeval) on the first quarter of each set (each
    question has its own seed; the whole set is the benchmark's): a new node's first round skips
    the minute-long base evaluation on the strength of it."""
    from sapo_core.bench.cli import main

    assert main(["baseeval", "--threads", "1", "--questions", "24"]) == 0
    line = capsys.readouterr().out.strip().splitlines()[-1]
    assert "(24 questions x 4)" in line and "(+24 x 4)" in line, line
    assert "shipped: the same (216 of 216 completions)" in line, line  # 24 x (4 + 1 greedy) + 24 x 4


def test_the_shipped_base_result_is_written_only_from_every_question(capsys):
    from sapo_core.bench.cli import main

    assert main(["baseeval", "--write", "--questions", "3"]) == 2
    assert "--write needs every question" in capsys.readouterr().err


@pytest.mark.slow
def test_a_new_node_at_the_defaults_takes_the_shipped_base_result(tmp_path, data_dir, monkeypatch):
    """A volunteer's first node (the embedded model, default settings): the base model's held-out
    result before round 1 is the shipped one, found by the model file's SHA-256, so not one base
    completion is sampled (a fresh first run measured it for 99 s while the node passed no SHA-256)."""
    from sapo_core import evalbase, evaluator
    from sapo_core.config import NodeConfig
    from sapo_core.node import Node

    def no_sampling(*args, **kwargs):
        raise AssertionError("the base model was measured, not taken from resources/eval-base/")

    taken = []

    def load_shipped(key, questions, kernels):
        taken.append((kernels, evalbase.load_shipped(key, questions, kernels)))
        return taken[-1][1]

    monkeypatch.setattr(evaluator, "load_cached", lambda path, questions: None)  # as on a fresh machine
    monkeypatch.setattr(evaluator, "measure", no_sampling)
    monkeypatch.setattr(evaluator, "load_shipped", load_shipped)
    node = Node(NodeConfig().replace(**{"run_dir": str(tmp_path / "run"), "swarm.enabled": False}))
    node.setup()
    try:
        figures = node.evaluate()
    finally:
        node.close()
    (kernels, start), (_, upper) = taken
    assert (
        kernels and start.kernels in (kernels, None) and upper.kernels == start.kernels
    )  # this CPU's, or the reference's
    solved = [x for row in start.scores.solved for x in row]
    assert figures["eval/solve_rate_base"] == figures["eval/solve_rate"] == pytest.approx(sum(solved) / len(solved))
    # the reference machine's (AVX-512) and an AVX2-only EPYC's: 11 of 864 completions score otherwise
    expected = {None: (0.227, 0.107)}.get(start.kernels, (0.237, 0.109))
    assert figures["eval/solve_rate_base"] == pytest.approx(expected[0], abs=0.001)
    assert figures["eval/capability_base"] == pytest.approx(expected[1], abs=0.001)
