"""What a node publishes each round: its groups fitted to the record limit, as DHT items.

`fit_record` cuts a round's groups to the size limit: groups with a learning signal first
(peers drop the others anyway), whole groups dropped, never text truncated (a cut completion
would score differently). `publish_items` makes the record and its index entry ready to store
under our owner subkey (keys.py has the key space, records.py the wire format). A round that
outlasts its window would leave its node invisible to readers, so the DHT thread publishes the
latest record again in each new window (`republished`), for at most `REPUBLISH_WINDOWS`
windows (docs/swarm.md, 'No central clock: time windows'). Pure: no network, no clock.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass

from sapo_core import __version__ as APP_VERSION
from sapo_core.rollouts import Group
from sapo_core.swarm.keys import KeySpace
from sapo_core.swarm.records import (
    MAX_ANSWER_CHARS,
    MAX_COMPLETIONS,
    MAX_GROUPS,
    MAX_RECEIPTS,
    MAX_RECORD_BYTES,
    MAX_TEXT_CHARS,
    IndexEntry,
    Receipt,
    Record,
    WireGroup,
    encode_index,
    encode_record,
    name_ok,
    receipt_ok,
    wire_group_of,
)

REPUBLISH_WINDOWS = 2  # how long a round may outlast its window and stay readable

Item = tuple[str, bytes, float]  # (key, payload, expiration), as SwarmDHT.store takes them


@dataclass(frozen=True)
class FittedRecord:
    record: Record
    payload: bytes
    signal_groups: int
    dropped_groups: int
    dropped_completions: int


def _keep(wire: WireGroup, n: int) -> WireGroup:
    """The group's first n completions (with their log-probs)."""
    lps = wire.logprobs[:n] if wire.logprobs is not None else None
    return WireGroup(wire.question_id, wire.text, wire.answer, wire.completions[:n], wire.finished[:n], lps)


def fit_record(
    swarm: str,
    window: int,
    peer_id: str,
    round: int,
    groups: Sequence[Group],
    max_bytes: int = MAX_RECORD_BYTES,
    receipts: Sequence[Receipt] = (),
) -> FittedRecord:
    """The largest record of these groups that encodes within `max_bytes`.

    Groups with a learning signal go first (peers drop the others anyway); whole groups are
    added while they fit; a group too large on its own keeps the completions that fit if at
    least two do (GRPO needs two). Completions or questions over the schema's limits are left
    out, so what we publish always decodes on the other side. Receipts beyond MAX_RECEIPTS or
    not well formed are left out too.
    """
    max_bytes = min(max_bytes, MAX_RECORD_BYTES)
    receipts = tuple(r for r in receipts if receipt_ok(r))[:MAX_RECEIPTS]
    ordered = sorted(groups, key=lambda g: not g.has_signal())[:MAX_GROUPS]
    dropped_groups, dropped_completions = len(groups) - len(ordered), 0
    kept: list[WireGroup] = []
    signal = 0

    def size(gs: list[WireGroup]) -> int:
        return len(encode_record(Record(swarm, window, peer_id, round, tuple(gs), receipts)))

    for group in ordered:
        wire = wire_group_of(group)
        lps = wire.logprobs if wire.logprobs is not None else (None,) * len(wire.completions)
        ok = [
            (c, f, lp)
            for c, f, lp in zip(wire.completions[:MAX_COMPLETIONS], wire.finished, lps)
            if len(c) <= MAX_TEXT_CHARS
        ]
        ok_texts, ok_finished = tuple(c for c, _, _ in ok), tuple(f for _, f, _ in ok)
        ok_lps = tuple(lp for _, _, lp in ok) if wire.logprobs is not None else None
        if (
            len(ok_texts) < 2
            or len(wire.text) > MAX_TEXT_CHARS
            or len(wire.answer) > MAX_ANSWER_CHARS
            or not name_ok(wire.question_id.dataset)
            or not name_ok(wire.question_id.config_digest)
        ):
            dropped_groups += 1
            dropped_completions += len(wire.completions)
            continue
        dropped_completions += len(wire.completions) - len(ok_texts)
        wire = WireGroup(wire.question_id, wire.text, wire.answer, ok_texts, ok_finished, ok_lps)
        if size(kept + [wire]) <= max_bytes:
            kept.append(wire)
            signal += group.has_signal()
            continue
        n = len(ok_texts)
        while n > 2 and size(kept + [_keep(wire, n)]) > max_bytes:
            n -= 1
        cut = _keep(wire, n)
        if n >= 2 and size(kept + [cut]) <= max_bytes:
            kept.append(cut)
            dropped_completions += len(ok_texts) - n
            # A cut group's signal is unknown (its rewards were for all completions); not counted.
        else:
            dropped_groups += 1
            dropped_completions += len(ok_texts)
    record = Record(swarm, window, peer_id, round, tuple(kept), receipts)
    return FittedRecord(record, encode_record(record), signal, dropped_groups, dropped_completions)


def publish_items(
    keyspace: KeySpace,
    record: Record,
    signal_groups: int,
    now: float,
    model: str = "",
    held_out: tuple[int, float, int] | None = None,
    app_version: str = APP_VERSION,
) -> list[Item]:
    """The record and its index entry, ready to store. `model` and `held_out` are what the
    publisher says about itself (records.py, `IndexEntry`)."""
    window, peer = record.window, record.peer_id
    payload = encode_record(record)
    shard = keyspace.shard_of(peer, window)
    entry = IndexEntry(
        record.swarm,
        window,
        shard,
        peer,
        record.round,
        len(record.groups),
        signal_groups,
        len(payload),
        app_version,
        model,
        held_out,
    )
    expiration = keyspace.expiration(now)
    return [
        (keyspace.record_key(window, peer), payload, expiration),
        (keyspace.index_key(window, shard), encode_index(entry), expiration),
    ]


def republished(
    latest: tuple[Record, int, int] | None, window: int, max_windows: int = REPUBLISH_WINDOWS
) -> tuple[Record, int, int] | None:
    """The latest (record, signal groups, first window) moved into `window`, or None: nothing
    published yet, the record is in this window already, or it has outlived `max_windows`."""
    if latest is None:
        return None
    record, signal, first = latest
    if record.window >= window or window - first > max_windows:
        return None
    return dataclasses.replace(record, window=window), signal, first
