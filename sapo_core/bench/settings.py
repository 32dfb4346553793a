"""`--set KEY=VALUE` for the benchmarks that start a node: any config value over the benchmark's
own choices, as `sapo-node run --set` takes them. Their tests run each benchmark end to end on
tiny settings this way (`--set model.name=tiny-random ...`: tests/test_bench_cli.py)."""

from __future__ import annotations

import argparse
from typing import Any

EXAMPLE = "model.name=tiny-random"


def add_set_argument(parser: argparse.ArgumentParser, what: str = "the node's") -> None:
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help=f"any other config value of {what} rounds, e.g. --set {EXAMPLE} (repeatable)",
    )


def node_config(changes: dict[str, Any], sets: list[str]):
    """The default NodeConfig with the benchmark's `changes`, then --set's; SystemExit naming the
    problem for a key or value the config refuses."""
    from sapo_core.commands.run import parse_set
    from sapo_core.config import ConfigError, NodeConfig

    try:
        return NodeConfig().replace(**{**changes, **parse_set(sets, EXAMPLE)})
    except (ConfigError, TypeError, ValueError) as e:
        raise SystemExit(f"--set: {e}") from None
