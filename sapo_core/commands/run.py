"""`sapo-node run`: train on this machine, round after round, with a live display.

The config is built in layers: defaults, then the user's config file (`--config`, else
`node.toml` in the data directory when it exists, as the desktop app writes it), then the
swarm chosen by `--join <invitation>` or `--swarm <listed name>` (or `swarm.listed_swarm`),
then the flags. Ctrl-C finishes nothing half-way: the node stops, and the next start resumes after
the last completed round.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from sapo_core import paths
from sapo_core.config import ConfigError, NodeConfig, from_dict, load_config, to_dict


def configure(p: argparse.ArgumentParser) -> None:
    p.add_argument("--rounds", type=int, default=0, help="rounds to run now (0 = until stopped)")
    p.add_argument("--model", help="catalogue id of the model, or 'auto' (see `sapo-node hardware`)")
    p.add_argument("--local", type=int, dest="local_groups", help="own question groups per round, I")
    p.add_argument("--external", type=int, dest="external_groups", help="groups from peers per round, J")
    p.add_argument("--group-size", type=int, help="completions per question, G")
    p.add_argument("--max-new-tokens", type=int, help="longest completion in tokens")
    p.add_argument("--run-dir", help=f"where the run lives (default {paths.default_run_dir()})")
    p.add_argument("--config", help="TOML config file (default: node.toml in the data directory, if any)")
    p.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="any config value, e.g. --set train.learning_rate=1e-4 (repeatable)",
    )
    p.add_argument("--initial-peers", nargs="*", help="multiaddrs of swarm peers to join")
    p.add_argument(
        "--join",
        metavar="INVITATION",
        help="join the swarm of an invitation (sapo://join/<swarm>?peer=...): its name, settings and peers",
    )
    p.add_argument(
        "--swarm",
        metavar="NAME",
        help="join a listed swarm (resources/swarms.toml, or swarms.toml "
        "in the data directory) with its settings and bootstrap peers",
    )
    p.add_argument("--alone", action="store_true", help="train without a swarm (J = 0)")
    p.add_argument("--sampler", choices=["auto", "llamacpp", "transformers"], help="rollout backend")
    p.add_argument("--quiet", action="store_true", help="one line per round, no live display")


def _parse_value(text: str) -> Any:
    import tomllib

    try:
        return tomllib.loads(f"v = {text}")["v"]
    except tomllib.TOMLDecodeError:
        return text  # a bare word: a string


def parse_set(items: list[str], example: str) -> dict[str, Any]:
    """--set KEY=VALUE arguments as config changes (values read as TOML where they parse)."""
    changes: dict[str, Any] = {}
    for item in items:
        if "=" not in item:
            raise ConfigError(f"--set {item}: write KEY=VALUE, e.g. {example}")
        key, value = item.split("=", 1)
        changes[key.strip()] = _parse_value(value.strip())
    return changes


class JoinChoiceError(ValueError):
    """--join or --swarm (or swarm.listed_swarm) names something unusable; the text says what."""


def _apply_swarm_choice(cfg: NodeConfig, args: argparse.Namespace) -> NodeConfig:
    """An invitation (--join), else a listed swarm (--swarm, else swarm.listed_swarm of the config)."""
    from sapo_core.swarm.invitations import InvitationError, apply_invitation, parse_invitation
    from sapo_core.swarm.swarmlist import SwarmListError, apply_swarm, find_swarm

    join, listed = getattr(args, "join", None), getattr(args, "swarm", None)
    if join and listed:
        raise JoinChoiceError("give --join or --swarm, not both")
    try:
        if join:
            invitation = parse_invitation(join)
            for warning in invitation.warnings():
                print(f"sapo-node: warning: {warning}", file=sys.stderr)
            return apply_invitation(cfg, invitation)
        name = listed or cfg.swarm.listed_swarm
        if name:
            extra = [] if listed else list(cfg.swarm.initial_peers)  # peers the user added to a listed swarm
            return apply_swarm(cfg, find_swarm(name), extra)
    except (InvitationError, SwarmListError) as e:
        raise JoinChoiceError(str(e)) from None
    return cfg


def build_config(args: argparse.Namespace) -> NodeConfig:
    if args.config:
        cfg = load_config(args.config)
    elif (paths.data_dir() / "node.toml").is_file():
        cfg = load_config(paths.data_dir() / "node.toml")
    else:
        cfg = NodeConfig()
    cfg = _apply_swarm_choice(cfg, args)
    changes = parse_set(args.set, "train.learning_rate=1e-4")
    flags = {
        "model.name": args.model,
        "round.local_groups": args.local_groups,
        "round.external_groups": args.external_groups,
        "sampler.group_size": args.group_size,
        "sampler.max_new_tokens": args.max_new_tokens,
        "run_dir": args.run_dir,
        "swarm.initial_peers": args.initial_peers,
        "sampler.backend": args.sampler,
    }
    changes.update({k: v for k, v in flags.items() if v is not None})
    if args.alone:
        changes["round.external_groups"] = 0
        changes["swarm.enabled"] = False
    if args.rounds:
        changes.setdefault("round.max_rounds", 0)
    cfg = cfg.replace(**changes) if changes else cfg
    if not cfg.run_dir:
        cfg = cfg.replace(run_dir=str(paths.default_run_dir()))
    return from_dict(to_dict(cfg))


def main(args: argparse.Namespace) -> int:
    from sapo_core.commands.live import run_with_display

    try:
        cfg = build_config(args)
    except ConfigError as e:
        print(f"sapo-node: bad config: {e}", file=sys.stderr)
        return 2
    except JoinChoiceError as e:
        print(f"sapo-node: cannot join: {e}", file=sys.stderr)
        return 2
    if cfg.swarm.enabled and cfg.swarm.list_urls:
        cfg = _refresh_swarm_list(cfg, args)
    Path(cfg.run_dir).mkdir(parents=True, exist_ok=True)
    return run_with_display(cfg, rounds=args.rounds, quiet=args.quiet)


def _refresh_swarm_list(cfg: NodeConfig, args: argparse.Namespace) -> NodeConfig:
    """Fetch the signed swarm list (swarm.list_urls, a few seconds at most) before joining: a
    listed swarm's peers and settings may have changed. Whatever fails is said, and the node goes
    on with the list it had."""
    from sapo_core.swarm.swarmlist import update_swarm_list

    result = update_swarm_list(cfg.swarm.list_urls[:4], timeout=5.0)
    for line in result.lines():
        print(f"sapo-node: swarm list: {line}", file=sys.stderr)
    if result.accepted is None:
        return cfg
    try:
        return build_config(args)
    except (ConfigError, JoinChoiceError) as e:
        print(f"sapo-node: the new swarm list does not fit this node ({e}); keeping the old settings", file=sys.stderr)
        return cfg
