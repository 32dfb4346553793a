"""Updates: learn of a release from a signed manifest, fetch its package, install it between rounds.

The manifest is a signed list (swarm/signedlist.py: HTTPS only, at most 256 KiB, its last line an
Ed25519 signature by a key in resources/swarmlist-keys.txt, the swarm list's key, and a top-level
integer `version` that never goes back), holding one release:

    version = 12                       # the manifest's own sequence number
    [release]
    version = "0.2.0"                  # the app's version (PEP 440)
    notes = "What changed, in a line or two."
    [[release.packages]]
    platform = "linux-x86_64-tar"      # see PLATFORMS
    url = "https://example.org/sapo-swarm-0.2.0-linux-x86_64.tar.gz"
    sha256 = "64 hex digits"
    size = 123456789                   # bytes

`check()` fetches it (the app: from `updates/url` in its settings) and says whether it names a
newer release with a package for this installation. `download()` fetches that package: exactly
`size` bytes whose SHA-256 is `sha256`, written beside its final name and renamed only when whole
(a truncated or altered download is deleted and refused). `install()` installs it, which only a
packaged installation can do:

- `tarball` (the self-contained Linux package, unpacked anywhere): the archive unpacks into
  `ROOT/versions/VERSION` and the `ROOT/current` link, which the launchers follow, is swapped to
  it in one rename; until that rename the installed version is untouched, and the version before
  stays on disk (one older is removed), so a failed update leaves it running;
- `deb`: `pkexec apt-get install` of the package file (the system's own installer, which asks
  for the password);
- `source` (a clone with the source installer): not updated in place; the message says to pull
  and run the installer again.

When: the app installs only when asked, or by itself when the user turned that on, never on a
metered connection (Qt's `QNetworkInformation`), and only after the node finished its round and
stopped (its checkpoint is written at every round's end), never mid-round.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import ssl
import sys
import tarfile
import tomllib
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from sapo_core import __version__

MANIFEST_NAME = "release.signed.toml"  # the last manifest accepted, in the data directory
PLATFORMS = ("linux-x86_64-tar", "linux-x86_64-deb", "windows-x86_64", "macos-arm64", "macos-x86_64")
MAX_PACKAGE_BYTES = 4 << 30  # no package of ours is near this; a manifest saying more is refused
_CHUNK = 1 << 20
_SHA256 = re.compile(r"[0-9a-f]{64}")


class UpdateError(Exception):
    """An update that cannot go on; the message says why and what to do."""


@dataclass(frozen=True)
class Package:
    platform: str
    url: str
    sha256: str
    size: int


@dataclass(frozen=True)
class Release:
    version: str
    notes: str
    packages: Mapping[str, Package] = field(default_factory=dict)


def parse_release(body: str, source: str) -> list[Release]:
    """The release a manifest's body names (a one-item list: signedlist's check), or ValueError."""
    from packaging.version import InvalidVersion, Version

    data = tomllib.loads(body)
    release = data.get("release")
    if not isinstance(release, dict):
        raise ValueError(f"{source} has no [release] table")
    version, notes = release.get("version"), release.get("notes", "")
    try:
        Version(str(version))
    except InvalidVersion:
        raise ValueError(f'{source}: release.version {version!r} is not a version (e.g. "0.2.0")') from None
    if not isinstance(version, str) or not isinstance(notes, str) or len(notes) > 4000:
        raise ValueError(f"{source}: release.version must be a string and release.notes text under 4,000 characters")
    packages: dict[str, Package] = {}
    for n, p in enumerate(release.get("packages", [])):
        where = f"{source}: release.packages[{n}]"
        if not isinstance(p, dict):
            raise ValueError(f"{where} is not a table")
        platform, url, digest, size = p.get("platform"), p.get("url"), p.get("sha256"), p.get("size")
        if platform not in PLATFORMS:
            raise ValueError(f"{where}: platform {platform!r} is not one of {', '.join(PLATFORMS)}")
        if not isinstance(url, str) or urllib.parse.urlsplit(url).scheme != "https":
            raise ValueError(f"{where}: url must be an https URL")
        if not isinstance(digest, str) or not _SHA256.fullmatch(digest):
            raise ValueError(f"{where}: sha256 must be 64 lowercase hex digits")
        if not isinstance(size, int) or isinstance(size, bool) or not 0 < size <= MAX_PACKAGE_BYTES:
            raise ValueError(f"{where}: size must be a byte count from 1 to {MAX_PACKAGE_BYTES}")
        if platform in packages:
            raise ValueError(f"{where}: a second package for {platform}")
        packages[platform] = Package(platform, url, digest, size)
    return [Release(version, notes, packages)]


def is_newer(version: str, than: str = __version__) -> bool:
    from packaging.version import Version

    return Version(version) > Version(than)


# --- what is installed -------------------------------------------------------------------


@dataclass(frozen=True)
class Installation:
    kind: str  # "tarball", "deb", "unpacked" (a package unpacked by hand) or "source"
    platform: str  # the package platform it takes ("" for source)
    root: Path | None = None  # tarball: the folder holding versions/ and current


def installation(executable: str | None = None, frozen: bool | None = None) -> Installation:
    """How this copy was installed: a packaged build (PyInstaller sets `sys.frozen`) under
    `ROOT/versions/V/` is a tarball install, one under /opt/sapo-swarm the .deb's, any other one
    a tarball unpacked by hand; else source."""
    frozen = getattr(sys, "frozen", False) if frozen is None else frozen
    if not frozen:
        return Installation("source", "")
    exe = Path(os.path.realpath(executable or sys.executable))
    if exe.is_relative_to("/opt/sapo-swarm"):
        return Installation("deb", "linux-x86_64-deb")
    for parent in exe.parents:
        if parent.parent.name == "versions":
            return Installation("tarball", "linux-x86_64-tar", parent.parent.parent)
    return Installation("unpacked", "")  # a tarball unpacked by hand, or a build where it was built


# --- checking ------------------------------------------------------------------------------


@dataclass
class Check:
    release: Release | None = None  # the newest release the manifest names (newer or not)
    refused: list[str] = field(default_factory=list)  # a message per URL that gave nothing usable

    def newer(self, current: str = __version__) -> Release | None:
        return self.release if self.release is not None and is_newer(self.release.version, current) else None

    def package(self, platform: str, current: str = __version__) -> Package | None:
        release = self.newer(current)
        return release.packages.get(platform) if release is not None else None


def manifest_path() -> Path:
    from sapo_core import paths

    return paths.data_dir() / MANIFEST_NAME


def check(
    urls: Sequence[str],
    keys: Mapping[str, object] | None = None,
    path: Path | None = None,
    timeout: float = 10.0,
    context: ssl.SSLContext | None = None,
) -> Check:
    """Fetch the manifest from `urls` in turn (signedlist.update: signed, never an older one
    than the last accepted), else the last one accepted."""
    from sapo_core.swarm import signedlist

    got = signedlist.update(
        urls, keys, manifest_path() if path is None else path, timeout, context, check=parse_release
    )
    manifest = got.accepted or got.kept
    return Check(manifest.entries[0] if manifest is not None else None, got.refused)


# --- downloading ---------------------------------------------------------------------------

Progress = Callable[[int, int], None]  # (bytes so far, bytes in all)


def download(
    package: Package,
    folder: Path,
    timeout: float = 30.0,
    context: ssl.SSLContext | None = None,
    progress: Progress | None = None,
) -> Path:
    """The package in `folder`, whole and as signed, or UpdateError (nothing left behind).

    One request; at most `size` + 1 bytes read; the file is `NAME.part` until its size and
    SHA-256 match, then renamed. A file already there that matches is used as it is."""
    name = Path(urllib.parse.urlsplit(package.url).path).name or f"sapo-swarm-{package.platform}"
    target = folder / name
    if target.is_file() and target.stat().st_size == package.size and _sha256(target) == package.sha256:
        return target
    if urllib.parse.urlsplit(package.url).scheme != "https":
        raise UpdateError(f"{package.url}: only https URLs are fetched")
    folder.mkdir(parents=True, exist_ok=True)
    free = shutil.disk_usage(folder).free
    if free < package.size + (64 << 20):
        raise UpdateError(
            f"{folder} has {free / 1e6:.0f} MB free; the update needs {package.size / 1e6:.0f} MB: free some space"
        )
    part = target.with_name(target.name + ".part")
    digest, got = hashlib.sha256(), 0
    try:
        with urllib.request.urlopen(package.url, timeout=timeout, context=context) as reply:  # noqa: S310 (https)
            with open(part, "wb") as f:
                while got <= package.size:
                    block = reply.read(min(_CHUNK, package.size + 1 - got))
                    if not block:
                        break
                    f.write(block)
                    digest.update(block)
                    got += len(block)
                    if progress is not None:
                        progress(min(got, package.size), package.size)
        if got != package.size:
            more = "more" if got > package.size else f"only {got}"
            raise UpdateError(f"{package.url} sent {more} bytes; the signed manifest says {package.size}: not used")
        if digest.hexdigest() != package.sha256:
            raise UpdateError(f"{package.url} is not the package the manifest signed (its SHA-256 differs): not used")
        os.replace(part, target)
    except (urllib.error.URLError, OSError, ValueError) as e:
        part.unlink(missing_ok=True)
        reason = getattr(e, "reason", e)
        raise UpdateError(f"{package.url}: the download failed ({reason}); the installed version stays") from None
    except UpdateError:
        part.unlink(missing_ok=True)
        raise
    return target


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(_CHUNK), b""):
            h.update(block)
    return h.hexdigest()


# --- installing ----------------------------------------------------------------------------

LAUNCHER = "sapo-swarm"  # what a tarball's version folder must hold at its top


def install(file: Path, release: Release, where: Installation) -> str:
    """Install a downloaded package; returns what happened, in a sentence. UpdateError leaves
    the installed version as it was."""
    if where.kind == "tarball" and where.root is not None:
        install_tarball(file, release.version, where.root)
        return f"SAPO Swarm {release.version} is installed; it starts the next time the app starts"
    if where.kind == "deb":
        import subprocess

        cmd = ["pkexec", "apt-get", "install", "-y", str(file)]
        try:
            done = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
        except (OSError, subprocess.SubprocessError) as e:
            raise UpdateError(f"could not run {' '.join(cmd)} ({e}); the installed version stays") from None
        if done.returncode != 0:
            said = (done.stderr or "").strip().splitlines()[-1:] or ["no reason given"]
            raise UpdateError(f"the system's installer refused the package ({said[0]}); the installed version stays")
        return f"SAPO Swarm {release.version} is installed; it starts the next time the app starts"
    if where.kind == "unpacked":
        raise UpdateError(
            "this copy was unpacked by hand and is not updated in place: download the new package from the "
            "project's page (the .deb updates itself)"
        )
    raise UpdateError(
        "this copy runs from its source folder and is not updated in place: there, run "
        "`git pull && ./installer/install.sh`, or install the package from the project's page"
    )


def install_tarball(archive: Path, version: str, root: Path) -> Path:
    """Unpack `archive` into ROOT/versions/VERSION and point ROOT/current at it (one rename).

    The archive holds one top folder with the launcher in it. Refused (nothing changes): an
    archive that is not a tar.gz, one with links or paths leaving its folder (tarfile's "data"
    filter), one without the launcher. Keeps the version before; removes older ones."""
    if not re.fullmatch(r"[0-9A-Za-z.+!-]+", version):
        raise UpdateError(f"release version {version!r} cannot name a folder")
    versions = root / "versions"
    versions.mkdir(parents=True, exist_ok=True)
    staging = versions / f".{version}.unpacking"
    shutil.rmtree(staging, ignore_errors=True)
    try:
        with tarfile.open(archive, "r:gz") as tar:
            tar.extractall(staging, filter="data")
        tops = [p for p in staging.iterdir()]
        top = tops[0] if len(tops) == 1 and tops[0].is_dir() else staging
        if not (top / LAUNCHER).is_file():
            raise UpdateError(f"{archive.name} has no {LAUNCHER} launcher at its top: not installed")
        final = versions / version
        if final.exists():
            shutil.rmtree(final)
        os.replace(top, final)
    except (tarfile.TarError, OSError, EOFError) as e:
        raise UpdateError(f"{archive.name} could not be unpacked ({e}); the installed version stays") from None
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    current = root / "current"
    before = os.readlink(current) if current.is_symlink() else None
    link = root / ".current.new"
    link.unlink(missing_ok=True)
    os.symlink(Path("versions") / version, link)
    os.replace(link, current)  # the switch: one rename, so a crash leaves the old or the new
    keep = {version, Path(before).name if before else ""}
    for old in versions.iterdir():
        if old.is_dir() and old.name not in keep and not old.name.startswith("."):
            shutil.rmtree(old, ignore_errors=True)
    return versions / version


__all__ = [
    "Check",
    "Installation",
    "Package",
    "Release",
    "UpdateError",
    "check",
    "download",
    "install",
    "install_tarball",
    "installation",
    "is_newer",
    "parse_release",
]
