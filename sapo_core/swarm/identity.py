"""The node's persistent identity: one RSA key that fixes its peer id and signs its records.

The key file is what p2pd takes as `-id` (a libp2p `PrivateKey` protobuf holding the RSA
key in DER form, the same bytes `hivemind.P2P.generate_identity` writes), so one file gives

- the libp2p peer id (multihash of the public key): the same across restarts;
- the key `RSASignatureValidator` signs our DHT records with (one key per node, never
  hivemind's process-wide key, so two nodes in one process stay two identities);
- a readable name derived from the peer id ("quick-heron-3fa2"), for logs and the GUI.

The file is created on first start with owner-only permissions (0600) and can be exported
for backup and imported on another install. This module needs only `cryptography`, so
`sapo-node identity` stays fast (hivemind takes seconds to import); the hivemind key object
is built on demand by `NodeIdentity.hivemind_key()`.
"""

from __future__ import annotations

import hashlib
import os
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa

from sapo_core.fsutil import atomic_write_bytes

KEY_FILE_NAME = "node.key"
KEY_BITS = 2048
_RSA_KEY_TYPE = 0  # libp2p crypto.proto: KeyType.RSA
_B58_ALPHABET = "123456789ABCDEFGHJKLMNPQRSTUVWXYZabcdefghijkmnopqrstuvwxyz"


class IdentityError(Exception):
    """The identity file is missing, unreadable or not a libp2p RSA key; the text says what to do."""


# --- libp2p encodings (protobuf `PrivateKey`/`PublicKey`, multihash, base58) ------------------


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        byte = n & 0x7F
        n >>= 7
        out.append(byte | (0x80 if n else 0))
        if not n:
            return bytes(out)


def _key_protobuf(data: bytes) -> bytes:
    """libp2p `{Type: RSA, Data: data}` (field 1 varint, field 2 bytes)."""
    return b"\x08" + _varint(_RSA_KEY_TYPE) + b"\x12" + _varint(len(data)) + data


def _parse_key_protobuf(blob: bytes) -> bytes:
    """The `Data` field of an RSA libp2p key protobuf; IdentityError for anything else."""
    pos, key_type, data = 0, None, None
    try:
        while pos < len(blob):
            tag = blob[pos]
            pos += 1
            value, shift = 0, 0
            while True:  # a varint: the type, or the length of the bytes field
                b = blob[pos]
                pos += 1
                value |= (b & 0x7F) << shift
                shift += 7
                if not b & 0x80:
                    break
            if tag == 0x08:
                key_type = value
            elif tag == 0x12:
                data = blob[pos : pos + value]
                if len(data) != value:
                    raise IndexError
                pos += value
            else:
                raise IndexError
    except IndexError:
        raise IdentityError("not a libp2p key file (the protobuf is cut or has unknown fields)") from None
    if key_type != _RSA_KEY_TYPE or not data:
        raise IdentityError(f"not an RSA libp2p key (key type {key_type}); only RSA identities are supported")
    return data


def _base58(data: bytes) -> str:
    n = int.from_bytes(data, "big")
    out = ""
    while n:
        n, r = divmod(n, 58)
        out = _B58_ALPHABET[r] + out
    return "1" * (len(data) - len(data.lstrip(b"\0"))) + out


def peer_id_of(public_key: rsa.RSAPublicKey) -> str:
    """The libp2p peer id (base58) of an RSA public key, as p2pd computes it."""
    spki = public_key.public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
    digest = hashlib.sha256(_key_protobuf(spki)).digest()
    return _base58(b"\x12\x20" + digest)  # multihash: sha2-256, 32 bytes


def peer_id_of_ssh_key(ssh_public_key: bytes) -> str:
    """Peer id of a public key in the OpenSSH form hivemind's `[owner:...]` tags carry."""
    key = serialization.load_ssh_public_key(ssh_public_key)
    if not isinstance(key, rsa.RSAPublicKey):
        raise ValueError("not an RSA public key")
    return peer_id_of(key)


# --- readable names ---------------------------------------------------------------------------

_ADJECTIVES = (
    "agile",
    "amber",
    "bold",
    "brave",
    "bright",
    "calm",
    "clever",
    "coral",
    "crisp",
    "curious",
    "daring",
    "deft",
    "eager",
    "fierce",
    "gentle",
    "glad",
    "golden",
    "grand",
    "hardy",
    "humble",
    "jolly",
    "keen",
    "kind",
    "lively",
    "lucky",
    "merry",
    "mighty",
    "nimble",
    "noble",
    "patient",
    "plucky",
    "polite",
    "proud",
    "quick",
    "quiet",
    "rapid",
    "rare",
    "ready",
    "rosy",
    "rustic",
    "shy",
    "silent",
    "silver",
    "sleek",
    "smart",
    "snowy",
    "solid",
    "spry",
    "steady",
    "stout",
    "sunny",
    "swift",
    "tidy",
    "tiny",
    "tough",
    "vivid",
    "warm",
    "wild",
    "wise",
    "witty",
    "young",
    "zany",
    "zealous",
    "zesty",
)
_ANIMALS = (
    "badger",
    "bat",
    "beaver",
    "bison",
    "boar",
    "camel",
    "cat",
    "cobra",
    "crane",
    "crow",
    "deer",
    "dingo",
    "dove",
    "eagle",
    "eel",
    "elk",
    "falcon",
    "ferret",
    "finch",
    "fox",
    "gecko",
    "goat",
    "goose",
    "hare",
    "hawk",
    "heron",
    "ibis",
    "jackal",
    "jay",
    "koala",
    "lark",
    "lemur",
    "lion",
    "llama",
    "lynx",
    "magpie",
    "marten",
    "mole",
    "moose",
    "newt",
    "otter",
    "owl",
    "panda",
    "parrot",
    "pika",
    "puffin",
    "quail",
    "raven",
    "robin",
    "salmon",
    "seal",
    "shrew",
    "sloth",
    "snail",
    "stork",
    "swan",
    "tapir",
    "tiger",
    "toad",
    "trout",
    "viper",
    "walrus",
    "wombat",
    "yak",
)


def node_name(peer_id: str) -> str:
    """A readable, stable name for a peer id: adjective-animal-hex4 (the hex keeps it unique enough)."""
    h = hashlib.sha256(peer_id.encode("ascii", "replace")).digest()
    return f"{_ADJECTIVES[h[0] % len(_ADJECTIVES)]}-{_ANIMALS[h[1] % len(_ANIMALS)]}-{h[2:4].hex()}"


# --- the identity -----------------------------------------------------------------------------


@dataclass(frozen=True)
class NodeIdentity:
    """This node's key, where it lives, and the ids derived from it."""

    path: Path
    private_key: rsa.RSAPrivateKey
    peer_id: str
    name: str
    fresh: bool = False  # created just now: no other node can be using it yet

    @classmethod
    def from_key(cls, path: Path, private_key: rsa.RSAPrivateKey, fresh: bool = False) -> NodeIdentity:
        peer_id = peer_id_of(private_key.public_key())
        return cls(path=Path(path), private_key=private_key, peer_id=peer_id, name=node_name(peer_id), fresh=fresh)

    def hivemind_key(self) -> Any:
        """This key as `hivemind.utils.crypto.RSAPrivateKey` (imports hivemind)."""
        from hivemind.utils.crypto import RSAPrivateKey

        key = RSAPrivateKey.__new__(RSAPrivateKey)
        key.__setstate__({"_private_key": _der(self.private_key)})  # hivemind's own unpickling path
        return key


def _der(private_key: rsa.RSAPrivateKey) -> bytes:
    return private_key.private_bytes(
        serialization.Encoding.DER, serialization.PrivateFormat.TraditionalOpenSSL, serialization.NoEncryption()
    )


def encode_key_file(private_key: rsa.RSAPrivateKey) -> bytes:
    return _key_protobuf(_der(private_key))


def decode_key_file(blob: bytes) -> rsa.RSAPrivateKey:
    der = _parse_key_protobuf(blob)
    try:
        key = serialization.load_der_private_key(der, password=None)
    except (ValueError, TypeError) as e:
        raise IdentityError(f"the RSA key inside the identity file does not load: {e}") from None
    if not isinstance(key, rsa.RSAPrivateKey):
        raise IdentityError("the identity file holds a key that is not RSA")
    return key


def default_identity_path() -> Path:
    """`<data dir>/identity/node.key` (sapo_core.paths): one identity per user, shared by runs."""
    from sapo_core import paths

    return paths.identity_dir() / KEY_FILE_NAME


def _check_permissions(path: Path) -> None:
    if os.name != "posix":
        return
    mode = stat.S_IMODE(path.stat().st_mode)
    if mode & 0o077:
        raise IdentityError(
            f"{path} is readable by other users (mode {mode:o}); anyone who reads it can sign as this "
            f"node. Fix with: chmod 600 {path}"
        )


def load_identity(path: str | os.PathLike) -> NodeIdentity:
    """Read an existing identity; IdentityError says what is wrong and how to fix it."""
    p = Path(path)
    try:
        blob = p.read_bytes()
    except FileNotFoundError:
        raise IdentityError(
            f"no identity at {p}; start the node once (or run `sapo-node identity show --create`) "
            f"to create one, or import a backup with `sapo-node identity import FILE`"
        ) from None
    except OSError as e:
        raise IdentityError(f"cannot read the identity file {p}: {e}") from None
    _check_permissions(p)
    try:
        return NodeIdentity.from_key(p, decode_key_file(blob))
    except IdentityError as e:
        raise IdentityError(f"{p}: {e}") from None


def load_or_create_identity(path: str | os.PathLike) -> NodeIdentity:
    """The identity at `path`, created (0600, atomically) on first use."""
    p = Path(path)
    if p.exists():
        return load_identity(p)
    key = rsa.generate_private_key(public_exponent=65537, key_size=KEY_BITS)
    atomic_write_bytes(p, encode_key_file(key), mode=0o600)
    return NodeIdentity.from_key(p, key, fresh=True)


def export_identity(identity: NodeIdentity, dest: str | os.PathLike, overwrite: bool = False) -> Path:
    """Copy the key file to `dest` (0600) for backup. Refuses to overwrite unless asked."""
    d = Path(dest)
    if d.exists() and not overwrite:
        raise IdentityError(f"{d} exists; choose another file or pass --force to overwrite it")
    atomic_write_bytes(d, encode_key_file(identity.private_key), mode=0o600)
    return d


def import_identity(src: str | os.PathLike, dest: str | os.PathLike, overwrite: bool = False) -> NodeIdentity:
    """Install a backed-up key file as this node's identity (checked before anything is written)."""
    s, d = Path(src), Path(dest)
    try:
        key = decode_key_file(s.read_bytes())
    except OSError as e:
        raise IdentityError(f"cannot read {s}: {e}") from None
    except IdentityError as e:
        raise IdentityError(f"{s}: {e}") from None
    if d.exists() and not overwrite:
        current = load_identity(d)
        if current.peer_id == peer_id_of(key.public_key()):
            return current
        raise IdentityError(
            f"{d} already holds another identity ({current.name}, {current.peer_id}); export it first "
            f"if you want to keep it, then pass --force to replace it"
        )
    atomic_write_bytes(d, encode_key_file(key), mode=0o600)
    return NodeIdentity.from_key(d, key)
