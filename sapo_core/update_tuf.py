"""python-tuf's client as the updates use it: the root of trust, the network, the limits, and
what each refusal means in words (updates.py is the flow; update_repo.py the other side).

Imported only when a check or a download runs, so the app starts without loading python-tuf.
"""

from __future__ import annotations

import contextlib
import ssl
import tempfile
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import IO, Any

from tuf.api import exceptions as x
from tuf.api.serialization import DeserializationError
from tuf.ngclient import FetcherInterface, Updater, UpdaterConfig

ROOT_FILE = "update-root.json"  # the trusted root: shipped in sapo_resources, or in the data directory
METADATA_DIR = "update-metadata"  # the trusted metadata, in the data directory
NO_ROOT = (
    "this copy trusts no update repository yet: the project ships no update root until it signs "
    "releases (docs/release.md); a fork's own root goes in {path}"
)
# Metadata larger than these is refused before it is parsed (ours are a few KiB)
LIMITS = UpdaterConfig(
    root_max_length=64 << 10,
    timestamp_max_length=16 << 10,
    snapshot_max_length=64 << 10,
    targets_max_length=1 << 20,
)
_CHUNK = 1 << 20


def trusted_root() -> bytes | None:
    """The root of trust this copy was given: shipped, else in the data directory; None if neither."""
    from importlib import resources

    from sapo_core import paths

    shipped = resources.files("sapo_resources") / ROOT_FILE
    if shipped.is_file():
        return shipped.read_bytes()
    own = paths.data_dir() / ROOT_FILE
    return own.read_bytes() if own.is_file() else None


def metadata_dir() -> Path:
    from sapo_core import paths

    return paths.data_dir() / METADATA_DIR


class Fetcher(FetcherInterface):
    """The network side over urllib: HTTPS only, the caller's TLS context and timeout, progress
    of a package, and its temporary file in `scratch` (the update's folder, not /tmp, which is
    often a RAM disk too small for a package)."""

    def __init__(self, timeout: float, context: ssl.SSLContext | None, scratch: Path | None = None) -> None:
        self.timeout, self.context, self.scratch = timeout, context, scratch
        self.progress: Callable[[int, int], None] | None = None  # (bytes so far, of bytes)
        self.expect = 0
        self.metadata: dict[str, bytes] = {}  # role -> the metadata last fetched (what an expiry is read from)

    def _fetch(self, url: str) -> Iterator[bytes]:
        if urllib.parse.urlsplit(url).scheme != "https":
            raise x.DownloadError(f"{url}: only https URLs are fetched")
        try:
            reply = urllib.request.urlopen(url, timeout=self.timeout, context=self.context)  # noqa: S310 (https)
        except urllib.error.HTTPError as e:
            raise x.DownloadHTTPError(f"HTTP {e.code} {e.reason}", e.code) from None
        except (urllib.error.URLError, OSError, ValueError) as e:
            raise x.DownloadError(str(getattr(e, "reason", e))) from None
        return self._chunks(reply)

    def _chunks(self, reply: Any) -> Iterator[bytes]:
        got = 0
        with reply:
            while True:
                try:
                    block = reply.read(_CHUNK)
                except OSError as e:  # a timeout or a reset mid-way
                    raise x.DownloadError(str(e)) from None
                if not block:
                    return
                got += len(block)
                if self.progress is not None:
                    self.progress(min(got, self.expect), self.expect)
                yield block

    @contextlib.contextmanager
    def download_file(self, url: str, max_length: int) -> Iterator[IO[bytes]]:
        """As FetcherInterface's, with the temporary file in `scratch`."""
        with tempfile.TemporaryFile(dir=self.scratch) as f:
            got = 0
            for chunk in self.fetch(url):
                got += len(chunk)
                if got > max_length:
                    raise x.DownloadLengthMismatchError(f"{url} is longer than {max_length} bytes")
                f.write(chunk)
            f.seek(0)
            name = urllib.parse.urlsplit(url).path.rsplit("/", 1)[-1]
            if name.endswith(".json"):  # metadata, a few KiB: kept for `unconfirmed`
                self.metadata[name.split(".")[-2]] = f.read()
                f.seek(0)
            yield f


def client(url: str, root: bytes, folder: Path, fetcher: Fetcher) -> Updater:
    """A refreshed client of the repository at `url`: TUF's errors propagate; ValueError for an
    address that is not https."""
    if urllib.parse.urlsplit(url).scheme != "https":
        raise ValueError(f"{url}: only an https:// address is used")
    folder.mkdir(parents=True, exist_ok=True)
    base = url.rstrip("/") + "/"
    updater = Updater(str(folder), base + "metadata/", str(folder), base + "targets/", fetcher, LIMITS, bootstrap=root)
    updater.refresh()
    return updater


def why(e: Exception, url: str) -> str:
    """What a refused repository means, in a sentence."""
    host = urllib.parse.urlsplit(url).netloc or url
    if isinstance(e, x.DownloadHTTPError) and e.status_code == 404:
        return f"{url}: no update repository there, or no release published yet ({e})"
    if isinstance(e, x.DownloadError):
        return f"{url}: could not be reached ({e or type(e).__name__})"
    if isinstance(e, x.UnsignedMetadataError):
        return f"{host}: the update metadata is not signed by the keys this copy trusts ({e}): refused"
    if isinstance(e, DeserializationError):
        return f"{host}: the update metadata is damaged or cut short ({e}): refused"
    if isinstance(e, x.LengthOrHashMismatchError):
        return f"{host}: a file is not the one its signed metadata describes ({e}): refused"
    if isinstance(e, x.BadVersionNumberError):
        return f"{host}: the update metadata is older than what this copy accepted before ({e}): a replay, refused"
    return f"{host}: the update metadata was refused ({type(e).__name__}: {e})"


def unconfirmed(e: x.ExpiredMetadataError, url: str, fetcher: Fetcher, now: datetime | None = None) -> str:
    """Why this copy cannot confirm it is up to date, when the repository's metadata expired.
    The date is read from the expired metadata as fetched (TUF checked its signatures first)."""
    from tuf.api.metadata import Metadata

    host = urllib.parse.urlsplit(url).netloc or url
    role = next((r for r in ("timestamp", "snapshot", "targets", "root") if r in str(e)), "timestamp")
    now = now or datetime.now(UTC)
    when = ""
    with contextlib.suppress(Exception):  # the date is a courtesy: the refusal stands without it
        expires = Metadata.from_bytes(fetcher.metadata[role]).signed.expires
        if expires < now:
            when = f" on {expires:%Y-%m-%d %H:%M} UTC ({_ago((now - expires).total_seconds())})"
    return (
        f"the update information from {host} expired{when}; the project signs it anew daily, so a mirror has "
        "stopped updating, or someone in between is holding back news of releases"
    )


def _ago(seconds: float) -> str:
    if seconds < 60:
        return "moments ago"
    if seconds < 5400:
        return f"{max(1, round(seconds / 60))} min ago"
    if seconds < 2 * 86400:
        return f"{seconds / 3600:.0f} hours ago"
    return f"{seconds / 86400:.0f} days ago"


__all__ = [
    "Fetcher",
    "METADATA_DIR",
    "NO_ROOT",
    "ROOT_FILE",
    "client",
    "metadata_dir",
    "trusted_root",
    "unconfirmed",
    "why",
]
