"""What peers exchange: a round's record and its index entry, as compact, versioned msgpack.

A record is decoded text (the paper shares text): for each group the question's id, its text
and answer as the sender saw them, and the completions -- plus, optionally, the sender's
sampling log-prob of each completion token (below). No rewards or token ids: the receiver
regenerates the question from its id, re-scores every completion with its own rewards and
re-tokenises with its own tokenizer (verify.py).

Decoding is strict and bounded: a size limit before anything is parsed, msgpack's own
length limits while parsing, then a schema check; every failure is a `RecordError` with a
short `reason` that the caller counts (never another exception type). Publishing cuts a
round's groups to the size limit first (publish.py, `fit_record`).

Wire format, version 2 (msgpack maps with short keys):
  record: {v, p, k:"rec", s: swarm, w: window, id: peer id, r: round,
           g: [[dataset, config digest, seed, index, question text, answer, [completion, ...],
                [finished, ...]], ...],
           rc: [[peer id, round, group index], ...],
           lp: [nil | [log-probs of completion 1, ...], ...]}        (optional, one per group)
  index:  {v, p, k:"idx", s, w, sh: shard, id, r, n: groups, ns: groups with signal, b: record bytes,
           av: the publisher's app version,                          (av optional, since 0.1.0)
           m: the model it trains, ho: [round, solve rate in thousandths, completions]}
                                                     (m and ho optional, added 2026-11-24)

Version 2 added per completion whether it ended by itself (`finished`: a
receiver appends its stop token only then, never to a completion the sender cut) and the
receipts `rc`: the external groups the publisher trained on in its previous round, each named
by (producer's peer id, producer's round, group index in that producer's record). Version 1
payloads are refused as `wrong_version` (the key prefix changed too, see keys.py).

`m` and `ho` are what a node says about itself for the swarm's page (swarm/observer.py): its
catalogue model and its latest held-out evaluation (after which round, the solve rate, over how
many completions). Self-reported: shown as such, never used to choose peers. Older readers
ignore both keys; this reader refuses a malformed one like any other malformed field.

The log-probs `lp` (added 2026-11-24, still format 2) let a receiver correct for training on
another policy's samples (truncated importance sampling, trainer.py). They are an optional
map key, so a node that predates them decodes the record as before and never sees them: old
and new nodes read, store and replicate each other's records (tests/test_swarm_records.py
decodes new records with a frozen copy of the older reader). Each completion's log-probs are
one ASCII string, base64 of little-endian uint16s, -log p in thousandths of a nat (~2.7 bytes
a token; msgpack bin is refused by every format-2 reader, and a list of 128 numbers would break
their 64-item array limit). The encoding cannot carry a positive or non-finite value; values
beyond -`LOGPROB_BOUND` are representable and refused per group by verify.py
(`bad_logprobs`), as a peer that sends a log-prob count that text could not have. Senders
clamp at the bound, so an honest peer never trips it.
"""

from __future__ import annotations

import base64
import binascii
import math
import struct
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import msgpack

from sapo_core.rollouts import Group, QuestionId
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
LOGPROB_BOUND = 40.0  # nats: a sampled token below -40 (p < 4e-18) is implausible, see above
_LOGPROB_SCALE = 1000  # wire unit: thousandths of a nat


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
    # per completion: the sender's sampling log-prob of each of its tokens (its tokenizer), or None
    logprobs: tuple[tuple[float, ...], ...] | None = None


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
    app_version: str = ""  # the publisher's SAPO Swarm version, as it says ("" from older nodes)
    model: str = ""  # the catalogue model it trains, as it says ("" from older nodes)
    held_out: tuple[int, float, int] | None = None  # its last held-out: (after round, solve rate, completions)


# --- encoding ---------------------------------------------------------------------------------


def _pack(obj: Any) -> bytes:
    return msgpack.packb(obj, use_bin_type=True)


def _wire_group(g: WireGroup) -> list:
    q = g.question_id
    return [
        q.dataset,
        q.config_digest,
        q.seed,
        q.index,
        g.text,
        g.answer,
        list(g.completions),
        [bool(f) for f in g.finished],
    ]


def encode_logprobs(logprobs: Sequence[float]) -> str:
    """One completion's log-probs on the wire (see the module docstring); clamped to
    [-LOGPROB_BOUND, 0], non-finite values as the bound."""
    bound = int(LOGPROB_BOUND * _LOGPROB_SCALE)
    q = [min(bound, max(0, round(-x * _LOGPROB_SCALE))) if math.isfinite(x) else bound for x in logprobs]
    return base64.b64encode(struct.pack(f"<{len(q)}H", *q)).decode("ascii")


def decode_logprobs(text: Any) -> tuple[float, ...]:
    """The inverse of `encode_logprobs`; anything else is a `RecordError("malformed")`. Values
    are not judged here (verify.py does, per group)."""
    if not isinstance(text, str):
        raise RecordError("malformed", "log-probs are not a string")
    try:
        raw = base64.b64decode(text.encode("ascii"), validate=True)
    except (UnicodeEncodeError, binascii.Error, ValueError):
        raise RecordError("malformed", "log-probs are not base64") from None
    if len(raw) % 2:
        raise RecordError("malformed", "log-probs have an odd byte count")
    return tuple(-q / _LOGPROB_SCALE for q in struct.unpack(f"<{len(raw) // 2}H", raw))


def encode_record(record: Record) -> bytes:
    obj = {
        "v": FORMAT_VERSION,
        "p": PROTOCOL_VERSION,
        "k": "rec",
        "s": record.swarm,
        "w": record.window,
        "id": record.peer_id,
        "r": record.round,
        "g": [_wire_group(g) for g in record.groups],
        "rc": [list(r) for r in record.receipts[:MAX_RECEIPTS]],
    }
    if any(g.logprobs is not None for g in record.groups):
        obj["lp"] = [None if g.logprobs is None else [encode_logprobs(x) for x in g.logprobs] for g in record.groups]
    return _pack(obj)


def encode_index(entry: IndexEntry) -> bytes:
    return _pack(
        {
            "v": FORMAT_VERSION,
            "p": PROTOCOL_VERSION,
            "k": "idx",
            "s": entry.swarm,
            "w": entry.window,
            "sh": entry.shard,
            "id": entry.peer_id,
            "r": entry.round,
            "n": entry.groups,
            "ns": entry.signal_groups,
            "b": entry.record_bytes,
            **({"av": entry.app_version} if entry.app_version else {}),
            **({"m": entry.model} if entry.model else {}),
            **({"ho": _held_out_wire(entry.held_out)} if entry.held_out is not None else {}),
        }
    )


def wire_group_of(group: Group) -> WireGroup:
    """Our group as we publish it, with the sampler's log-probs where every completion has a
    finite one per token (a sampler that reports none, or NaN for unknown, publishes text only)."""
    q = group.question
    cs = group.completions
    known = all(
        c.sample_logprobs is not None
        and c.token_ids is not None
        and len(c.sample_logprobs) == len(c.token_ids)
        and all(math.isfinite(x) for x in c.sample_logprobs)
        for c in cs
    )
    return WireGroup(
        q.id,
        q.text,
        q.answer,
        tuple(c.text for c in cs),
        tuple(bool(c.finished) for c in cs),
        tuple(tuple(c.sample_logprobs) for c in cs) if known and cs else None,
    )


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


def name_ok(v: Any) -> bool:
    """A dataset, config digest, swarm name or peer id as the schema takes it: a short string."""
    return isinstance(v, str) and 0 < len(v) <= MAX_NAME_CHARS


def _name(obj: dict, key: str) -> str:
    v = obj.get(key)
    if not name_ok(v):
        raise RecordError("malformed", f"field {key} is not a short string")
    return v


def receipt_ok(r: Any) -> bool:
    """A well-formed receipt: (peer id, round >= 0, group index < MAX_GROUPS)."""
    if not isinstance(r, (list, tuple)) or len(r) != 3:
        return False
    peer, round, index = r
    return (
        name_ok(peer)
        and isinstance(round, int)
        and not isinstance(round, bool)
        and 0 <= round < _INT64
        and isinstance(index, int)
        and not isinstance(index, bool)
        and 0 <= index < MAX_GROUPS
    )


def _receipts(raw: Any) -> tuple[Receipt, ...]:
    if not isinstance(raw, list) or len(raw) > MAX_RECEIPTS or not all(receipt_ok(r) for r in raw):
        raise RecordError("malformed", "receipts missing, too many or not (peer, round, group index)")
    return tuple((p, r, i) for p, r, i in raw)


def _logprobs(raw: Any, groups: list[WireGroup]) -> list[WireGroup]:
    """The groups with the optional `lp` field attached (absent: as sent by an older node)."""
    if raw is None:
        return groups
    if not isinstance(raw, list) or len(raw) != len(groups):
        raise RecordError("malformed", "log-probs are not one entry per group")
    out = []
    for g, lps in zip(groups, raw):
        if lps is not None:
            if not isinstance(lps, list) or len(lps) != len(g.completions):
                raise RecordError("malformed", "log-probs are not one entry per completion")
            g = WireGroup(g.question_id, g.text, g.answer, g.completions, g.finished, tuple(map(decode_logprobs, lps)))
        out.append(g)
    return out


def _group(raw: Any) -> WireGroup:
    if not isinstance(raw, list) or len(raw) != 8:
        raise RecordError("malformed", "a group is not an 8-item list")
    dataset, digest, seed, index, text, answer, completions, finished = raw
    if not (name_ok(dataset) and name_ok(digest)):
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
        tuple(_logprobs(obj.get("lp"), [_group(g) for g in groups])),
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
        _app_version(obj.get("av", "")),
        _model(obj.get("m", "")),
        _held_out(obj.get("ho")),
    )


def _app_version(v: Any) -> str:
    """An announced version: short, of digits, letters and '.+-' (older nodes send none)."""
    if not isinstance(v, str) or len(v) > 32 or not all(c.isalnum() or c in ".+-" for c in v):
        raise RecordError("malformed", "app version is not a short version string")
    return v


def _model(v: Any) -> str:
    """An announced model: a short catalogue id or file name (letters, digits, '._-/+')."""
    if not isinstance(v, str) or len(v) > 64 or not all(c.isalnum() or c in "._-/+" for c in v):
        raise RecordError("malformed", "model is not a short model name")
    return v


def _held_out_wire(held_out: tuple[int, float, int]) -> list[int]:
    after_round, rate, completions = held_out
    return [int(after_round), round(min(1.0, max(0.0, rate)) * 1000), int(completions)]


def _held_out(v: Any) -> tuple[int, float, int] | None:
    """An announced held-out figure: [round >= 0, solve rate 0..1000 thousandths, completions >= 1]."""
    if v is None:
        return None
    if not (
        isinstance(v, list)
        and len(v) == 3
        and all(isinstance(x, int) and not isinstance(x, bool) for x in v)
        and 0 <= v[0] < _INT64
        and 0 <= v[1] <= 1000
        and 1 <= v[2] <= 1_000_000
    ):
        raise RecordError("malformed", "held-out figure is not [round, thousandths, completions]")
    return v[0], v[1] / 1000, v[2]


def decode_any(payload: Any, swarm: str) -> Record | IndexEntry:
    """Whichever of the two a payload is (the DHT validator sees both kinds)."""
    if isinstance(payload, (bytes, bytearray)) and len(payload) <= MAX_INDEX_BYTES:
        try:
            return decode_index(payload, swarm)
        except RecordError as e:
            if e.reason != "malformed" or "kind" not in e.detail:
                raise
    return decode_record(payload, swarm)
