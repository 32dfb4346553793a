"""What a node publishes each round: its groups fitted to the record limit.

`fit_record` cuts a round's groups to the size limit: groups with a learning signal first
(peers drop the others anyway), whole groups dropped, never text truncated (a cut completion
would score differently). Pure: no network, no clock.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from sapo_core.rollouts import Group
from sapo_core.swarm.records import (
    MAX_ANSWER_CHARS,
    MAX_COMPLETIONS,
    MAX_GROUPS,
    MAX_RECEIPTS,
    MAX_RECORD_BYTES,
    MAX_TEXT_CHARS,
    Receipt,
    Record,
    WireGroup,
    encode_record,
    name_ok,
    receipt_ok,
    wire_group_of,
)


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
