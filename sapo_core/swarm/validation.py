"""DHT record validators: every value our DHT stores or returns is signed, typed and in place.

hivemind runs a chain of validators on each record a peer asks us to store and each record a
get returns (dht/validation.py): in decreasing priority, the signature first (it also strips
the signature), then the schema. A record that fails is simply not stored / not returned.

- `OwnedSignatureValidator`: hivemind's `RSASignatureValidator` built with *this node's* key
  (never the process-wide one), which additionally refuses unprotected records: every value
  in the swarm's DHT must carry an `[owner:<public key>]` subkey and that owner's signature,
  so a subkey can only be written by its owner.
- `SwarmSchemaValidator`: the value must decode as one of our payloads (records.py) of this
  swarm and protocol; the payload's window/peer/shard must hash to the very DHT key it is
  stored under (a record cannot be replayed under another key); the owner's peer id must be
  the payload's peer id (no one publishes in another peer's name); the window must be
  current and the expiration finite and not far in the future (no immortal values on storage
  nodes; a NaN expiration would be stored and later break hivemind's callbacks).

The owner subkey must deserialise as msgpack bin holding exactly one owner tag and nothing
else, canonically encoded (`bad_subkey` otherwise): a str, tuple or any other type would
reach readers as that type; padding around the tag would let one owner store unlimited,
unbounded subkeys under one key; and readers re-serialise a dictionary's subkeys before they
check signatures, so one non-canonical subkey would make them drop every value under its key.
So each owner has exactly one subkey per key, at most `MAX_SUBKEY_BYTES` long.

Validators return False and count the reason; they never raise into hivemind's loop.
"""

from __future__ import annotations

import math
import re
import threading
from collections import Counter
from collections.abc import Callable
from typing import Any

import msgpack
from hivemind.dht.crypto import RSASignatureValidator
from hivemind.dht.routing import DHTID
from hivemind.dht.validation import DHTRecord, RecordValidatorBase
from hivemind.utils import get_dht_time

from sapo_core.swarm.identity import peer_id_of_ssh_key
from sapo_core.swarm.keys import KeySpace
from sapo_core.swarm.records import MAX_RECORD_BYTES, IndexEntry, Record, RecordError, decode_any

_OWNER_RE = re.compile(RSASignatureValidator.PUBLIC_KEY_REGEX)
# An owner tag holds an ssh-format RSA public key (~400 bytes for 2048 bits); 1 KiB leaves room
# for 4096-bit keys and nothing else.
MAX_SUBKEY_BYTES = 1024


class ReasonCounter:
    """A thread-safe Counter: validators run in the DHT thread, the round loop reads them."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counts: Counter[str] = Counter()

    def add(self, reason: str, n: int = 1) -> None:
        with self._lock:
            self._counts[reason] += n

    def snapshot(self) -> dict[str, int]:
        with self._lock:
            return dict(self._counts)


def owner_tag(ssh_public_key: bytes) -> bytes:
    """The subkey that marks a value as owned by this public key (hivemind's format)."""
    return RSASignatureValidator.PUBLIC_KEY_FORMAT.replace(b"_key_", ssh_public_key)


def owner_peer_id(subkey: Any) -> str | None:
    """Peer id of the single owner named in a subkey (serialised, or as a get returns it), or
    None. Anything but bytes of a bounded size is None: subkeys come from peers and
    deserialise as whatever msgpack type the peer chose."""
    if not isinstance(subkey, (bytes, bytearray)) or not subkey or len(subkey) > MAX_SUBKEY_BYTES + 16:
        return None
    try:
        keys = set(_OWNER_RE.findall(bytes(subkey)))
        if len(keys) != 1:
            return None
        return peer_id_of_ssh_key(keys.pop())
    except Exception:  # cryptography raises several types on junk keys
        return None


def subkey_is_owner_tag(serialised_subkey: Any) -> bool:
    """The serialised subkey is a msgpack bin holding exactly one owner tag, nothing around it."""
    if not isinstance(serialised_subkey, (bytes, bytearray)) or len(serialised_subkey) > MAX_SUBKEY_BYTES + 16:
        return False
    try:
        inner = msgpack.unpackb(
            bytes(serialised_subkey),
            raw=True,
            max_bin_len=MAX_SUBKEY_BYTES,
            max_str_len=0,
            max_array_len=0,
            max_map_len=0,
            max_ext_len=0,
        )
    except Exception:  # wrong type, too long, trailing bytes: all the same to us
        return False
    if not isinstance(inner, bytes) or msgpack.packb(inner, use_bin_type=True) != serialised_subkey:
        return False  # not canonical: readers re-serialise subkeys, fail the signature and drop the whole key
    keys = _OWNER_RE.findall(inner)
    return len(keys) == 1 and inner == owner_tag(keys[0])


def expiration_ok(expiration: Any) -> bool:
    """A finite number (NaN and inf pass every `<`/`>` test hivemind makes, and break it later)."""
    return isinstance(expiration, (int, float)) and not isinstance(expiration, bool) and math.isfinite(expiration)


class OwnedSignatureValidator(RSASignatureValidator):
    """`RSASignatureValidator` with this node's key that also refuses unsigned values."""

    def __init__(self, private_key: object, counts: ReasonCounter) -> None:
        super().__init__(private_key)
        self._counts = counts

    def validate(self, record: DHTRecord) -> bool:
        try:
            if not isinstance(record.subkey, (bytes, bytearray)) or not _OWNER_RE.search(record.subkey):
                self._counts.add("unsigned")
                return False
            if not subkey_is_owner_tag(record.subkey):
                self._counts.add("bad_subkey")
                return False
            if not expiration_ok(record.expiration_time):
                self._counts.add("bad_expiration")
                return False
            if super().validate(record):
                return True
        except Exception:  # a junk key or signature must cost a count, not the DHT's loop
            pass
        self._counts.add("bad_signature")
        return False


class SwarmSchemaValidator(RecordValidatorBase):
    """Accepts only this swarm's records and index entries, each under its own key."""

    def __init__(self, keyspace: KeySpace, counts: ReasonCounter, clock: Callable[[], float] = get_dht_time) -> None:
        self.keyspace = keyspace
        self._counts = counts
        self._clock = clock

    @property
    def priority(self) -> int:
        return 0  # after the signature validator (10) has checked and stripped the signature

    def validate(self, record: DHTRecord) -> bool:
        try:
            reason = self._check(record)
        except RecordError as e:
            reason = e.reason
        except Exception:  # anything unexpected from a peer's bytes is junk, never a crash
            reason = "malformed"
        if reason is None:
            return True
        self._counts.add(reason)
        return False

    def _check(self, record: DHTRecord) -> str | None:
        if not expiration_ok(record.expiration_time):
            return "bad_expiration"
        payload = _unwrap_bin(record.value)
        decoded = decode_any(payload, self.keyspace.swarm_name)
        now = self._clock()
        if not self.keyspace.window_is_current(decoded.window, now):
            return "stale"
        if record.expiration_time > now + 3 * self.keyspace.window_seconds:
            return "expiration"
        if isinstance(decoded, Record):
            key = self.keyspace.record_key(decoded.window, decoded.peer_id)
        else:
            assert isinstance(decoded, IndexEntry)
            if decoded.shard != self.keyspace.shard_of(decoded.peer_id, decoded.window):
                return "wrong_key"
            key = self.keyspace.index_key(decoded.window, decoded.shard)
        if DHTID.generate(source=key).to_bytes() != record.key:
            return "wrong_key"
        if owner_peer_id(record.subkey) != decoded.peer_id:
            return "wrong_owner"
        return None

    def merge_with(self, other: RecordValidatorBase) -> bool:
        return False


def _unwrap_bin(value: bytes) -> bytes:
    """The DHT stores our payload wrapped as one msgpack bin; anything else is malformed."""
    try:
        # The bytes are in memory already (p2p caps messages); the size check below names it.
        inner = msgpack.unpackb(
            value, raw=True, max_bin_len=len(value), max_str_len=0, max_array_len=0, max_map_len=0, max_ext_len=0
        )
    except Exception:
        raise RecordError("malformed", "not a msgpack bin") from None
    if not isinstance(inner, bytes):
        raise RecordError("malformed", "not a msgpack bin")
    if len(inner) > MAX_RECORD_BYTES:
        raise RecordError("oversized", f"{len(inner)} bytes")
    return inner


def make_validators(private_key: object, keyspace: KeySpace, counts: ReasonCounter) -> list[RecordValidatorBase]:
    """The chain a swarm DHTNode runs (hivemind's CompositeValidator orders it by priority)."""
    return [OwnedSignatureValidator(private_key, counts), SwarmSchemaValidator(keyspace, counts)]
