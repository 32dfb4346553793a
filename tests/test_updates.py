"""Updates (sapo_core/updates.py) against a real HTTPS server on loopback with its own
certificate: good, wrongly signed and truncated manifests; whole, truncated, altered and
oversized packages; a tarball install switched in one rename, and refused archives that leave
the installed version as it was."""

from __future__ import annotations

import hashlib
import os

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from sapo_core import updates
from sapo_core.swarm.signedlist import sign_list

from helpers import release_manifest, release_tarball


def _serve(server, name: str, data: bytes | str) -> str:
    (server["root"] / name).write_bytes(data.encode() if isinstance(data, str) else data)
    return f"{server['url']}/{name}"


def test_a_signed_newer_release_is_found_downloaded_and_installed_in_one_switch(server, key, keys, tmp_path):
    package = release_tarball("9.1.0")
    url = _serve(server, "sapo-swarm-9.1.0.tar.gz", package)
    manifest = _serve(server, "good.toml", sign_list(release_manifest(3, "9.1.0", url, package), key))
    found = updates.check([manifest], keys, tmp_path / "release.toml", context=server["context"])
    assert found.refused == [] and found.newer("0.1.0").version == "9.1.0"
    assert found.newer("9.1.0") is None  # the same version is no update
    pkg = found.package("linux-x86_64-tar", "0.1.0")
    seen = []
    file = updates.download(pkg, tmp_path / "dl", context=server["context"], progress=lambda a, b: seen.append(a))
    assert file.read_bytes() == package and seen[-1] == len(package)
    assert list((tmp_path / "dl").glob("*.part")) == []
    # a tarball installation at 9.0.0 takes it; the version before stays on disk
    root = tmp_path / "app"
    where = updates.installation(str(root / "versions/9.0.0/sapo-swarm"), frozen=True)
    (root / "versions/9.0.0").mkdir(parents=True)
    (root / "versions/9.0.0/sapo-swarm").write_text("old")
    os.symlink("versions/9.0.0", root / "current")
    assert where == updates.Installation("tarball", "linux-x86_64-tar", root)
    said = updates.install(file, found.release, where)
    assert "9.1.0 is installed" in said
    assert os.readlink(root / "current") == "versions/9.1.0"
    assert (root / "current/sapo-swarm").read_bytes().endswith(b"echo 9.1.0\n")
    assert (root / "versions/9.0.0/sapo-swarm").read_text() == "old"
    # the next check reads the manifest kept, even with the server gone from the list
    assert updates.check([], keys, tmp_path / "release.toml").release.version == "9.1.0"


def test_wrongly_signed_truncated_and_replayed_manifests_are_refused(server, key, keys, tmp_path):
    package = release_tarball("9.2.0")
    url = _serve(server, "p.tar.gz", package)
    other = Ed25519PrivateKey.generate()
    wrong = _serve(server, "wrong.toml", sign_list(release_manifest(5, "9.2.0", url, package), other))
    signed = sign_list(release_manifest(5, "9.2.0", url, package), key)
    truncated = _serve(server, "truncated.toml", signed[: len(signed) // 2])
    cut_body = signed.replace('notes = "Faster rounds."\n', "")  # signature of the whole, body cut
    altered = _serve(server, "cut.toml", cut_body)
    path = tmp_path / "release.toml"
    got = updates.check([wrong, truncated, altered], keys, path, context=server["context"])
    assert got.release is None and len(got.refused) == 3
    assert "not one this node trusts" in got.refused[0]
    assert "not signed" in got.refused[1] and "does not match" in got.refused[2]
    assert not path.exists()
    # a good one is kept; an older one served later cannot take it back
    good = _serve(server, "good5.toml", signed)
    assert updates.check([good], keys, path, context=server["context"]).release.version == "9.2.0"
    old = _serve(server, "old.toml", sign_list(release_manifest(4, "9.0.5", url, package), key))
    got = updates.check([old], keys, path, context=server["context"])
    assert got.release.version == "9.2.0" and "older than" in got.refused[0]


@pytest.mark.parametrize(
    "field, value, says",
    [
        ("url", '"http://127.0.0.1/p.tar.gz"', "https URL"),
        ("sha256", '"abc"', "64 lowercase hex"),
        ("platform", '"amiga"', "is not one of"),
        ("size", "0", "byte count"),
    ],
)
def test_a_manifest_with_a_bad_package_entry_is_refused_with_the_field(server, key, keys, tmp_path, field, value, says):
    package = release_tarball("9.3.0")
    text = release_manifest(2, "9.3.0", f"{server['url']}/p.tar.gz", package)
    text = "\n".join(f"{field} = {value}" if line.startswith(f"{field} = ") else line for line in text.splitlines())
    url = _serve(server, f"bad-{field}.toml", sign_list(text + "\n", key))
    got = updates.check([url], keys, tmp_path / "r.toml", context=server["context"])
    assert got.release is None and field in got.refused[0] and says in got.refused[0]


@pytest.mark.parametrize("damage", ["truncated", "altered", "longer"])
def test_a_package_that_is_not_the_signed_one_is_refused_and_nothing_is_left(server, tmp_path, damage):
    package = release_tarball("9.4.0")
    served = {
        "truncated": package[: len(package) // 2],
        "altered": package[:-1] + bytes([package[-1] ^ 1]),
        "longer": package + b"x" * 100,
    }[damage]
    url = _serve(server, f"{damage}.tar.gz", served)
    pkg = updates.Package("linux-x86_64-tar", url, hashlib.sha256(package).hexdigest(), len(package))
    with pytest.raises(updates.UpdateError) as e:
        updates.download(pkg, tmp_path, context=server["context"])
    assert ("only" in str(e.value)) if damage == "truncated" else True
    assert ("SHA-256" in str(e.value)) if damage == "altered" else True
    assert ("more bytes" in str(e.value)) if damage == "longer" else True
    assert list(tmp_path.iterdir()) == []


def test_an_unreachable_package_says_so_and_leaves_nothing(tmp_path):
    import socket

    with socket.socket() as s:  # a loopback port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    pkg = updates.Package("linux-x86_64-tar", f"https://127.0.0.1:{port}/p.tar.gz", "0" * 64, 10)
    with pytest.raises(updates.UpdateError, match="the download failed.*installed version stays"):
        updates.download(pkg, tmp_path, timeout=5)
    assert list(tmp_path.iterdir()) == []


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
