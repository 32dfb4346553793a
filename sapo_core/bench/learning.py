"""`sapo-bench learning`: does one node alone make its model better on questions it never saw?

A fresh run directory, N rounds of `sapo-node run --alone` with the default settings (the
embedded model unless `--set model.name=...`), the held-out evaluation (`sapo_core/evaluation.py`)
before the first round and after the last; the node in this process, its figures as the run
store holds them. Ends with one line:

    learning: solved base 0.15 -> 0.37 after 150 rounds, gain +0.22 (95% CI +0.14..+0.31), +0.12 per
    CPU-hour; per dataset basic_arithmetic +0.48 (+0.38..+0.58); ...; 56 min, 1.85 CPU-hours

The goal is a held-out solve rate of 0.50 after 150 rounds on the embedded model, every
dataset's gain with its interval above 0: a figure for docs/benchmarks.md, not a test. CPU-hours count
the node's process and its sampler (evaluations included). The default run takes under an hour
on 2 free cores (docs/calibration.md,
'Held-out evaluation schedule'); on a busy machine give `--threads 1` (docs/environment.md,
'OpenMP threads under contention').
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path


def configure(p: argparse.ArgumentParser) -> None:
    p.add_argument("--rounds", type=int, default=150, help="rounds to train, alone")
    p.add_argument("--threads", type=int, default=0, help="sampler and torch threads (0 = physical cores)")
    p.add_argument("--run-dir", default="", help="keep the run here (default: a temporary directory)")
    p.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="any other config value, e.g. --set train.learning_rate=1e-4 (repeatable)",
    )


def learning_config(run_dir: Path, rounds: int, threads: int, sets: list[str]):
    from sapo_core.commands.run import _parse_value
    from sapo_core.config import NodeConfig

    changes = {
        "run_dir": str(run_dir),
        "round.external_groups": 0,
        "swarm.enabled": False,
        "round.max_rounds": rounds,
        "sampler.threads": threads,
        "eval.enabled": True,
    }
    for item in sets:
        key, sep, value = item.partition("=")
        if not sep:
            raise SystemExit(f"--set {item}: write KEY=VALUE")
        changes[key.strip()] = _parse_value(value.strip())
    return NodeConfig().replace(**changes)


def summary_line(
    last: dict[str, float], rounds: int, minutes: float, cpu_hours: float, signal: list[float] | None = None
) -> str:
    """The benchmark's one line, from the final evaluation's figures (they hold the base's and
    each dataset's gain), the CPU time of the node's process and its sampler over the rounds, and
    `signal`: each round's trained groups of ours (with reward spread)."""
    keys = [k.split("/") for k in last]
    datasets = sorted(k[1] for k in keys if len(k) == 3 and k[0] == "eval" and k[2] == "gain")

    def gain(d: str) -> str:
        low, high = last[f"eval/{d}/gain_ci_low"], last[f"eval/{d}/gain_ci_high"]
        return f"{d} {last[f'eval/{d}/gain']:+.2f} ({low:+.2f}..{high:+.2f})"

    per = "; ".join(gain(d) for d in datasets)
    rate = f", {last['eval/gain'] / cpu_hours:+.2f} per CPU-hour" if cpu_hours > 0 else ""
    every = ""
    if "eval/capability_gain" in last:
        every = (
            f"; every level {last['eval/capability_base']:.2f} -> {last['eval/capability']:.2f}, gain "
            f"{last['eval/capability_gain']:+.2f} ({last['eval/capability_gain_ci_low']:+.2f}.."
            f"{last['eval/capability_gain_ci_high']:+.2f})"
        )
    groups = ""
    if signal:
        tenth = max(1, len(signal) // 10)
        first, end = signal[:tenth], signal[-tenth:]
        groups = (
            f"; groups with signal per round {sum(first) / len(first):.2f} in the first {len(first)} rounds, "
            f"{sum(end) / len(end):.2f} in the last {len(end)}"
        )
    return (
        f"learning: solved base {last['eval/solve_rate_base']:.2f} -> {last['eval/solve_rate']:.2f} after {rounds} "
        f"rounds, gain {last['eval/gain']:+.2f} (95% CI {last['eval/gain_ci_low']:+.2f}.."
        f"{last['eval/gain_ci_high']:+.2f}){rate}{every}; per dataset {per}{groups}; {minutes:.0f} min, "
        f"{cpu_hours:.2f} CPU-hours"
    )


def run(args: argparse.Namespace) -> int:
    from sapo_core.cpu import tree_cpu_seconds
    from sapo_core.node import Node

    if args.rounds < 1:
        raise SystemExit("--rounds must be at least 1")
    with tempfile.TemporaryDirectory(prefix="sapo-bench-learning-") as tmp:
        run_dir = Path(args.run_dir).expanduser() if args.run_dir else Path(tmp) / "run"
        if run_dir.exists() and any(run_dir.iterdir()):
            raise SystemExit(f"{run_dir} is not empty: the benchmark needs a fresh run directory")
        cfg = learning_config(run_dir, args.rounds, args.threads, args.set)
        print(
            f"learning bench: {args.rounds} rounds alone in {run_dir}, load average "
            f"{' '.join(f'{x:.1f}' for x in os.getloadavg())}",
            flush=True,
        )
        node = Node(cfg)  # its warnings, held-out and curriculum lines: log records, on stderr
        started, cpu_started = time.time(), tree_cpu_seconds()
        try:
            node.setup()
            last: dict[str, float] = {}
            signal: list[float] = []
            for r in range(1, args.rounds + 1):
                m = node.run_round(final=r == args.rounds)
                signal.append(m.get("groups/trained", 0.0))
                if "eval/solve_rate" in m:
                    last = m
                print(
                    f"round {r}/{args.rounds}: reward {m['reward/mean']:.3f}, solved {m['accuracy/mean']:.3f}, "
                    f"{m['time/round']:.0f} s"
                    + (f", held-out {m['eval/solve_rate']:.3f}" if "eval/solve_rate" in m else ""),
                    flush=True,
                )
            cpu_hours = (tree_cpu_seconds() - cpu_started) / 3600  # the sampler child included, before it stops
        finally:
            node.close()
        minutes = (time.time() - started) / 60
    print(f"load average at the end: {' '.join(f'{x:.1f}' for x in os.getloadavg())}")
    print(summary_line(last, args.rounds, minutes, cpu_hours, signal))
    return 0
