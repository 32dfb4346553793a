"""Updates (sapo_core/updates.py) against TUF repositories (update_repo.py) served by a real
HTTPS server on loopback with its own certificate: a release found, downloaded and installed in
one switch; metadata signed by a stranger, truncated, altered or replayed older refused; expired
metadata and a frozen mirror said to leave this copy unable to confirm it is up to date; a
rotated key accepted and the revoked one refused; truncated, altered and longer packages refused
with nothing left; refused archives that leave the installed version as it was."""

from __future__ import annotations

import json
import os
import shutil
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from sapo_core import updates

from helpers import publish_release, release_tarball, update_keys, update_repository

TAR = "linux-x86_64-tar"


@pytest.fixture(scope="module")
def signers(tmp_path_factory):
    return update_keys(tmp_path_factory.mktemp("keys"))


@pytest.fixture
def origin(server, signers, request):
    """A fresh repository on the server for each test: (Repository, its URL, the root a copy ships)."""
    name = request.node.name.replace("[", "-").replace("]", "")
    repo, root = update_repository(server["root"] / name, signers)
    return repo, f"{server['url']}/{name}", root


def _mirror(repo, server, name: str) -> tuple[str, Path]:
    """A copy of the repository as it is now, served beside it (a mirror that stops here):
    (its URL, its metadata folder)."""
    shutil.copytree(repo.folder, server["root"] / name)
    return f"{server['url']}/{name}", server["root"] / name / "metadata"


def _check(url, root, client: Path, server) -> updates.Check:
    return updates.check([url] if isinstance(url, str) else url, root, client, context=server["context"])


def test_a_signed_newer_release_is_found_downloaded_and_installed_in_one_switch(origin, signers, server, tmp_path):
    repo, url, root = origin
    served = publish_release(repo, signers, "9.1.0")
    found = _check(url, root, tmp_path / "client", server)
    assert found.refused == [] and found.unconfirmed == "" and found.newer("0.1.0").version == "9.1.0"
    assert found.newer("9.1.0") is None  # the same version is no update
    pkg = found.package(TAR, "0.1.0")
    assert pkg.size == served.stat().st_size and pkg.repository == url
    seen = []
    file = updates.download(
        pkg, tmp_path / "dl", root, tmp_path / "client", context=server["context"], progress=lambda a, b: seen.append(a)
    )
    assert file.read_bytes() == served.read_bytes() and seen[-1] == pkg.size
    assert sorted(p.name for p in (tmp_path / "dl").iterdir()) == [pkg.target]  # no .part, no temporary file
    # a tarball installation at 9.0.0 takes it; the version before stays on disk
    root_dir = tmp_path / "app"
    where = updates.installation(str(root_dir / "versions/9.0.0/sapo-swarm"), frozen=True)
    (root_dir / "versions/9.0.0").mkdir(parents=True)
    (root_dir / "versions/9.0.0/sapo-swarm").write_text("old")
    os.symlink("versions/9.0.0", root_dir / "current")
    assert where == updates.Installation("tarball", TAR, root_dir)
    said = updates.install(file, found.release, where)
    assert "9.1.0 is installed" in said
    assert os.readlink(root_dir / "current") == "versions/9.1.0"
    assert (root_dir / "current/sapo-swarm").read_bytes().endswith(b"echo 9.1.0\n")
    assert (root_dir / "versions/9.0.0/sapo-swarm").read_text() == "old"


def test_metadata_signed_by_a_stranger_truncated_or_altered_is_refused(origin, signers, server, tmp_path):
    from tuf.api.metadata import Metadata

    repo, url, root = origin
    publish_release(repo, signers, "9.2.0")
    (tmp_path / "stranger").mkdir()
    stranger = update_keys(tmp_path / "stranger")
    wrong, meta = _mirror(repo, server, f"{repo.folder.name}-wrong")
    stamp = Metadata.from_file(str(meta / "timestamp.json"))
    stamp.signed.version += 1
    stamp.signatures.clear()
    stamp.sign(stranger["timestamp"])  # a valid signature, by a key the root does not name
    stamp.to_file(str(meta / "timestamp.json"))
    truncated, meta = _mirror(repo, server, f"{repo.folder.name}-truncated")
    t = meta / "timestamp.json"
    t.write_bytes(t.read_bytes()[: t.stat().st_size // 2])
    altered, meta = _mirror(repo, server, f"{repo.folder.name}-altered")
    t = meta / "1.targets.json"
    data = json.loads(t.read_bytes())
    data["signed"]["targets"]["release.toml"]["length"] += 1  # still JSON, no longer what was signed
    t.write_text(json.dumps(data))
    for n, (where, says) in enumerate(
        [(wrong, "not signed by the keys this copy trusts"), (truncated, "refused"), (altered, "not signed by")]
    ):
        got = _check(where, root, tmp_path / f"client{n}", server)
        assert got.release is None and len(got.refused) == 1 and says in got.refused[0], got.refused
    # the three refused, then the repository itself: the release, as signed
    got = _check([wrong, truncated, altered, url], root, tmp_path / "client", server)
    assert got.release.version == "9.2.0" and len(got.refused) == 3


def test_older_metadata_replayed_after_newer_was_seen_is_refused(origin, signers, server, tmp_path):
    repo, url, root = origin
    publish_release(repo, signers, "9.2.0")
    old, _ = _mirror(repo, server, f"{repo.folder.name}-old")
    publish_release(repo, signers, "9.3.0")
    client = tmp_path / "client"
    assert _check(url, root, client, server).release.version == "9.3.0"
    got = _check(old, root, client, server)  # a mirror, or someone in the path, serving 9.2.0's metadata
    assert got.release is None and "older than what this copy accepted before" in got.refused[0]
    assert "a replay" in got.refused[0]


def test_expired_metadata_says_this_copy_cannot_confirm_it_is_up_to_date(server, signers, tmp_path):
    signed_at = datetime.now(UTC) - timedelta(days=10)  # the project stopped signing ten days ago
    repo, root = update_repository(server["root"] / "stale", signers, clock=lambda: signed_at)
    publish_release(repo, signers, "9.2.0")
    got = _check(f"{server['url']}/stale", root, tmp_path / "client", server)
    assert got.release is None and got.newer("0.1.0") is None
    expired = (signed_at + timedelta(days=3)).strftime("%Y-%m-%d %H:%M")
    assert f"the update information from 127.0.0.1:{server['url'].rsplit(':', 1)[1]} expired on {expired} UTC" in (
        got.unconfirmed
    )
    assert "(7 days ago)" in got.unconfirmed and "holding back news of releases" in got.unconfirmed
    assert got.unconfirmed in got.refused[0]


def test_a_frozen_mirror_is_noticed_when_its_timestamp_expires(server, signers, tmp_path):
    repo, root = update_repository(server["root"] / "live", signers, lifetimes={"timestamp": timedelta(seconds=3)})
    publish_release(repo, signers, "9.1.0")
    frozen, _ = _mirror(repo, server, "frozen")
    client = tmp_path / "client"
    got = _check(frozen, root, client, server)
    assert got.release.version == "9.1.0" and got.unconfirmed == ""  # fresh, for now
    expires = repo.latest("timestamp").signed.expires
    while datetime.now(UTC) <= expires:  # the mirror stops updating; its timestamp runs out
        time.sleep(0.2)
    publish_release(repo, signers, "9.2.0")  # meanwhile the project released
    got = _check(frozen, root, client, server)
    assert got.release is None and "expired on" in got.unconfirmed and "a mirror" in got.unconfirmed
    got = _check([frozen, f"{server['url']}/live"], root, client, server)  # another mirror is live
    assert got.release.version == "9.2.0" and got.unconfirmed == "" and "expired" in got.refused[0]


def test_a_rotated_timestamp_key_is_accepted_and_the_revoked_one_refused(origin, signers, server, tmp_path):
    from tuf.api.metadata import Metadata

    repo, url, root = origin
    publish_release(repo, signers, "9.1.0")
    client = tmp_path / "client"
    assert _check(url, root, client, server).release.version == "9.1.0"
    leaked = signers["timestamp"]
    # the maintainers revoke the leaked key and trust a new one: two of three root keys sign root version 2
    assert not repo.rotate(
        "timestamp", [signers["timestamp2"].public_key], [leaked.public_key.keyid], [signers["root1"]]
    )
    assert repo.latest("root").signed.version == 1  # one signature: staged, not published
    assert repo.sign_root([signers["root3"]])
    assert repo.latest("root").signed.version == 2
    assert repo.resign({"snapshot": signers["snapshot"], "timestamp": signers["timestamp2"]}) == ["timestamp"]
    got = _check(url, root, client, server)  # a copy that ships root version 1 follows the rotation
    assert got.release.version == "9.1.0" and got.refused == []
    assert (client / "root_history/2.root.json").exists()
    # whoever holds the leaked key signs a newer timestamp and serves it from a mirror
    evil, meta = _mirror(repo, server, f"{repo.folder.name}-evil")
    path = meta / "timestamp.json"
    stamp = Metadata.from_file(str(path))
    stamp.signed.version += 5
    stamp.signatures.clear()
    stamp.sign(leaked)
    stamp.to_file(str(path))
    got = _check(evil, root, client, server)
    assert got.release is None and "not signed by the keys this copy trusts" in got.refused[0]
    got = _check(evil, root, tmp_path / "new-client", server)  # a first check learns of root 2 there too
    assert got.release is None and "not signed by the keys this copy trusts" in got.refused[0]


@pytest.mark.parametrize("damage", ["truncated", "altered", "longer"])
def test_a_package_that_is_not_the_signed_one_is_refused_and_nothing_is_left(origin, signers, server, tmp_path, damage):
    repo, url, root = origin
    publish_release(
        repo,
        signers,
        "9.4.0",
        served={
            "truncated": lambda p: p[: len(p) // 2],
            "altered": lambda p: p[:-1] + bytes([p[-1] ^ 1]),
            "longer": lambda p: p + b"x" * 100,
        }[damage],
    )
    pkg = _check(url, root, tmp_path / "client", server).package(TAR, "0.1.0")
    with pytest.raises(updates.UpdateError) as e:
        updates.download(pkg, tmp_path / "dl", root, tmp_path / "client", context=server["context"])
    says = {"truncated": f"sent only {pkg.size // 2} of the {pkg.size} bytes", "altered": "SHA-256 differs"}
    assert says.get(damage, f"sent more than the {pkg.size} bytes") in str(e.value)
    assert str(e.value).endswith("the installed version stays")
    assert list((tmp_path / "dl").iterdir()) == []


def test_an_unreachable_repository_says_so_and_leaves_nothing(signers, server, tmp_path):
    import socket

    with socket.socket() as s:  # a loopback port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    url = f"https://127.0.0.1:{port}/updates"
    repo, root = update_repository(tmp_path / "repo", signers)
    got = updates.check([url], root, tmp_path / "client", timeout=5)
    assert got.release is None and "could not be reached" in got.refused[0]
    pkg = updates.Package(TAR, "p.tar.gz", "0" * 64, 10, url)
    with pytest.raises(updates.UpdateError, match="the download failed.*could not be reached.*installed version stays"):
        updates.download(pkg, tmp_path / "dl", root, tmp_path / "client", timeout=5)
    assert list((tmp_path / "dl").iterdir()) == []
    assert "only an https:// address" in updates.check(["http://127.0.0.1/x"], root, tmp_path / "c2").refused[0]


def test_a_copy_without_a_trusted_root_says_where_one_goes(tmp_path, monkeypatch):
    monkeypatch.setenv("SAPO_DATA_DIR", str(tmp_path))
    got = updates.check(["https://127.0.0.1:9/updates"])
    assert got.release is None and "trusts no update repository yet" in got.refused[0]
    assert str(tmp_path / "update-root.json") in got.refused[0]


@pytest.mark.parametrize(
    "line, says",
    [
        ('platform = "amiga"', "is not one of"),
        ('target = "../escape.tar.gz"', "a package's file name"),
        ('target = "release.toml"', "a package's file name"),
        ('version = "soon"', "is not a version"),
    ],
)
def test_a_release_with_a_bad_entry_is_refused_with_the_field(line, says):
    good = (
        '[release]\nversion = "9.3.0"\nnotes = "x"\n'
        '[[release.packages]]\nplatform = "linux-x86_64-tar"\ntarget = "p.tar.gz"\n'
    )
    key = line.split(" = ")[0]
    text = "\n".join(line if row.startswith(f"{key} = ") else row for row in good.splitlines())
    assert updates.parse_release(good, "r")[0].packages[TAR].target == "p.tar.gz"
    with pytest.raises(ValueError, match=says):
        updates.parse_release(text, "r")


@pytest.mark.parametrize(
    "archive, says",
    [
        (release_tarball("9.5.0", launcher=False), "no sapo-swarm launcher"),
        (release_tarball("9.5.0", extra={"../../escape.txt": b"x"}), "could not be unpacked"),
        (b"not a tarball at all", "could not be unpacked"),
    ],
    ids=["no-launcher", "path-escape", "not-tar"],
)
def test_a_bad_archive_leaves_the_installed_version_running(tmp_path, archive, says):
    root = tmp_path / "app"
    (root / "versions/9.0.0").mkdir(parents=True)
    (root / "versions/9.0.0/sapo-swarm").write_text("old")
    os.symlink("versions/9.0.0", root / "current")
    file = tmp_path / "p.tar.gz"
    file.write_bytes(archive)
    with pytest.raises(updates.UpdateError, match=says):
        updates.install_tarball(file, "9.5.0", root)
    assert os.readlink(root / "current") == "versions/9.0.0"
    assert sorted(p.name for p in (root / "versions").iterdir()) == ["9.0.0"]
    assert not (tmp_path / "escape.txt").exists()


def test_three_installs_keep_the_running_version_and_the_one_before(tmp_path):
    root = tmp_path / "app"
    for v in ("1.0.0", "1.1.0", "1.2.0"):
        file = tmp_path / f"{v}.tar.gz"
        file.write_bytes(release_tarball(v))
        updates.install_tarball(file, v, root)
    assert os.readlink(root / "current") == "versions/1.2.0"
    assert sorted(p.name for p in (root / "versions").iterdir()) == ["1.1.0", "1.2.0"]


def test_where_this_copy_came_from_decides_how_it_updates(tmp_path):
    assert updates.installation(frozen=False).kind == "source"
    assert updates.installation("/opt/sapo-swarm/bin/sapo-swarm", frozen=True).kind == "deb"
    assert updates.installation(str(tmp_path / "build/sapo-swarm"), frozen=True).kind == "unpacked"
    release = updates.Release("9.9.0", "")
    with pytest.raises(updates.UpdateError, match="git pull"):
        updates.install(tmp_path / "x", release, updates.Installation("source", ""))
    with pytest.raises(updates.UpdateError, match="unpacked by hand"):
        updates.install(tmp_path / "x", release, updates.Installation("unpacked", ""))
