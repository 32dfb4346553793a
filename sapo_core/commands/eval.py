"""`sapo-node eval`: a run's checkpoint against the base model on the held-out questions.

Reads the run's config snapshot (`config.toml` in the run directory: the same model, tasks,
prompt, reward setting and sampling as training), measures the base model (or takes it from
the cache the node filled) and the checkpoint on the held-out set (`sapo_core/evaluation.py`),
and prints per dataset the two solve rates and the gain with its paired-bootstrap 95 % interval.
The node keeps its last two checkpoints; `--round` picks one of those.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from sapo_core import paths
from sapo_core.control import vocabulary as K


def configure(p: argparse.ArgumentParser) -> None:
    p.add_argument("--run-dir", help=f"the run to evaluate (default {paths.default_run_dir()})")
    p.add_argument("--round", type=int, default=0, help="checkpoint of this round (default: the latest)")
    p.add_argument(
        "--questions",
        type=int,
        default=0,
        help="held-out questions per dataset (default: the run's eval.questions, which training skipped)",
    )
    p.add_argument("--samples", type=int, default=0, help="completions per question, k (default: the run's)")
    p.add_argument("--threads", type=int, default=-1, help="threads (default: the run's sampler.threads)")
    p.add_argument("--json", action="store_true", help="print the result as JSON")


def checkpoint_dir(run_dir: Path, round: int) -> Path:
    """The checkpoint of `round` (0: the latest); SystemExit naming the ones there are."""
    base = run_dir / "checkpoints"
    have = sorted(int(p.name.split("-")[1]) for p in base.glob("round-*") if (p / "state.json").is_file())
    if not have:
        raise SystemExit(f"sapo-node eval: no checkpoint in {base}; train first (sapo-node run)")
    want = round or have[-1]
    if want not in have:
        raise SystemExit(
            f"sapo-node eval: no checkpoint of round {want} in {base}; there are: " + ", ".join(map(str, have))
        )
    return base / f"round-{want:06d}"


def load_checkpoint(policy, path: Path) -> dict:
    """Load a checkpoint's trained weights into the policy; its state (round, curriculum...)."""
    from safetensors.torch import load_file

    state = json.loads((path / "state.json").read_text(encoding="utf-8"))
    policy.load_trainable_state_dict(load_file(str(path / "trainable.safetensors")))
    policy.version = int(state.get("policy_version") or 1) or 1  # never 0: that means the base model
    return state


def evaluate_run(
    run_dir: Path, round: int = 0, questions: int = 0, samples: int = 0, threads: int = -1, hooks=None
) -> dict:
    """{'run_dir', 'round', 'model', 'questions', 'samples', 'datasets': {name: figures}, 'figures'}."""
    from sapo_core.config import ConfigError, load_config
    from sapo_core.downloads import TerminalHooks
    from sapo_core.evaluation import EvalSettings, gains_by_dataset
    from sapo_core.evaluator import Evaluator
    from sapo_core.hooks import NullHooks
    from sapo_core.modelfiles import fingerprint, resolve_model
    from sapo_core.policy import load_policy
    from sapo_core.rundir import keep_run_model
    from sapo_core.sampler import make_sampler
    from sapo_core.tasks import TaskSet

    hooks = hooks or NullHooks()
    try:
        cfg = load_config(run_dir / "config.toml")
    except ConfigError as e:
        raise SystemExit(f"sapo-node eval: {run_dir} holds no readable run config ({e})") from None
    q = questions or cfg.eval.questions
    changes = {
        "eval.questions": q,
        "eval.samples": samples or cfg.eval.samples,
    }
    if threads >= 0:
        changes["sampler.threads"] = threads
    cfg = cfg.replace(**changes)
    path = checkpoint_dir(run_dir, round)
    began = json.loads((path / "state.json").read_text(encoding="utf-8")).get("model_id")
    cfg, _ = keep_run_model(cfg, began if isinstance(began, str) else None)  # not today's 'auto' choice
    plan = resolve_model(cfg, TerminalHooks("sapo-node eval"))  # the base model, fetched first if need be
    policy = load_policy(
        cfg.model,
        plan.gguf,
        paths.converted_models_dir(),
        seed=cfg.seed,
        tokenizer_gguf=plan.tokenizer_gguf,
        model_id=plan.model_id,
    )
    tasks = TaskSet(cfg.tasks, seed=0)
    settings = EvalSettings.for_config(cfg)
    sampler, _ = make_sampler(cfg.sampler, policy, paths.cache_dir())
    try:
        if cfg.sampler.threads:
            sampler.set_threads(cfg.sampler.threads)
        sha = fingerprint(plan.gguf, paths.cache_dir()) if plan.gguf is not None else ""
        level_questions = min(cfg.eval.level_questions, cfg.eval.questions)
        evaluator = Evaluator(tasks, settings, cfg.eval.questions, paths.cache_dir(), level_questions, model_sha256=sha)
        evaluator.run(sampler, policy, hooks)  # the base model, measured or from the cache
        state = load_checkpoint(policy, path)
        if "tasks" in state.get("extra", {}):
            tasks.load_state_dict(state["extra"]["tasks"])  # the checkpoint's curriculum levels
        sampler.sync_policy(policy)
        figures = evaluator.run(sampler, policy, hooks)
        datasets = gains_by_dataset(evaluator.last, evaluator.base)
    finally:
        sampler.close()
    return {
        "run_dir": str(run_dir),
        "round": int(state["round"]),
        "model": policy.model_id,
        "questions": cfg.eval.questions,
        "samples": cfg.eval.samples,
        "datasets": datasets,
        "figures": figures,
    }


def format_table(result: dict) -> str:
    lines = [
        f"held-out evaluation of {result['run_dir']}, round {result['round']} ({result['model']}; "
        f"{result['questions']} questions per dataset x {result['samples']} samples)",
        f"{'dataset':<26}{'base':>7}{'round ' + str(result['round']):>12}{'gain':>8}  95% CI",
    ]
    for name, d in result["datasets"].items():
        lines.append(
            f"{name:<26}{d['base']:>7.3f}{d['current']:>12.3f}{d['gain']:>+8.3f}  "
            f"{d['ci_low']:+.3f}..{d['ci_high']:+.3f}"
        )
    allq = result["datasets"]["all"]
    if "greedy_current" in allq:
        lines.append(
            f"{'greedy (all)':<26}{allq['greedy_base']:>7.3f}{allq['greedy_current']:>12.3f}"
            f"{allq['greedy_current'] - allq['greedy_base']:>+8.3f}"
        )
    figures = result["figures"]
    if K.EVAL_LEVEL_SOLVE_RATE in figures:
        lines.append(f"at the current curriculum levels: {figures[K.EVAL_LEVEL_SOLVE_RATE]:.3f}")
    if K.EVAL_CAPABILITY in figures:
        lines += capability_lines(figures)
    return "\n".join(lines)


def capability_lines(figures: dict) -> list[str]:
    """The all-levels figure and its cells: every (dataset, level) solve rate."""
    from sapo_core.config import LEVEL_NAMES

    cells = {}
    for key, value in figures.items():
        parts = key.split("/")
        if len(parts) == 4 and parts[2] in LEVEL_NAMES and key == K.per_dataset(K.EVAL_SOLVE_RATE, *parts[1:3]):
            cells.setdefault(parts[1], {})[parts[2]] = value
    out = ["every level (solve rate per dataset and level; the capability figure is their mean):"]
    for d, levels in cells.items():
        out.append(f"  {d:<24}" + "  ".join(f"{lv} {levels[lv]:.3f}" for lv in LEVEL_NAMES if lv in levels))
    line = f"capability {figures[K.EVAL_CAPABILITY]:.3f}"
    if K.EVAL_CAPABILITY_BASE in figures:
        low, high = figures[K.EVAL_CAPABILITY_GAIN_CI_LOW], figures[K.EVAL_CAPABILITY_GAIN_CI_HIGH]
        line += (
            f" (base {figures[K.EVAL_CAPABILITY_BASE]:.3f}, gain {figures[K.EVAL_CAPABILITY_GAIN]:+.3f}, 95% CI "
            f"{low:+.3f}..{high:+.3f})"
        )
    return out + [line]


def main(args: argparse.Namespace) -> int:
    run_dir = Path(args.run_dir).expanduser() if args.run_dir else paths.default_run_dir()
    if not run_dir.is_dir():
        print(f"sapo-node eval: no run at {run_dir}", file=sys.stderr)
        return 2
    result = evaluate_run(run_dir, args.round, args.questions, args.samples, args.threads)
    print(json.dumps(result, indent=1, sort_keys=True) if args.json else format_table(result))
    return 0
