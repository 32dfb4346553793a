"""`sapo-node identity`: show this node's identity, export it for backup, or import a backup.

The identity is one RSA key file (sapo_core/swarm/identity.py): it fixes the peer id other
nodes know this node by and signs everything it publishes. Losing it means starting over as a
new node; anyone who gets a copy can publish in this node's name -- keep backups private.

    sapo-node identity                 # show name, peer id and key file (creates none)
    sapo-node identity show --create   # create the key now if there is none
    sapo-node identity export FILE     # copy the key (0600) for backup
    sapo-node identity import FILE     # install a backed-up key (refuses to replace another)

`--path` (or `--config` with `swarm.identity_path`) chooses another key file than the data
directory's default. Exit status 0 on success, 1 with a message that says what to do otherwise.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from sapo_core.swarm.identity import (
    IdentityError,
    default_identity_path,
    export_identity,
    import_identity,
    load_identity,
    load_or_create_identity,
)


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--path", default="", help="key file (default: swarm.identity_path, else the data directory's)")
    parser.add_argument("--config", default="", help="node config TOML whose swarm.identity_path to use")
    sub = parser.add_subparsers(dest="action", metavar="ACTION")
    show = sub.add_parser("show", help="name, peer id and key file (the default action)")
    show.add_argument("--create", action="store_true", help="create the key now if there is none")
    show.add_argument("--json", action="store_true", help="print one JSON object")
    export = sub.add_parser("export", help="copy the key file for backup (owner-only permissions)")
    export.add_argument("dest", help="file to write")
    export.add_argument("--force", action="store_true", help="overwrite dest if it exists")
    imp = sub.add_parser("import", help="install a backed-up key file as this node's identity")
    imp.add_argument("src", help="key file exported before")
    imp.add_argument("--force", action="store_true", help="replace a different identity already installed")


def key_path(args: argparse.Namespace) -> Path:
    if args.path:
        return Path(args.path).expanduser()
    if args.config:
        from sapo_core.config import load_config

        configured = load_config(args.config).swarm.identity_path
        if configured:
            return Path(configured).expanduser()
    return default_identity_path()


def main(args: argparse.Namespace) -> int:
    try:
        path = key_path(args)
        action = args.action or "show"
        if action == "export":
            dest = export_identity(load_identity(path), args.dest, overwrite=args.force)
            print(f"exported {path} to {dest}; keep it private: it can sign as this node")
            return 0
        if action == "import":
            identity = import_identity(args.src, path, overwrite=args.force)
            print(f"this node is now {identity.name} ({identity.peer_id}); key at {identity.path}")
            return 0
        if getattr(args, "create", False):
            identity = load_or_create_identity(path)
        else:
            identity = load_identity(path)
        if getattr(args, "json", False):
            print(json.dumps({"name": identity.name, "peer_id": identity.peer_id, "path": str(identity.path)}))
        else:
            print(f"name     {identity.name}\npeer id  {identity.peer_id}\nkey file {identity.path}")
        return 0
    except IdentityError as e:
        print(f"sapo-node identity: {e}", file=sys.stderr)
        return 1
    except Exception as e:  # e.g. a broken --config: say it, don't trace back
        print(f"sapo-node identity: {type(e).__name__}: {e}", file=sys.stderr)
        return 1
