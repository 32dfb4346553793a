"""`sapo-node swarms`: the swarms this node knows (resources/swarms.toml, the last signed list
fetched, and the user's swarms.toml in the data directory), and what changes them.

    sapo-node swarms                          list them: name, peers, window, shards, tasks
    sapo-node swarms add sapo://join/...      add the invitation's swarm to the user's list
    sapo-node swarms update [--url URL]       fetch the signed list (swarm.list_urls by default)
    sapo-node swarms keygen --key FILE        a maintainer's signing key, and its public line
    sapo-node swarms sign LIST --key FILE     sign a list in place (swarm/signedlist.py)
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def configure(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "action",
        nargs="?",
        choices=["list", "add", "update", "keygen", "sign"],
        default="list",
        help="list (default), add, update, keygen or sign",
    )
    p.add_argument(
        "invitation", nargs="?", default="", help="with add: the invitation (sapo://join/...); with sign: the list"
    )
    p.add_argument("--description", default="", help="with add: a line saying what the swarm is")
    p.add_argument("--url", action="append", default=[], help="with update: the list's URL (repeatable)")
    p.add_argument("--key", help="with keygen and sign: the private key file (PEM)")


def _maintain(args: argparse.Namespace) -> int:
    """keygen and sign: what a maintainer runs (the private key never leaves their machine)."""
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
    from cryptography.hazmat.primitives.serialization import (
        Encoding,
        NoEncryption,
        PrivateFormat,
        load_pem_private_key,
    )

    from sapo_core.fsutil import atomic_write_bytes
    from sapo_core.swarm.signedlist import public_key_line
    from sapo_core.swarm.swarmlist import sign_swarm_list

    if not args.key:
        print(f"sapo-node swarms {args.action}: give --key FILE", file=sys.stderr)
        return 2
    key_path = Path(args.key).expanduser()
    if args.action == "keygen":
        if key_path.exists():
            print(f"sapo-node swarms keygen: {key_path} exists; not overwritten", file=sys.stderr)
            return 2
        key = Ed25519PrivateKey.generate()
        pem = key.private_bytes(Encoding.PEM, PrivateFormat.PKCS8, NoEncryption())
        atomic_write_bytes(key_path, pem, mode=0o600)
        print(f"wrote {key_path} (keep it private). Add this line to resources/swarmlist-keys.txt:")
        print(public_key_line(key))
        return 0
    if not args.invitation:
        print("sapo-node swarms sign: give the list file", file=sys.stderr)
        return 2
    target = Path(args.invitation).expanduser()
    key = load_pem_private_key(key_path.read_bytes(), password=None)
    if not isinstance(key, Ed25519PrivateKey):
        print(f"sapo-node swarms sign: {key_path} is not an Ed25519 key", file=sys.stderr)
        return 2
    atomic_write_bytes(target, sign_swarm_list(target.read_text(encoding="utf-8"), key).encode("utf-8"))
    print(f"signed {target}; publish it at the URLs in swarm.list_urls")
    return 0


def _node_config():
    """The config the node runs with (node.toml in the data directory), or the defaults."""
    from sapo_core import paths
    from sapo_core.config import NodeConfig, load_config

    node_toml = paths.data_dir() / "node.toml"
    return load_config(node_toml) if node_toml.is_file() else NodeConfig()


def _update(args: argparse.Namespace) -> int:
    from sapo_core.swarm.swarmlist import update_swarm_list

    urls = list(args.url)
    if not urls:
        urls = list(_node_config().swarm.list_urls)
    if not urls:
        print("sapo-node swarms update: no URL (give --url, or set swarm.list_urls in node.toml)", file=sys.stderr)
        return 2
    result = update_swarm_list(urls)
    for line in result.lines():
        print(line)
    return 0 if result.accepted is not None else 1


def main(args: argparse.Namespace) -> int:
    from sapo_core.config import ConfigError
    from sapo_core.swarm.invitations import InvitationError, parse_invitation
    from sapo_core.swarm.signedlist import SignedListError
    from sapo_core.swarm.swarmlist import SwarmEntry, SwarmListError, add_user_swarm, load_swarms, user_swarms_path

    try:
        if args.action in ("keygen", "sign"):
            return _maintain(args)
        if args.action == "update":
            return _update(args)
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
    except (InvitationError, SwarmListError, SignedListError, ConfigError, OSError, ValueError) as e:
        print(f"sapo-node swarms {args.action}: {e}", file=sys.stderr)
        return 2
    for e in entries:
        peers = f"{len(e.bootstrap)} bootstrap peer(s)" if e.bootstrap else "no bootstrap peers"
        tasks = ", ".join(f"{k}:{v:g}" for k, v in e.tasks.items()) or "the default mix"
        print(
            f"{e.name}  ({e.source})\n    {e.description}\n    {peers}; window {e.window_seconds:g} s, "
            f"{e.shards} shards, tasks {tasks}" + (f"\n    the swarm's page: {e.page}" if e.page else "")
        )
    print(f"Add your own to {user_swarms_path()} (same layout), or: sapo-node swarms add <invitation>")
    from sapo_core.swarm.swarmlist import page_url

    cfg = _node_config()
    if cfg.swarm.enabled:
        page = page_url(cfg, entries)
        print(f"This node's swarm: {cfg.swarm.listed_swarm or cfg.swarm.swarm_name}; its page: {page or 'none'}")
    return 0
