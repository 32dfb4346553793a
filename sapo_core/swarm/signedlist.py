"""A swarm list that updates itself: fetched over HTTPS, believed only when signed.

Whoever runs the project's swarms publishes a swarm list (the layout of resources/swarms.toml)
at one or more URLs; nodes fetch it (`swarm.list_urls`; `sapo-node swarms update`, and at a
node's start) and use it between the shipped list and the user's own. A list is accepted only
when all of these hold, else it is refused with a message saying which, and nothing changes:

- it came over HTTPS (certificate checked) and is at most `MAX_LIST_BYTES`;
- its last line is `# sapo-signature: ed25519 <key id> <signature>`, an Ed25519 signature over
  every byte before that line by a key in `resources/swarmlist-keys.txt` (the key id names it);
- the rest has a top-level integer `version`, not lower than the last list accepted (an old list
  replayed by a mirror or an attacker cannot take back a change), and passes the caller's check
  (swarmlist.py parses it as a swarm list: names, peers, windows, tasks).

This module knows signatures and fetching, not swarm entries: swarmlist.py builds on it
(`update_swarm_list`, `sign_swarm_list`, and `load_swarms` reading the last good list).

The last good list is kept verbatim in the data directory (`LAST_GOOD_NAME`) and checked again
when read. Maintainers sign with `sapo-node swarms sign FILE --key KEY` and make a key with
`sapo-node swarms keygen`; the shipped keys file names no key until the project has one whose
private half a maintainer holds, so until then every fetched list is refused as unsigned by a
known key (and the shipped list, with no public address, stays what nodes use).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import ssl
import tomllib
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

MAX_LIST_BYTES = 256 * 1024
SIGNATURE_PREFIX = "# sapo-signature: ed25519 "
LAST_GOOD_NAME = "swarms.signed.toml"
KEYS_FILE = "swarmlist-keys.txt"


class SignedListError(ValueError):
    """A fetched or stored list we refuse; the message says why and what it means."""


def key_id(public_raw: bytes) -> str:
    return hashlib.sha256(public_raw).hexdigest()[:16]


def public_key_line(private_key) -> str:
    """The line for resources/swarmlist-keys.txt naming this private key's public half."""
    from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

    raw = private_key.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)
    return f"ed25519 {base64.b64encode(raw).decode()}  # key id {key_id(raw)}"


def parse_keys(text: str) -> dict[str, object]:
    """key id -> Ed25519 public key, from lines `ed25519 <base64 of 32 bytes>` (# comments)."""
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

    keys: dict[str, object] = {}
    for n, line in enumerate(text.splitlines(), 1):
        words = line.split("#", 1)[0].split()
        if not words:
            continue
        try:
            if len(words) != 2 or words[0] != "ed25519":
                raise ValueError("write: ed25519 <base64 public key>")
            raw = base64.b64decode(words[1], validate=True)
            keys[key_id(raw)] = Ed25519PublicKey.from_public_bytes(raw)
        except (ValueError, binascii.Error) as e:
            raise SignedListError(f"{KEYS_FILE} line {n}: {e}") from None
    return keys


def shipped_keys() -> dict[str, object]:
    """The keys in resources/swarmlist-keys.txt (this source tree's, else the installed one)."""
    beside = Path(__file__).resolve().parents[2] / "resources" / KEYS_FILE
    if beside.is_file():
        return parse_keys(beside.read_text(encoding="utf-8"))
    from importlib import resources

    return parse_keys(resources.files("sapo_resources").joinpath(KEYS_FILE).read_text(encoding="utf-8"))


def sign_list(text: str, private_key) -> str:
    """`text` (a list, any old signature line removed) with its signature line appended."""
    from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

    body = _body_and_signature(text)[0] if _has_signature(text) else text
    if not body.endswith("\n"):
        body += "\n"
    _version(body, "the list to sign")  # a list without a version cannot be accepted anywhere
    raw = private_key.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)
    signature = base64.b64encode(private_key.sign(body.encode("utf-8"))).decode()
    return f"{body}{SIGNATURE_PREFIX}{key_id(raw)} {signature}\n"


def _has_signature(text: str) -> bool:
    lines = text.rstrip("\n").splitlines()
    return bool(lines) and lines[-1].startswith(SIGNATURE_PREFIX)


def _body_and_signature(text: str) -> tuple[str, str]:
    stripped = text.rstrip("\n")
    cut = stripped.rfind("\n")
    return stripped[: cut + 1], stripped[cut + 1 :]


def _version(body: str, source: str) -> int:
    try:
        data = tomllib.loads(body)
    except tomllib.TOMLDecodeError as e:
        raise SignedListError(f"{source} is not valid TOML: {e}") from None
    v = data.get("version")
    if not isinstance(v, int) or isinstance(v, bool) or v < 1:
        raise SignedListError(f"{source} has no version (a top-level integer >= 1)")
    return v


@dataclass(frozen=True)
class SignedList:
    version: int
    key: str  # the id of the key that signed it
    body: str  # what was signed: the list without its signature line
    text: str  # the whole file, as fetched
    entries: list = field(default_factory=list)  # what `check` made of the body (swarmlist: entries)


# body, source -> what the list holds (raising ValueError to refuse it)
Check = Callable[[str, str], list]


def verify_list(data: bytes, keys: Mapping[str, object], source: str, check: Check | None = None) -> SignedList:
    """The list in `data` if it is signed by one of `keys`, has a version and passes `check`;
    else SignedListError."""
    from cryptography.exceptions import InvalidSignature

    if len(data) > MAX_LIST_BYTES:
        raise SignedListError(f"{source} is larger than {MAX_LIST_BYTES // 1024} KiB")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise SignedListError(f"{source} is not UTF-8 text") from None
    if not _has_signature(text):
        raise SignedListError(f"{source} is not signed (its last line is not '{SIGNATURE_PREFIX.strip()} ...')")
    body, line = _body_and_signature(text)
    words = line[len(SIGNATURE_PREFIX) :].split()
    if len(words) != 2:
        raise SignedListError(f"{source}: the signature line is malformed")
    kid, signature = words
    key = keys.get(kid)
    if key is None:
        known = ", ".join(keys) or "none: this release ships no list key"
        raise SignedListError(f"{source} is signed by key {kid[:16]!r}, not one this node trusts ({known})")
    try:
        key.verify(base64.b64decode(signature, validate=True), body.encode("utf-8"))
    except (InvalidSignature, ValueError, binascii.Error):
        raise SignedListError(f"{source}: the signature does not match the list (altered, or another key's)") from None
    version = _version(body, source)
    try:
        entries = check(body, source) if check is not None else []
    except ValueError as e:
        raise SignedListError(str(e)) from None
    return SignedList(version, kid, body, text, entries)


def fetch(url: str, timeout: float = 10.0, context: ssl.SSLContext | None = None) -> bytes:
    """The body at an https URL, at most MAX_LIST_BYTES (+1 to tell), or SignedListError."""
    if urllib.parse.urlsplit(url).scheme != "https":
        raise SignedListError(f"{url}: only https URLs are fetched")
    try:
        with urllib.request.urlopen(url, timeout=timeout, context=context) as response:  # noqa: S310 (https only)
            return response.read(MAX_LIST_BYTES + 1)
    except (urllib.error.URLError, OSError, ValueError) as e:
        reason = getattr(e, "reason", e)
        raise SignedListError(f"{url}: could not fetch it ({reason})") from None


def last_good_path() -> Path:
    from sapo_core import paths

    return paths.data_dir() / LAST_GOOD_NAME


def load_last_good(
    path: Path | None = None, keys: Mapping[str, object] | None = None, check: Check | None = None
) -> SignedList | None:
    """The last list accepted, checked again; None if there is none (or it no longer verifies)."""
    path = last_good_path() if path is None else path
    if not path.is_file():
        return None
    try:
        return verify_list(path.read_bytes(), shipped_keys() if keys is None else keys, str(path), check)
    except (SignedListError, OSError):
        return None


@dataclass
class UpdateResult:
    accepted: SignedList | None = None  # the list now in use, if one was fetched and accepted
    kept: SignedList | None = None  # the last good list, kept (nothing accepted)
    refused: list[str] = field(default_factory=list)  # one message per URL that gave nothing usable

    def lines(self) -> list[str]:
        out = [f"refused: {m}" for m in self.refused]
        if self.accepted is not None:
            a = self.accepted
            out.append(f"swarm list version {a.version} accepted (key {a.key}): {len(a.entries)} swarm(s)")
        elif self.kept is not None:
            out.append(f"kept the swarm list of version {self.kept.version}")
        else:
            out.append("no signed swarm list: the shipped list and your own are used")
        return out


def update(
    urls: Sequence[str],
    keys: Mapping[str, object] | None = None,
    path: Path | None = None,
    timeout: float = 10.0,
    context: ssl.SSLContext | None = None,
    check: Check | None = None,
) -> UpdateResult:
    """Fetch the list from `urls` in turn, accept the first good one of a version at least the
    last good one's, and keep it (atomically) as the last good list."""
    from sapo_core.fsutil import atomic_write_bytes

    keys = shipped_keys() if keys is None else keys
    path = last_good_path() if path is None else path
    result = UpdateResult(kept=load_last_good(path, keys, check))
    for url in urls:
        try:
            got = verify_list(fetch(url, timeout, context), keys, url, check)
            if result.kept is not None and got.version < result.kept.version:
                raise SignedListError(
                    f"{url} serves version {got.version}, older than the version {result.kept.version} "
                    "already accepted (a replayed list)"
                )
        except SignedListError as e:
            result.refused.append(str(e))
            continue
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_bytes(path, got.text.encode("utf-8"))
        result.accepted = got
        break
    return result


__all__ = [
    "SignedList",
    "SignedListError",
    "UpdateResult",
    "fetch",
    "load_last_good",
    "public_key_line",
    "sign_list",
    "update",
    "verify_list",
]
