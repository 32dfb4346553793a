"""`sapo-node swarms`: the swarms this node knows (resources/swarms.toml and the user's
swarms.toml in the data directory), and `sapo-node swarms add <invitation>` to keep one.

    sapo-node swarms                          list them: name, peers, window, shards, tasks
    sapo-node swarms add sapo://join/...      add the invitation's swarm to the user's list
"""

from __future__ import annotations

import argparse
import sys


def configure(p: argparse.ArgumentParser) -> None:
    p.add_argument("action", nargs="?", choices=["list", "add"], default="list", help="list (default) or add")
    p.add_argument("invitation", nargs="?", default="", help="with add: the invitation (sapo://join/...) to keep")
    p.add_argument("--description", default="", help="with add: a line saying what the swarm is")


def main(args: argparse.Namespace) -> int:
    from sapo_core.swarm.invitations import InvitationError, parse_invitation
    from sapo_core.swarm.swarmlist import SwarmEntry, SwarmListError, add_user_swarm, load_swarms, user_swarms_path

    try:
        if args.action == "add":
            if not args.invitation:
                print("sapo-node swarms add: give the invitation (sapo://join/...)", file=sys.stderr)
                return 2
            inv = parse_invitation(args.invitation)
            s = inv.swarm
            entry = SwarmEntry(
                name=s.name,
                description=args.description or "added from an invitation",
                bootstrap=list(inv.peers),
                window_seconds=s.window_seconds,
                shards=s.shards,
                tasks=dict(s.tasks),
                source=str(user_swarms_path()),
            )
            path = add_user_swarm(entry)
            print(
                f"added swarm '{entry.name}' ({len(entry.bootstrap)} peer(s)) to {path}; "
                f"join it with: sapo-node run --swarm {entry.name}"
            )
            for warning in inv.warnings():
                print(f"warning: {warning}", file=sys.stderr)
            return 0
        entries = load_swarms()
    except (InvitationError, SwarmListError) as e:
        print(f"sapo-node swarms: {e}", file=sys.stderr)
        return 2
    for e in entries:
        peers = f"{len(e.bootstrap)} bootstrap peer(s)" if e.bootstrap else "no bootstrap peers"
        tasks = ", ".join(f"{k}:{v:g}" for k, v in e.tasks.items()) or "the default mix"
        print(
            f"{e.name}  ({e.source})\n    {e.description}\n    {peers}; window {e.window_seconds:g} s, "
            f"{e.shards} shards, tasks {tasks}"
        )
    print(f"Add your own to {user_swarms_path()} (same layout), or: sapo-node swarms add <invitation>")
    return 0
