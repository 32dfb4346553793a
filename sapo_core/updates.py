"""Updates: learn of a release from a TUF repository, fetch its package, install it between rounds.

The project publishes releases in a repository of The Update Framework (update_repo.py builds
it; docs/release.md is the procedure), and this client is python-tuf's `ngclient.Updater`. Before
it believes anything, TUF checks:

- every metadata file is signed by a threshold of the keys its role has in the trusted root, and
  each new root by the keys of the one before (a key rotated out or revoked signs nothing more);
- no role's version is lower than one accepted before (an older release replayed: a rollback);
- no role has expired: a mirror that stopped updating, or someone in the path replaying the
  newest metadata they saw to hold nodes on an old release (a freeze), is noticed when the
  timestamp expires (three days at most), and the check says it cannot confirm this copy is up
  to date, and why (`Check.unconfirmed`);
- every file is within its signed length and has its signed SHA-256 (nothing endless or altered).

The trusted root: `ROOT_FILE` shipped in sapo_resources, else one in the data directory (a fork's
own repository). Newer root versions (key rotations) come from the repository and are kept with
the rest of the trusted metadata in the data directory (`METADATA_DIR`), shared by all mirrors.

A release is the target `release.toml`, its packages targets of the same repository:

    [release]
    version = "0.2.0"                  # the app's version (PEP 440)
    notes = "What changed, in a line or two."
    [[release.packages]]
    platform = "linux-x86_64-tar"      # see PLATFORMS
    target = "sapo-swarm-0.2.0-linux-x86_64.tar.gz"

`check()` says whether the repository names a newer release with a package for this
installation. `download()` looks at the repository again (the metadata may have changed since)
and fetches that package into `NAME.part`, renamed only when whole and as signed (anything else
is deleted and refused). `install()` installs it, which only a packaged installation can do:

- `tarball` (the self-contained Linux package, unpacked anywhere): the archive unpacks into
  `ROOT/versions/VERSION` and the `ROOT/current` link, which the launchers follow, is swapped to
  it in one rename; until that rename the installed version is untouched, and the version before
  stays on disk (one older is removed), so a failed update leaves it running;
- `deb`: `pkexec apt-get install` of the package file (the system's own installer, which asks
  for the password);
- `source` (a clone with the source installer): not updated in place; the message says to pull
  and run the installer again.

Not tufup: it builds on python-tuf too, but installs by replacing the app's folder in place,
where the tarball keeps versions side by side and the .deb belongs to apt.

When: the app installs only when asked, or by itself when the user turned that on, never on a
metered connection (Qt's `QNetworkInformation`), and only after the node finished its round and
stopped (its checkpoint is written at every round's end), never mid-round.
"""

from __future__ import annotations

import os
import re
import shutil
import ssl
import sys
import tarfile
import tomllib
import urllib.parse
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from sapo_core import __version__

RELEASE_TARGET = "release.toml"
PLATFORMS = ("linux-x86_64-tar", "linux-x86_64-deb", "windows-x86_64", "macos-arm64", "macos-x86_64")
MAX_PACKAGE_BYTES = 4 << 30  # no package of ours is near this; a release saying more is refused
_CHUNK = 1 << 20
_TARGET_NAME = re.compile(r"[0-9A-Za-z][0-9A-Za-z._+-]{0,200}")


class UpdateError(Exception):
    """An update that cannot go on; the message says why and what to do."""


@dataclass(frozen=True)
class Package:
    platform: str
    target: str  # its name among the repository's targets
    sha256: str = ""  # as the repository's signed targets metadata says
    size: int = 0
    repository: str = ""  # the repository's URL


@dataclass(frozen=True)
class Release:
    version: str
    notes: str
    packages: Mapping[str, Package] = field(default_factory=dict)


def parse_release(body: str, source: str) -> list[Release]:
    """The release a release.toml names (a one-item list), its packages by target name only
    (their size and hash come from the signed targets metadata), or ValueError."""
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
        platform, target = p.get("platform"), p.get("target")
        if platform not in PLATFORMS:
            raise ValueError(f"{where}: platform {platform!r} is not one of {', '.join(PLATFORMS)}")
        if not isinstance(target, str) or not _TARGET_NAME.fullmatch(target) or target == RELEASE_TARGET:
            raise ValueError(f"{where}: target must be a package's file name")
        if platform in packages:
            raise ValueError(f"{where}: a second package for {platform}")
        packages[platform] = Package(platform, target)
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
    release: Release | None = None  # the release the repository names (newer or not)
    refused: list[str] = field(default_factory=list)  # a message per URL that gave nothing usable
    unconfirmed: str = ""  # why this copy cannot confirm it is up to date (the metadata expired)

    def newer(self, current: str = __version__) -> Release | None:
        return self.release if self.release is not None and is_newer(self.release.version, current) else None

    def package(self, platform: str, current: str = __version__) -> Package | None:
        release = self.newer(current)
        return release.packages.get(platform) if release is not None else None


def check(
    urls: Sequence[str],
    root: bytes | None = None,
    folder: Path | None = None,
    timeout: float = 10.0,
    context: ssl.SSLContext | None = None,
) -> Check:
    """Ask the repositories at `urls` in turn (mirrors of one repository) for the release, until
    one answers with metadata TUF accepts. `root`: the trusted root (default `trusted_root()`);
    `folder`: the trusted metadata (default in the data directory)."""
    from sapo_core import update_tuf as t

    root = root if root is not None else t.trusted_root()
    folder = folder or t.metadata_dir()
    if root is None:
        return Check(refused=[t.NO_ROOT.format(path=folder.parent / t.ROOT_FILE)])
    got = Check()
    for url in urls:
        fetcher = t.Fetcher(timeout, context)
        try:
            got.release = _read_release(t.client(url, root, folder, fetcher), url, folder)
            got.unconfirmed = ""  # one repository confirmed it
            return got
        except t.x.ExpiredMetadataError as e:
            got.unconfirmed = t.unconfirmed(e, url, fetcher)
            got.refused.append(f"{url}: {got.unconfirmed}")
        except UpdateError as e:
            got.refused.append(str(e))
        except (t.x.RepositoryError, t.x.DownloadError) as e:
            got.refused.append(t.why(e, url))
        except (OSError, ValueError) as e:  # the metadata folder, or a release.toml that does not parse
            got.refused.append(f"{url}: {e}")
    return got


def _read_release(client: Any, url: str, folder: Path) -> Release:
    info = client.get_targetinfo(RELEASE_TARGET)
    if info is None:
        raise UpdateError(f"{url}: the repository names no release ({RELEASE_TARGET} is not among its targets)")
    path = client.download_target(info, str(folder / RELEASE_TARGET))
    release = parse_release(Path(path).read_text(encoding="utf-8"), f"{url} {RELEASE_TARGET}")[0]
    packages = {}
    for platform, p in release.packages.items():
        target = client.get_targetinfo(p.target)
        digest = target.hashes.get("sha256") if target is not None else None
        if target is None or not digest or not 0 < target.length <= MAX_PACKAGE_BYTES:
            raise UpdateError(f"{url}: {RELEASE_TARGET} names {p.target}, which the signed targets do not list")
        packages[platform] = replace(p, sha256=digest, size=target.length, repository=url)
    return replace(release, packages=packages)


# --- downloading ---------------------------------------------------------------------------

Progress = Callable[[int, int], None]  # (bytes so far, bytes in all)


def download(
    package: Package,
    folder: Path,
    root: bytes | None = None,
    metadata: Path | None = None,
    timeout: float = 30.0,
    context: ssl.SSLContext | None = None,
    progress: Progress | None = None,
) -> Path:
    """The package in `folder`, whole and as the repository signs it now, or UpdateError (nothing
    left behind). The metadata is refreshed first; a file already there that matches is used."""
    from sapo_core import update_tuf as t

    x, metadata = t.x, metadata or t.metadata_dir()
    root = root if root is not None else t.trusted_root()
    if root is None:
        raise UpdateError(t.NO_ROOT.format(path=metadata.parent / t.ROOT_FILE))
    target, part = folder / package.target, folder / f"{package.target}.part"
    host = urllib.parse.urlsplit(package.repository).netloc or package.repository
    stays = "; the installed version stays"
    folder.mkdir(parents=True, exist_ok=True)
    fetcher = t.Fetcher(timeout, context, scratch=folder)
    try:
        client = t.client(package.repository, root, metadata, fetcher)
        info = client.get_targetinfo(package.target)
        if info is None or (info.hashes.get("sha256"), info.length) != (package.sha256, package.size):
            raise UpdateError(f"{host} no longer offers this package (a newer release is out?): check again")
        if client.find_cached_target(info, str(target)):
            return target
        free = shutil.disk_usage(folder).free
        if free < 2 * package.size + (64 << 20):  # the temporary file and the package, for a moment
            need = (2 * package.size + (64 << 20)) / 1e6
            raise UpdateError(f"{folder} has {free / 1e6:.0f} MB free; the update needs {need:.0f} MB: free some space")
        fetcher.progress, fetcher.expect = progress, package.size
        client.download_target(info, str(part))
        os.replace(part, target)
        return target
    except x.DownloadLengthMismatchError:
        why = f"{host} sent more than the {package.size} bytes the signed metadata says: not used"
    except x.LengthOrHashMismatchError as e:
        short = re.search(r"Observed length (\d+)", str(e))
        why = (
            f"{host} sent only {short.group(1)} of the {package.size} bytes the signed metadata says: not used"
            if short
            else f"{host} sent a file that is not the package the repository signed (its SHA-256 differs): not used"
        )
    except x.ExpiredMetadataError as e:
        why = f"SAPO Swarm cannot confirm the update: {t.unconfirmed(e, package.repository, fetcher)}"
    except (x.RepositoryError, x.DownloadError) as e:
        why = f"the download failed: {t.why(e, package.repository)}"
    except (OSError, ValueError) as e:
        why = f"the download failed ({e})"
    except UpdateError:
        part.unlink(missing_ok=True)
        raise
    part.unlink(missing_ok=True)
    raise UpdateError(why + stays)


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
