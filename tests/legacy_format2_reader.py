"""A frozen copy of the format-2 record *reader* as released before the optional `lp` field
(sapo_core/swarm/records.py at commit 76762d4, decoding only). Do not edit: it stands for the
nodes already installed, so tests can show that they still read, store and replicate what a
newer node publishes (tests/test_peer_correction.py)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import msgpack

from sapo_core.rollouts import QuestionId
from sapo_core.swarm.keys import PROTOCOL_VERSION

FORMAT_VERSION = 2
MAX_RECORD_BYTES = 256 * 1024  # hard limit of one round's record (the figure)
MAX_INDEX_BYTES = 1024
MAX_GROUPS = 64
MAX_COMPLETIONS = 64  # SamplerConfig.group_size's upper bound
MAX_TEXT_CHARS = 32 * 1024  # one question or one completion
MAX_ANSWER_CHARS = 4096
MAX_NAME_CHARS = 128  # dataset, config digest, swarm name, peer id
MAX_RECEIPTS = 64  # RoundConfig.external_groups' upper bound: one round trains at most that many
_INT64 = 2**63


class RecordError(ValueError):
    """A payload we refuse; `reason` is the counter it goes to (malformed, oversized, ...)."""

    def __init__(self, reason: str, detail: str = "") -> None:
        super().__init__(f"{reason}: {detail}" if detail else reason)
        self.reason = reason
        self.detail = detail


@dataclass(frozen=True)
class WireGroup:
    """A group as a peer sent it: nothing here is trusted until verify.py has checked it."""

    question_id: QuestionId
    text: str
    answer: str
    completions: tuple[str, ...]
    finished: tuple[bool, ...]  # per completion: it ended by itself (False: the sender cut it)


Receipt = tuple[str, int, int]  # (producer's peer id, producer's round, group index in its record)


@dataclass(frozen=True)
class Record:
    swarm: str
    window: int
    peer_id: str
    round: int
    groups: tuple[WireGroup, ...]
    receipts: tuple[Receipt, ...] = ()


@dataclass(frozen=True)
class IndexEntry:
    swarm: str
    window: int
    shard: int
    peer_id: str
    round: int
    groups: int
    signal_groups: int  # as the sender scored them: a hint for choosing, never believed
    record_bytes: int


# --- encoding ---------------------------------------------------------------------------------

# --- decoding ---------------------------------------------------------------------------------


def _unpack(payload: Any, max_bytes: int) -> dict:
    if not isinstance(payload, (bytes, bytearray)):
        raise RecordError("malformed", f"payload is {type(payload).__name__}, not bytes")
    if len(payload) > max_bytes:
        raise RecordError("oversized", f"{len(payload)} bytes > {max_bytes}")
    try:
        obj = msgpack.unpackb(
            payload,
            raw=False,
            strict_map_key=True,
            use_list=True,
            max_str_len=MAX_TEXT_CHARS * 4,
            max_bin_len=0,
            max_array_len=max(MAX_GROUPS, MAX_COMPLETIONS, 8),
            max_map_len=16,
            max_ext_len=0,
        )
    except Exception as e:  # msgpack raises many types (ExtraData, ValueError, UnicodeDecodeError...)
        raise RecordError("malformed", f"not msgpack: {type(e).__name__}") from None
    if not isinstance(obj, dict):
        raise RecordError("malformed", "not a map")
    return obj


def _header(obj: dict, kind: str, swarm: str) -> None:
    if obj.get("v") != FORMAT_VERSION or obj.get("p") != PROTOCOL_VERSION:
        raise RecordError("wrong_version", f"format {obj.get('v')!r} protocol {obj.get('p')!r}")
    if obj.get("k") != kind:
        raise RecordError("malformed", f"kind {obj.get('k')!r}, expected {kind}")
    if obj.get("s") != swarm:
        raise RecordError("wrong_swarm", f"swarm {str(obj.get('s'))[:MAX_NAME_CHARS]!r}")


def _int(obj: dict, key: str, low: int = -_INT64, high: int = _INT64 - 1) -> int:
    v = obj.get(key)
    if not isinstance(v, int) or isinstance(v, bool) or not low <= v <= high:
        raise RecordError("malformed", f"field {key} is not an integer in range")
    return v


def _name_ok(v: Any) -> bool:
    return isinstance(v, str) and 0 < len(v) <= MAX_NAME_CHARS


def _name(obj: dict, key: str) -> str:
    v = obj.get(key)
    if not _name_ok(v):
        raise RecordError("malformed", f"field {key} is not a short string")
    return v


def _receipt_ok(r: Any) -> bool:
    if not isinstance(r, (list, tuple)) or len(r) != 3:
        return False
    peer, round, index = r
    return (
        _name_ok(peer)
        and isinstance(round, int)
        and not isinstance(round, bool)
        and 0 <= round < _INT64
        and isinstance(index, int)
        and not isinstance(index, bool)
        and 0 <= index < MAX_GROUPS
    )


def _receipts(raw: Any) -> tuple[Receipt, ...]:
    if not isinstance(raw, list) or len(raw) > MAX_RECEIPTS or not all(_receipt_ok(r) for r in raw):
        raise RecordError("malformed", "receipts missing, too many or not (peer, round, group index)")
    return tuple((p, r, i) for p, r, i in raw)


def _group(raw: Any) -> WireGroup:
    if not isinstance(raw, list) or len(raw) != 8:
        raise RecordError("malformed", "a group is not an 8-item list")
    dataset, digest, seed, index, text, answer, completions, finished = raw
    if not (_name_ok(dataset) and _name_ok(digest)):
        raise RecordError("malformed", "bad dataset or config digest")
    for v in (seed, index):
        if not isinstance(v, int) or isinstance(v, bool) or not -_INT64 <= v < _INT64:
            raise RecordError("malformed", "bad seed or index")
    if not isinstance(text, str) or len(text) > MAX_TEXT_CHARS:
        raise RecordError("malformed", "bad question text")
    if not isinstance(answer, str) or len(answer) > MAX_ANSWER_CHARS:
        raise RecordError("malformed", "bad answer")
    if not isinstance(completions, list) or not 2 <= len(completions) <= MAX_COMPLETIONS:
        raise RecordError("malformed", "a group needs 2..64 completions")
    if not all(isinstance(c, str) and len(c) <= MAX_TEXT_CHARS for c in completions):
        raise RecordError("malformed", "bad completion")
    if (
        not isinstance(finished, list)
        or len(finished) != len(completions)
        or not all(isinstance(f, bool) for f in finished)
    ):
        raise RecordError("malformed", "finished flags are not one bool per completion")
    return WireGroup(QuestionId(dataset, digest, seed, index), text, answer, tuple(completions), tuple(finished))


def decode_record(payload: Any, swarm: str, max_bytes: int = MAX_RECORD_BYTES) -> Record:
    obj = _unpack(payload, min(max_bytes, MAX_RECORD_BYTES))
    _header(obj, "rec", swarm)
    groups = obj.get("g")
    if not isinstance(groups, list) or len(groups) > MAX_GROUPS:
        raise RecordError("malformed", "groups missing or too many")
    return Record(
        swarm,
        _int(obj, "w"),
        _name(obj, "id"),
        _int(obj, "r", 0),
        tuple(_group(g) for g in groups),
        _receipts(obj.get("rc")),
    )


def decode_index(payload: Any, swarm: str) -> IndexEntry:
    obj = _unpack(payload, MAX_INDEX_BYTES)
    _header(obj, "idx", swarm)
    return IndexEntry(
        swarm,
        _int(obj, "w"),
        _int(obj, "sh", 0, 1 << 20),
        _name(obj, "id"),
        _int(obj, "r", 0),
        _int(obj, "n", 0, MAX_GROUPS),
        _int(obj, "ns", 0, MAX_GROUPS),
        _int(obj, "b", 0, MAX_RECORD_BYTES),
    )


def decode_any(payload: Any, swarm: str) -> Record | IndexEntry:
    """Whichever of the two a payload is (the DHT validator sees both kinds)."""
    if isinstance(payload, (bytes, bytearray)) and len(payload) <= MAX_INDEX_BYTES:
        try:
            return decode_index(payload, swarm)
        except RecordError as e:
            if e.reason != "malformed" or "kind" not in e.detail:
                raise
    return decode_record(payload, swarm)
