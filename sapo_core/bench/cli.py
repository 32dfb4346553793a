"""`sapo-bench NAME`: each benchmark measures ours and the comparison in one run and ends
with one summary line naming its figures.

Each lives in `sapo_core/bench/<name>.py` with `configure(parser)` and `run(args) -> int`.
Each takes `--log-level` (logs.py): the node's log records print on stderr, `sapo-bench NAME: ...`.
"""

from __future__ import annotations

import argparse
import importlib
import sys

from sapo_core import logs

BENCHMARKS: list[tuple[str, str]] = [
    ("swarm", "publish/gather latency p50/p95 and bytes per round of N light peers on loopback"),
    ("seed", "a seed process's memory and CPU while N light peers join through it, publish, gather and churn"),
    ("training", "GRPO-update tokens/s against a plain forward+backward; peak node memory"),
    ("generation", "rollout tokens/s: our llama.cpp sampler vs rl-swarm's generate x G and HF batched generate"),
    ("tasks", "baseline reward per task, prompt style and answer extraction of the untrained model"),
    ("control", "pause latency p50/p95 and measured CPU use at 25/50/75% throttle of a real node process"),
    ("learning", "held-out solve rate of the base model and after N rounds alone, with the gain's 95% CI"),
    ("baseeval", "the base model's held-out result measured here against the one shipped for a fast first round"),
    (
        "contention",
        "a node round quiet and beside 1 and 2 busy programs: its slowdown and theirs, "
        "with the node's own threads and with a fixed count",
    ),
    ("gui", "dashboard redraw time with 10,000 rounds of history and the GUI process's memory (offscreen)"),
    ("floor", "likelihood of the embedded model's own completions vs injected links and garbage preambles"),
    ("probe", "the round-time estimate from this machine's probe against a real round of the embedded model"),
    ("soak", "a node over N rounds beside churning light peers: RSS, files, processes, disk, round time"),
    ("package", "the packaged app in a clean Debian root: install time, doctor, a first round, the window"),
]


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = argparse.ArgumentParser(prog="sapo-bench", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="bench", metavar="BENCHMARK")
    chosen = next((a for a in argv if not a.startswith("-")), None)
    for name, help_text in BENCHMARKS:
        escaped = help_text.replace("%", "%%")  # argparse %-formats help strings, not descriptions
        p = sub.add_parser(name, help=escaped, description=help_text)
        if name == chosen:
            importlib.import_module(f"sapo_core.bench.{name}").configure(p)
        logs.add_level_argument(p)
    args = parser.parse_args(argv)
    if not args.bench:
        parser.print_help()
        return 2
    logs.apply_level_argument(args)
    logs.to_stderr(prefix=f"sapo-bench {args.bench}: ")
    from sapo_core.modelfiles import ModelUnavailable

    try:
        return int(importlib.import_module(f"sapo_core.bench.{args.bench}").run(args) or 0)
    except ModelUnavailable as e:  # the embedded model is not installed, or a file is missing
        print(f"sapo-bench {args.bench}: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
