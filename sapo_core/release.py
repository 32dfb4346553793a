"""`python -m sapo_core.release`: the maintainers' commands for the update repository.

The steps of docs/release.md, over `update_repo.Repository`:

    keygen KEYFILE            a new Ed25519 key (KEYFILE, and KEYFILE.pub to hand out)
    init REPO                 root version 1: the root keys, their threshold, the online keys
    release REPO              a release's packages and notes, then a new snapshot and timestamp
    resign REPO               the daily job: a new timestamp (and what else is about to expire)
    rotate REPO               a new root version that adds or removes a role's keys
    sign-root REPO            another maintainer's signature on a root version waiting for it
    status REPO               each role's version, expiry and keys

A private key with a passphrase asks for it (or reads SAPO_KEY_PASSPHRASE, for the job that
re-signs every day); root keys should have one and never leave their offline machines.
"""

from __future__ import annotations

import argparse
import getpass
import os
import sys
from pathlib import Path

from sapo_core.update_repo import RepoError, Repository, generate_key, load_public_key, load_signer

PASSPHRASE_ENV = "SAPO_KEY_PASSPHRASE"


def _signer(path: str):
    data = Path(path).read_bytes() if Path(path).is_file() else b""
    secret = None
    if b"ENCRYPTED" in data:
        secret = os.environ.get(PASSPHRASE_ENV) or getpass.getpass(f"passphrase of {path}: ")
    return load_signer(Path(path), secret)


def _keyid(text: str) -> str:
    """A key id, or the id of the key in a file."""
    return load_public_key(Path(text)).keyid if Path(text).is_file() else text


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m sapo_core.release", description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")
    k = sub.add_parser("keygen", help="make a key: KEYFILE (private) and KEYFILE.pub")
    k.add_argument("keyfile")
    k.add_argument("--no-passphrase", action="store_true", help="no passphrase (an online key a job uses)")
    i = sub.add_parser("init", help="root version 1")
    i.add_argument("repo")
    i.add_argument("--root-key", action="append", required=True, help="a root key's .pub (repeat: three)")
    i.add_argument("--threshold", type=int, default=2, help="root keys that must sign a root version (default 2)")
    for role in ("targets", "snapshot", "timestamp"):
        i.add_argument(f"--{role}-key", required=True, help=f"the {role} key's .pub")
    i.add_argument("--sign", action="append", default=[], help="a root private key that signs (repeat)")
    r = sub.add_parser("release", help="publish a release")
    r.add_argument("repo")
    r.add_argument("--version", required=True, help="the app's version, e.g. 0.2.0")
    r.add_argument("--notes", default="", help="what changed, in a line or two (shown in the app's bar)")
    r.add_argument("--package", action="append", required=True, metavar="PLATFORM=FILE", help="repeat per platform")
    for role in ("targets", "snapshot", "timestamp"):
        r.add_argument(f"--{role}-key", required=True, help=f"the {role} private key")
    s = sub.add_parser("resign", help="a new timestamp; snapshot and targets when they expire soon")
    s.add_argument("repo")
    for role in ("targets", "snapshot", "timestamp"):
        s.add_argument(f"--{role}-key", required=role != "targets", help=f"the {role} private key")
    o = sub.add_parser("rotate", help="a new root version: add or remove a role's keys")
    o.add_argument("repo")
    o.add_argument("--role", required=True, choices=["root", "targets", "snapshot", "timestamp"])
    o.add_argument("--add", action="append", default=[], help="a new key's .pub (repeat)")
    o.add_argument("--remove", action="append", default=[], help="a key's .pub or key id to remove (repeat)")
    o.add_argument("--threshold", type=int, help="the role's new threshold")
    o.add_argument("--sign", action="append", default=[], help="a root private key that signs (repeat)")
    g = sub.add_parser("sign-root", help="sign the root version waiting for signatures")
    g.add_argument("repo")
    g.add_argument("--sign", action="append", required=True, help="a root private key (repeat)")
    t = sub.add_parser("status", help="each role's version, expiry and keys")
    t.add_argument("repo")
    return p


def run(args: argparse.Namespace) -> list[str]:
    """Do the command; the lines to print."""
    if args.command == "keygen":
        secret = None
        if not args.no_passphrase:
            secret = getpass.getpass("passphrase: ")
            if secret != getpass.getpass("again: "):
                raise RepoError("the passphrases differ: nothing written")
        key = generate_key(Path(args.keyfile), secret)
        return [f"key {key.keyid} written: {args.keyfile} (private) and {Path(args.keyfile).with_suffix('.pub')}"]
    repo = Repository(Path(args.repo))
    if args.command == "init":
        online = {
            role: load_public_key(Path(getattr(args, f"{role}_key"))) for role in ("targets", "snapshot", "timestamp")
        }
        roots = [load_public_key(Path(k)) for k in args.root_key]
        return [f"written: {repo.init(roots, args.threshold, online, [_signer(s) for s in args.sign])}"]
    if args.command == "release":
        packages = {}
        for item in args.package:
            platform, _, file = item.partition("=")
            if not file or not Path(file).is_file():
                raise RepoError(f"--package {item}: give PLATFORM=FILE with an existing file")
            packages[platform] = Path(file)
        signers = {role: _signer(getattr(args, f"{role}_key")) for role in ("targets", "snapshot", "timestamp")}
        return [f"written: {p}" for p in repo.release(args.version, args.notes, packages, signers)]
    if args.command == "resign":
        roles = [r for r in ("targets", "snapshot", "timestamp") if getattr(args, f"{r}_key")]
        signed = repo.resign({r: _signer(getattr(args, f"{r}_key")) for r in roles})
        return [f"signed again: {', '.join(signed)}"]
    if args.command in ("rotate", "sign-root"):
        signers = [_signer(s) for s in args.sign]
        if args.command == "rotate":
            added = [load_public_key(Path(k)) for k in args.add]
            done = repo.rotate(args.role, added, [_keyid(k) for k in args.remove], signers, args.threshold)
        else:
            done = repo.sign_root(signers)
        return ["the new root is published" if done else f"the new root waits for more signatures in {repo.staged}"]
    return repo.status()


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        lines = run(args)
    except RepoError as e:
        print(f"{args.command}: {e}", file=sys.stderr)
        return 1
    for line in lines:
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
