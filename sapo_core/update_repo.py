"""The update repository: where a release is signed and published, with The Update Framework.

A TUF repository (theupdateframework.io; python-tuf's Metadata API) is a folder served as it is
over HTTPS; the app's `updates/url` names it (sapo_core/updates.py is the client):

    metadata/1.root.json, 2.root.json …   the root of trust, one file per version
    metadata/N.targets.json                the files of the release: path, size, SHA-256
    metadata/N.snapshot.json               which targets version is current
    metadata/timestamp.json                which snapshot is current, and that it still is
    targets/<sha256>.release.toml          the release: version, notes, a package per platform
    targets/<sha256>.<package file>        the packages (consistent snapshots: a file never changes)

Roles and keys (docs/release.md is the procedure):

- root: offline keys (three, held by different maintainers), a `threshold` of which (two) sign
  every root version; it names the keys of the other roles. A new root version must be signed
  by a threshold of the old root's keys and of its own, which is how a key is rotated or revoked.
- targets: the release key, used when a release is made; it signs what the packages are.
- snapshot and timestamp: online keys on the machine that publishes; `resign` runs every day and
  signs a new timestamp. Each role's metadata expires (`LIFETIMES`): a mirror that stops updating,
  or someone replaying old metadata, holds a node back at most until the timestamp expires, and
  the app then says it cannot confirm it is up to date.

`python -m sapo_core.update_repo --help` lists the commands (keygen, init, release, resign,
rotate, sign-root, status); tests drive `Repository` directly.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

LIFETIMES = {
    "root": timedelta(days=365),
    "targets": timedelta(days=180),
    "snapshot": timedelta(days=21),
    "timestamp": timedelta(days=3),  # re-signed daily: two missed days are tolerated
}
# `resign` signs a role again when it would expire sooner than this (the timestamp: every time)
RESIGN_WITHIN = {"targets": timedelta(days=30), "snapshot": timedelta(days=7), "timestamp": LIFETIMES["timestamp"]}
ONLINE = ("targets", "snapshot", "timestamp")
RELEASE_TARGET = "release.toml"


class RepoError(Exception):
    """A repository step that cannot be done; the message says why and what to do."""


# --- keys ------------------------------------------------------------------------------------


def generate_key(path: Path, passphrase: str | None = None) -> Any:
    """A new Ed25519 key: the private half in `path` (PEM, encrypted when a passphrase is given,
    mode 0600), the public half beside it (`.pub`). Returns the public key. Never overwrites."""
    from cryptography.hazmat.primitives import serialization as s
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
    from securesystemslib.signer import SSlibKey

    path, pub = Path(path), Path(path).with_suffix(".pub")
    for p in (path, pub):
        if p.exists():
            raise RepoError(f"{p} exists: a key is never overwritten (move it away first)")
    key = Ed25519PrivateKey.generate()
    crypt = s.BestAvailableEncryption(passphrase.encode()) if passphrase else s.NoEncryption()
    pem = key.private_bytes(s.Encoding.PEM, s.PrivateFormat.PKCS8, crypt)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(pem)
    pub.write_bytes(key.public_key().public_bytes(s.Encoding.PEM, s.PublicFormat.SubjectPublicKeyInfo))
    return SSlibKey.from_crypto(key.public_key())


def load_signer(path: Path, passphrase: str | None = None) -> Any:
    """A signer from a private key file that `generate_key` wrote."""
    from cryptography.hazmat.primitives.serialization import load_pem_private_key
    from securesystemslib.signer import CryptoSigner

    try:
        key = load_pem_private_key(Path(path).read_bytes(), passphrase.encode() if passphrase else None)
    except OSError as e:
        raise RepoError(f"cannot read the key {path} ({e.strerror or e})") from None
    except (ValueError, TypeError) as e:
        raise RepoError(f"{path} is not a private key this passphrase opens ({e})") from None
    return CryptoSigner(key)


def load_public_key(path: Path) -> Any:
    """The public key in a `.pub` file (or the public half of a private key file without a passphrase)."""
    from cryptography.hazmat.primitives.serialization import load_pem_private_key, load_pem_public_key
    from securesystemslib.signer import SSlibKey

    try:
        data = Path(path).read_bytes()
        public = load_pem_public_key(data) if b"PUBLIC KEY" in data else load_pem_private_key(data, None).public_key()
    except OSError as e:
        raise RepoError(f"cannot read the key {path} ({e.strerror or e})") from None
    except (ValueError, TypeError) as e:
        raise RepoError(f"{path} is not a PEM key ({e}); give the .pub file `keygen` wrote") from None
    return SSlibKey.from_crypto(public)


# --- the repository --------------------------------------------------------------------------


class Repository:
    """A TUF repository in `folder` (what is published: metadata/ and targets/, plus staged/
    for root versions still waiting for signatures, which is not published)."""

    def __init__(
        self,
        folder: Path,
        clock: Callable[[], datetime] | None = None,
        lifetimes: Mapping[str, timedelta] | None = None,
    ) -> None:
        """`clock`: the time metadata is signed at (UTC); `lifetimes`: per role, instead of LIFETIMES."""
        self.folder = Path(folder)
        self.metadata, self.targets, self.staged = (self.folder / d for d in ("metadata", "targets", "staged"))
        self.clock = clock or (lambda: datetime.now(UTC))
        self.lifetimes = {**LIFETIMES, **(lifetimes or {})}

    # --- reading and writing metadata -------------------------------------------------------

    def latest(self, role: str, folder: Path | None = None) -> Any:
        """The newest metadata of a role (a tuf Metadata), or None before there is one."""
        from tuf.api.metadata import Metadata

        folder = folder or self.metadata
        if role == "timestamp":
            path = folder / "timestamp.json"
            return Metadata.from_file(str(path)) if path.exists() else None
        versions = [int(m.group(1)) for p in folder.glob(f"*.{role}.json") if (m := re.match(r"(\d+)\.", p.name))]
        return Metadata.from_file(str(folder / f"{max(versions)}.{role}.json")) if versions else None

    def _root(self) -> Any:
        root = self.latest("root")
        if root is None:
            raise RepoError(f"{self.metadata} holds no root: run `init` first")
        return root

    def _write(self, md: Any, folder: Path | None = None) -> Path:
        from tuf.api.serialization.json import JSONSerializer

        role, folder = md.signed.type, folder or self.metadata
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / ("timestamp.json" if role == "timestamp" else f"{md.signed.version}.{role}.json")
        tmp = path.with_name(f".{path.name}.tmp")
        tmp.write_bytes(md.to_bytes(JSONSerializer(compact=False)))
        os.replace(tmp, path)  # a mirror syncing meanwhile sees the old file or the new one
        return path

    def _expires(self, role: str) -> datetime:
        return (self.clock() + self.lifetimes[role]).replace(microsecond=0)

    def _sign(self, md: Any, signers: Sequence[Any]) -> None:
        """Sign a targets, snapshot or timestamp role, first checking that the root trusts the key."""
        role, root = md.signed.type, self._root()
        md.signatures.clear()
        for signer in signers:
            keyid = signer.public_key.keyid
            if keyid not in root.signed.roles[role].keyids:
                raise RepoError(
                    f"key {keyid[:16]} is not a {role} key of root version {root.signed.version}: "
                    "rotated out, or the wrong file"
                )
            md.sign(signer, append=True)

    # --- the steps --------------------------------------------------------------------------

    def init(self, root_keys: Sequence[Any], threshold: int, online: Mapping[str, Any], signers: Sequence[Any]) -> Path:
        """Root version 1: `root_keys` (a `threshold` of them signing, `signers`) and one key for
        each online role (`online`: targets, snapshot, timestamp)."""
        from tuf.api.metadata import Metadata, Root

        if self.latest("root") is not None:
            raise RepoError(f"{self.metadata} already has a root: rotate keys with `rotate`, never `init` again")
        if not 1 <= threshold <= len(root_keys):
            raise RepoError(f"threshold {threshold} needs 1..{len(root_keys)} (the number of root keys)")
        if set(online) != set(ONLINE):
            raise RepoError(f"one key for each of {', '.join(ONLINE)}")
        root = Root(expires=self._expires("root"), consistent_snapshot=True)
        for key in root_keys:
            root.add_key(key, "root")
        root.roles["root"].threshold = threshold
        for role, key in online.items():
            root.add_key(key, role)
        md = Metadata(root)
        for signer in signers:
            md.sign(signer, append=True)
        if not root.get_root_verification_result(None, md.signed_bytes, md.signatures).verified:
            raise RepoError(f"root version 1 needs {threshold} signatures of its keys: give more root keys to sign")
        return self._write(md)

    def release(
        self, version: str, notes: str, packages: Mapping[str, Path], signers: Mapping[str, Any]
    ) -> tuple[Path, ...]:
        """Publish a release: its packages (platform -> file) and release.toml become the
        targets, then a new snapshot and timestamp. `signers`: targets, snapshot, timestamp."""
        from packaging.version import InvalidVersion, Version
        from tuf.api.metadata import Metadata, TargetFile, Targets

        from sapo_core.updates import PLATFORMS, parse_release

        try:
            Version(version)
        except InvalidVersion:
            raise RepoError(f'{version!r} is not a version (PEP 440, e.g. "0.2.0")') from None
        if not packages or set(packages) - set(PLATFORMS):
            raise RepoError(f"give at least one package, for platforms among {', '.join(PLATFORMS)}")
        current = self.latest("targets")
        if current is not None and RELEASE_TARGET in current.signed.targets:
            before = parse_release(self._target_text(current.signed.targets[RELEASE_TARGET]), RELEASE_TARGET)[0]
            if Version(before.version) >= Version(version):
                raise RepoError(f"{version} is not newer than the published {before.version}: raise the version")
        files: dict[str, TargetFile] = {}
        lines = [f"[release]\nversion = {_toml(version)}\nnotes = {_toml(notes)}\n"]
        for platform, path in sorted(packages.items()):
            name = Path(path).name
            files[name] = self._add_target(name, Path(path).read_bytes())
            lines.append(f"[[release.packages]]\nplatform = {_toml(platform)}\ntarget = {_toml(name)}\n")
        text = "\n".join(lines)
        parse_release(text, RELEASE_TARGET)  # what clients will check, checked before anything is signed
        files[RELEASE_TARGET] = self._add_target(RELEASE_TARGET, text.encode())
        targets = Targets(version=current.signed.version + 1 if current else 1, expires=self._expires("targets"))
        targets.targets = files
        md = Metadata(targets)
        self._sign(md, [signers["targets"]])
        written = [self._write(md)]
        return (*written, *self._new_snapshot_and_timestamp(signers))

    def _add_target(self, name: str, data: bytes) -> Any:
        from tuf.api.metadata import TargetFile

        info = TargetFile.from_data(name, data, ["sha256"])
        path = self.targets / f"{info.hashes['sha256']}.{name}"
        if not path.exists():
            self.targets.mkdir(parents=True, exist_ok=True)
            tmp = path.with_name(f".{path.name}.tmp")
            tmp.write_bytes(data)
            os.replace(tmp, path)
        return info

    def _target_text(self, info: Any) -> str:
        return (self.targets / f"{info.hashes['sha256']}.{info.path}").read_text(encoding="utf-8")

    def _new_snapshot_and_timestamp(self, signers: Mapping[str, Any], snapshot: bool = True) -> tuple[Path, ...]:
        from tuf.api.metadata import Metadata, MetaFile, Snapshot, Timestamp

        written = []
        snap = self.latest("snapshot")
        if snapshot or snap is None:
            targets = self.latest("targets")
            if targets is None:
                raise RepoError("no release yet: publish one with `release` first")
            version = snap.signed.version + 1 if snap else 1
            snap = Metadata(Snapshot(version=version, expires=self._expires("snapshot")))
            snap.signed.meta = {"targets.json": MetaFile(version=targets.signed.version)}
            self._sign(snap, [signers["snapshot"]])
            written.append(self._write(snap))
        ts = self.latest("timestamp")
        stamp = Timestamp(version=ts.signed.version + 1 if ts else 1, expires=self._expires("timestamp"))
        stamp.snapshot_meta = MetaFile(version=snap.signed.version)
        md = Metadata(stamp)
        self._sign(md, [signers["timestamp"]])
        written.append(self._write(md))
        return tuple(written)

    def resign(self, signers: Mapping[str, Any]) -> list[str]:
        """The daily job: a new timestamp, and a new snapshot (or targets) where it would expire
        within RESIGN_WITHIN or is no longer signed by a key the root trusts (after a rotation).
        Returns the roles signed."""
        from tuf.api.metadata import Metadata

        root, done = self._root(), []
        soon = {r: self.clock() + RESIGN_WITHIN[r] for r in ("targets", "snapshot")}
        targets = self.latest("targets")
        if targets is None:
            raise RepoError("no release yet: publish one with `release` first")
        if targets.signed.expires <= soon["targets"] or not _verified(root, targets):
            if "targets" not in signers:
                raise RepoError("the targets metadata needs signing again: give the targets key too")
            fresh = Metadata.from_bytes(targets.to_bytes())
            fresh.signed.version += 1
            fresh.signed.expires = self._expires("targets")
            self._sign(fresh, [signers["targets"]])
            self._write(fresh)
            done.append("targets")
        snap = self.latest("snapshot")
        stale = done or snap is None or snap.signed.expires <= soon["snapshot"] or not _verified(root, snap)
        self._new_snapshot_and_timestamp(signers, snapshot=bool(stale))
        return [*done, *(["snapshot"] if stale else []), "timestamp"]

    def rotate(
        self,
        role: str,
        add: Sequence[Any] = (),
        remove: Sequence[str] = (),
        signers: Sequence[Any] = (),
        threshold: int | None = None,
    ) -> bool:
        """A new root version with `add` keys trusted for `role` and the keys in `remove` (key
        ids) no longer: rotation, or revocation of a key that leaked. Published when `signers`
        meet the old and the new root's thresholds, else staged for `sign_root`. True if published."""
        from tuf.api.metadata import Metadata

        if role not in ("root", *ONLINE):
            raise RepoError(f"role {role!r}: one of root, {', '.join(ONLINE)}")
        if self.latest("root", self.staged) is not None:
            raise RepoError(f"a new root waits for signatures in {self.staged}: finish it with `sign-root` first")
        old = self._root()
        new = Metadata.from_bytes(old.to_bytes())
        r = new.signed
        for keyid in remove:
            if keyid not in r.roles[role].keyids:
                raise RepoError(f"key {keyid[:16]} is not a {role} key of root version {r.version}")
            r.revoke_key(keyid, role)
        for key in add:
            r.add_key(key, role)
        if threshold is not None:
            r.roles[role].threshold = threshold
        if not 1 <= r.roles[role].threshold <= len(r.roles[role].keyids):
            raise RepoError(f"{role} would need {r.roles[role].threshold} of {len(r.roles[role].keyids)} keys")
        r.version += 1
        r.expires = self._expires("root")
        new.signatures.clear()
        for signer in signers:
            new.sign(signer, append=True)
        return self._publish_or_stage(new, old)

    def sign_root(self, signers: Sequence[Any]) -> bool:
        """Add signatures to the staged root (each maintainer in turn); True once published."""
        staged = self.latest("root", self.staged)
        if staged is None:
            raise RepoError(f"no root waits for signatures in {self.staged}")
        for signer in signers:
            staged.sign(signer, append=True)
        return self._publish_or_stage(staged, self._root())

    def _publish_or_stage(self, new: Any, old: Any) -> bool:
        # signed by a threshold of the root before and of its own keys: what clients check
        if new.signed.get_root_verification_result(old.signed, new.signed_bytes, new.signatures).verified:
            self._write(new)
            for p in self.staged.glob("*.root.json"):
                p.unlink()
            return True
        self._write(new, self.staged)
        return False

    def status(self) -> list[str]:
        """A line per role: version, expiry, keys."""
        root = self._root()
        lines = []
        for role in ("root", *ONLINE):
            md = self.latest(role)
            keys = root.signed.roles[role]
            says = (
                "none yet"
                if md is None
                else f"version {md.signed.version}, expires {md.signed.expires:%Y-%m-%d %H:%M} UTC"
            )
            ids = ", ".join(k[:16] for k in keys.keyids)
            lines.append(f"{role}: {says}; {keys.threshold} of keys {ids}")
        if self.latest("root", self.staged) is not None:
            lines.append(f"a new root waits for signatures in {self.staged}")
        return lines


def _verified(root: Any, md: Any) -> bool:
    return bool(root.signed.get_verification_result(md.signed.type, md.signed_bytes, md.signatures))


def _toml(value: str) -> str:
    import json

    return json.dumps(value, ensure_ascii=False)  # a JSON string is a TOML basic string


__all__ = [
    "LIFETIMES",
    "ONLINE",
    "RELEASE_TARGET",
    "RepoError",
    "Repository",
    "generate_key",
    "load_public_key",
    "load_signer",
]
