"""`sapo-bench baseeval`: the base model's held-out result measured here, against the shipped one.

A new node needs the base model's result on the held-out sets before its first round (the gain is
measured against it): about 80 s on a 2-core CPU, most of a first round's time. For the embedded
model at the default settings the result ships in resources/eval-base/ (evalbase.py). This
benchmark measures it as a node would (the same sampler, sets, seeds and settings) and compares it
with the shipped result of this llama.cpp build's kernels (its CPU features; evalbase.py) completion
by completion; `--write` puts what was measured in the shipped file as these kernels' entry,
keeping other kernels' entries of the same settings; `--questions N` measures only the first N
questions of each set against the same rows of the shipped result (a quarter of the time for a
quarter of the check; the slow test runs 24). One line at the end:

    baseeval: start level 0.227 (96 questions x 4), every level above it 0.047 (+96 x 4); shipped:
    the same (864 of 864 completions), measured with this CPU's kernels; 126 s
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import tempfile
import time
from importlib import resources
from pathlib import Path


def configure(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default="", help="catalogue id (default: the embedded model; tiny-random for a dry run)")
    p.add_argument("--threads", type=int, default=0, help="sampler threads (0 = the node's choice)")
    p.add_argument("--write", action="store_true", help="write what was measured as the shipped result")
    p.add_argument(
        "--questions",
        type=int,
        default=0,
        help="measure only the first N questions of each set, against the same rows of the shipped result "
        "(0 = all; each question has its own seed, so a part is judged exactly like the whole)",
    )


def shipped_path(model_id: str) -> Path:
    """Where the shipped result of a model lives (the source tree's resources/ when installed from source)."""
    from sapo_core.evalbase import SHIPPED_FOLDER

    return Path(str(resources.files("sapo_resources"))) / SHIPPED_FOLDER / f"{model_id}.json"


def same(a, b) -> tuple[int, int]:
    """(completions scored alike, completions) of two results on the same questions."""
    pairs = [(x, y) for s, t in zip(a.solved, b.solved) for x, y in zip(s, t)]
    pairs += list(zip(a.greedy, b.greedy))
    return sum(x == y for x, y in pairs), len(pairs)


def head(scores, n: int):
    """The first `n` questions' rows of a result."""
    return dataclasses.replace(
        scores,
        keys=scores.keys[:n],
        datasets=scores.datasets[:n],
        solved=scores.solved[:n],
        rewards=scores.rewards[:n],
        greedy=scores.greedy[:n],
    )


def run(args: argparse.Namespace) -> int:
    from sapo_core import paths
    from sapo_core.catalog import load_catalogue
    from sapo_core.config import NodeConfig
    from sapo_core.evalbase import load_shipped, measured_where, shipped_key, write_shipped
    from sapo_core.evaluation import EvalSettings, _mean, cell_questions, eval_set, measure, start_levels, upper_cells
    from sapo_core.hooks import NullHooks
    from sapo_core.modelfiles import fingerprint, resolve_model
    from sapo_core.policy import load_policy
    from sapo_core.sampler import make_sampler
    from sapo_core.tasks import TaskSet

    if args.write and args.questions:
        print("sapo-bench baseeval: --write needs every question (leave --questions out)", file=sys.stderr)
        return 2
    started = time.time()
    with tempfile.TemporaryDirectory(prefix="sapo-bench-base-eval-") as tmp:
        cfg = NodeConfig().replace(
            **{
                "model.name": args.model or load_catalogue().embedded.id,
                "run_dir": tmp,
                "sampler.threads": args.threads,
            }
        )
        plan = resolve_model(cfg)
        policy = load_policy(
            cfg.model, plan.gguf, paths.converted_models_dir(), cfg.seed, plan.tokenizer_gguf, plan.model_id
        )
        tasks = TaskSet(cfg.tasks, seed=0)
        settings = EvalSettings.for_config(cfg)
        start = start_levels(tasks)
        sets = [
            (eval_set(tasks.datasets, start, cfg.eval.questions), settings),
            (cell_questions(upper_cells(tasks.datasets, start, cfg.eval.level_questions)), settings.without_greedy()),
        ]
        part = [list(qs[: args.questions or None]) for qs, _ in sets]
        sampler, _ = make_sampler(cfg.sampler, policy, paths.cache_dir())
        try:
            if args.threads:
                sampler.set_threads(args.threads)
            sampler.sync_policy(policy)
            measured = [measure(sampler, policy, tasks, qs, s, NullHooks()) for qs, (_, s) in zip(part, sets)]
            kernels = sampler.kernels
        finally:
            sampler.close()
    sha = fingerprint(plan.gguf, paths.cache_dir()) if plan.gguf is not None else ""
    keys = [shipped_key(plan.model_id, sha, qs, s, tasks, sampler.name) for qs, s in sets]
    n_start, n_upper = len(part[0]), len(part[1])
    rates = [_mean([x for row in m.solved for x in row]) for m in measured]
    line = (
        f"baseeval: start level {rates[0]:.3f} ({n_start} questions x {settings.samples}), every level above it "
        f"{rates[1]:.3f} (+{n_upper} x {settings.samples}); "
    )
    if args.write and sha:
        path = shipped_path(plan.model_id)
        write_shipped(path, list(zip(keys, measured)), kernels)
        line += f"written to {path} for kernels {kernels or '(none)'}"
    elif not sha:
        line += f"nothing is shipped for {plan.model_id} (no model file)"
    else:
        shipped = [load_shipped(k, qs, kernels) for k, (qs, _) in zip(keys, sets)]
        if any(s is None for s in shipped):
            line += "nothing shipped for these settings"
        else:
            alike = [same(m, head(s.scores, len(qs))) for m, s, qs in zip(measured, shipped, part)]
            agree, total = sum(a for a, _ in alike), sum(t for _, t in alike)
            line += f"shipped: {'the same' if agree == total else 'differs'} ({agree} of {total} completions), "
            line += "; ".join(sorted({measured_where(s.kernels, kernels) for s in shipped}))
    print(f"{line}; {time.time() - started:.0f} s", flush=True)
    return 0
