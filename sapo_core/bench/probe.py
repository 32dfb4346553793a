"""`sapo-bench probe`: the round-time estimate from this machine's probe against a real round.

`sapo-node hardware --probe` (`commands/hardware.py`, `run_probe`) times two small real rounds of
the embedded model (2 questions x 4 completions of at most 64 tokens); `estimates.estimate_round`
scales what they cost to any configuration and model. This benchmark runs the probe (into a
temporary cache: the user's own probe is left alone), then one real round of the default shape
training alone (`--local` questions x G = 8 of at most 128 tokens, every group trained through a
KL term, as the estimate assumes) and compares. Goal: the estimate within 1.5x of the round,
either way.
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

from sapo_core.bench.settings import add_set_argument, node_config
from sapo_core.control import vocabulary as K

GOAL = 1.5


def configure(p: argparse.ArgumentParser) -> None:
    p.add_argument("--local", type=int, default=3, help="questions in the real round (I)")
    add_set_argument(p, "the real")


def run(args: argparse.Namespace) -> int:
    from sapo_core.catalog import load_catalogue
    from sapo_core.commands.hardware import run_probe
    from sapo_core.estimates import estimate_round
    from sapo_core.hardware import detect_hardware
    from sapo_core.node import Node

    embedded = load_catalogue().embedded
    with tempfile.TemporaryDirectory(prefix="sapo-bench-probe-") as tmp:
        probe = run_probe(Path(tmp) / "cache")
        changes = {"model.name": embedded.id, "run_dir": str(Path(tmp) / "run"), "swarm.enabled": False,
                   "round.external_groups": 0, "round.auto_scale": False, "round.local_groups": args.local,
                   "train.kl_beta": 0.01, "eval.enabled": False}  # fmt: skip
        cfg = node_config(changes, args.set)
        estimate = estimate_round(embedded, detect_hardware(), cfg, probe)
        node = Node(cfg)
        node.setup()
        try:
            measured = node.run_round()[K.TIME_ROUND]
        finally:
            node.close()
    ratio = estimate.seconds / measured
    met = "met" if 1 / GOAL <= ratio <= GOAL else "missed"
    print(
        f"probe: estimate {estimate.seconds:.1f} s, measured {measured:.1f} s, ratio {ratio:.2f} "
        f"(goal within {GOAL}x: {met}); probe round {probe.round_seconds:.1f} s, sampling "
        f"{probe.sample_tok_s:.0f} tok/s, training {probe.train_tok_s:.0f} tok/s, {probe.threads} thread(s)",
        flush=True,
    )
    return 0
