"""The update repository's tools (sapo_core/update_repo.py, `python -m sapo_core.release`): the
release procedure of docs/release.md run as a maintainer runs it, from key files, and the
mistakes it refuses before anything is signed (a root below its threshold, a key the root does
not name, a release that is not newer, a bad platform)."""

from __future__ import annotations

import os
import subprocess
import sys
from datetime import UTC, datetime, timedelta

import pytest

from sapo_core.update_repo import RepoError, generate_key, load_signer

from helpers import publish_release, release_tarball, update_keys, update_repository


@pytest.fixture(scope="module")
def signers(tmp_path_factory):
    return update_keys(tmp_path_factory.mktemp("keys"))


def _cli(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "sapo_core.release", *map(str, args)]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120, env={**os.environ, **(env or {})})


def test_the_release_procedure_from_the_command_line(tmp_path):
    keys, repo = tmp_path / "keys", tmp_path / "www"
    keys.mkdir()
    for name in ("root1", "root2", "root3", "targets", "snapshot"):
        done = _cli("keygen", keys / f"{name}.pem", "--no-passphrase")
        assert done.returncode == 0 and "written" in done.stdout, done.stderr
    generate_key(keys / "timestamp.pem", "a passphrase")  # the daily job's key, with its passphrase
    assert oct((keys / "timestamp.pem").stat().st_mode & 0o777) == "0o600"
    assert b"ENCRYPTED" in (keys / "timestamp.pem").read_bytes()
    assert _cli("keygen", keys / "root1.pem", "--no-passphrase").returncode == 1  # never overwritten
    init = ["init", repo, *(f"--root-key={keys}/root{i}.pub" for i in (1, 2, 3)), "--threshold", "2"]
    init += [f"--{r}-key={keys}/{r}.pub" for r in ("targets", "snapshot", "timestamp")]
    done = _cli(*init, "--sign", keys / "root1.pem")
    assert done.returncode == 1 and "needs 2 signatures" in done.stderr  # one of two: nothing written
    assert not (repo / "metadata").exists()
    assert _cli(*init, "--sign", keys / "root1.pem", "--sign", keys / "root2.pem").returncode == 0
    package = tmp_path / "sapo-swarm-9.1.0-linux-x86_64.tar.gz"
    package.write_bytes(release_tarball("9.1.0"))
    release = ["release", repo, "--version", "9.1.0", "--notes", "Rounds a third faster.", "--package"]
    release += [f"linux-x86_64-tar={package}", *(f"--{r}-key={keys}/{r}.pem" for r in ("targets", "snapshot"))]
    env = {"SAPO_KEY_PASSPHRASE": "a passphrase"}
    done = _cli(*release, f"--timestamp-key={keys}/timestamp.pem", env=env)
    assert done.returncode == 0, done.stderr
    assert sorted(p.name for p in (repo / "metadata").iterdir()) == [
        "1.root.json",
        "1.snapshot.json",
        "1.targets.json",
        "timestamp.json",
    ]
    done = _cli(*release, f"--timestamp-key={keys}/timestamp.pem", env={"SAPO_KEY_PASSPHRASE": "wrong"})
    assert done.returncode == 1 and "not a private key this passphrase opens" in done.stderr
    release[3] = "9.2.0"
    done = _cli(*release, f"--timestamp-key={keys}/snapshot.pem")  # the wrong key for the role
    assert done.returncode == 1 and "not a timestamp key of root version 1" in done.stderr
    done = _cli("resign", repo, f"--snapshot-key={keys}/snapshot.pem", f"--timestamp-key={keys}/timestamp.pem", env=env)
    assert done.returncode == 0 and "signed again: timestamp" in done.stdout, done.stderr
    status = _cli("status", repo).stdout
    assert "timestamp: version 2, expires" in status and "root: version 1" in status and "2 of keys" in status


def test_a_release_must_be_newer_and_name_known_platforms(signers, tmp_path):
    repo, _ = update_repository(tmp_path / "www", signers)
    publish_release(repo, signers, "9.1.0")
    with pytest.raises(RepoError, match="9.1.0 is not newer than the published 9.1.0"):
        publish_release(repo, signers, "9.1.0")
    file = tmp_path / "p.tar.gz"
    file.write_bytes(b"x")
    online = {r: signers[r] for r in ("targets", "snapshot", "timestamp")}
    with pytest.raises(RepoError, match="platforms among"):
        repo.release("9.2.0", "", {"amiga": file}, online)
    with pytest.raises(RepoError, match="is not a version"):
        repo.release("soon", "", {"linux-x86_64-tar": file}, online)
    assert repo.latest("targets").signed.version == 1  # nothing of the refused ones was signed
    with pytest.raises(RepoError, match="already has a root"):
        update_repository(tmp_path / "www", signers)


def test_resign_renews_what_expires_soon_and_what_a_rotation_left_unsigned(signers, tmp_path):
    now = [datetime.now(UTC)]
    repo, _ = update_repository(tmp_path / "www", signers, clock=lambda: now[0])
    publish_release(repo, signers, "9.1.0")
    online = {"snapshot": signers["snapshot"], "timestamp": signers["timestamp"]}
    assert repo.resign(online) == ["timestamp"]  # the daily job on an ordinary day
    now[0] += timedelta(days=15)  # the snapshot (21 days) has less than a week left
    assert repo.resign(online) == ["snapshot", "timestamp"]
    now[0] += timedelta(days=150)  # the targets (180 days) too: the release key is needed
    with pytest.raises(RepoError, match="give the targets key too"):
        repo.resign(online)
    assert repo.resign({**online, "targets": signers["targets"]}) == ["targets", "snapshot", "timestamp"]
    # the snapshot key is rotated: its metadata no longer verifies and is signed with the new key
    new = signers["timestamp2"]  # any fresh key serves as the new snapshot key here
    roots = [signers["root1"], signers["root2"]]
    assert repo.rotate("snapshot", [new.public_key], [signers["snapshot"].public_key.keyid], roots)
    with pytest.raises(RepoError, match="not a snapshot key of root version 2"):
        repo.resign(online)
    assert repo.resign({"snapshot": new, "timestamp": signers["timestamp"]}) == ["snapshot", "timestamp"]


def test_a_root_rotation_waits_for_its_threshold_and_refuses_nonsense(signers, tmp_path):
    repo, _ = update_repository(tmp_path / "www", signers)
    with pytest.raises(RepoError, match="is not a timestamp key"):
        repo.rotate("timestamp", remove=[signers["targets"].public_key.keyid])
    with pytest.raises(RepoError, match="would need 1 of 0 keys"):
        repo.rotate("timestamp", remove=[signers["timestamp"].public_key.keyid])
    assert not repo.rotate("root", remove=[signers["root3"].public_key.keyid], signers=[signers["root3"]])
    with pytest.raises(RepoError, match="waits for signatures"):
        repo.rotate("targets", [signers["timestamp2"].public_key])
    assert not repo.sign_root([signers["targets"]])  # not a root key: still waiting
    assert repo.sign_root([signers["root1"], signers["root2"]])
    assert repo.latest("root").signed.version == 2 and len(repo.latest("root").signed.roles["root"].keyids) == 2
    with pytest.raises(RepoError, match="no root waits"):
        repo.sign_root([signers["root1"]])
    with pytest.raises(RepoError, match="cannot read the key"):
        load_signer(tmp_path / "nowhere.pem")
