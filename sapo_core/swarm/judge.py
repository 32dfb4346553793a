"""What one fetched peer record earns or costs its peer: the gather's anti-Sybil verdict, pure.

Identities are free, so a flood is made of records that cost nothing to make: ghosts (an index
entry whose record is not there), records holding nothing with signal, entries that promise
more than their record holds. `judge_record` decodes a record (records.py), verifies its
groups (verify.py) and says what the record was (docs/swarm.md, 'Hostile peers'):

- junk: a reason only a broken or hostile peer produces (`verify.JUNK_REASONS`): a strike;
- useless (`verify.USELESS_REASONS`): its record missing (`record_missing`), older than its
  entry (`wrong_round`), nothing with signal though its entry promised some (`no_signal`), or
  far less signal than promised (`index_lied`): half a strike;
- neutral: nothing trainable, as its entry said (an honest small model's usual round: ~2 rounds
  in 3 without signal). Before, such records were half strikes, and sapo-experiment's honest
  sharing nodes ignored each other: 0.17 peer groups per round instead of 1 after 60 rounds;
- otherwise clean: a strike away, and trust where a group was accepted.

Records verification had no time left for (`over_deadline`) are not their peer's fault. The
source applies the verdict to `PeerReputation` (`DhtRolloutSource._verify_peer_record_guarded`).
No network, no clock but the ones in `VerifyLimits`; nothing a peer sends raises.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from sapo_core.rollouts import Group
from sapo_core.swarm.keys import values_of
from sapo_core.swarm.records import IndexEntry, Receipt, Record, RecordError, decode_record
from sapo_core.swarm.verify import QuestionSource, VerifyLimits, verify_record


@dataclass
class RecordVerdict:
    """One record's outcome: the groups it gives and what it costs or earns its peer."""

    accepted: list[Group] = field(default_factory=list)
    rejected: Counter = field(default_factory=Counter)  # reason -> groups (or 1 for the record)
    junk: bool = False
    useless: bool = False
    neutral: bool = False
    receipts: list[Receipt] = field(default_factory=list)  # naming us: (receipting peer, our round, group)
    # records, records_missing, bytes_in, received, completions_cut, logprobs_unaligned,
    # duplicates_collapsed, verify_cpu_s, records_without_signal
    figures: Counter = field(default_factory=Counter)


def owned_payload(values: Any, peer: str) -> bytes | None:
    """The payload under `peer`'s own owner subkey among one key's values (as a get returns
    them), or None: nobody else can store under it (validation.py)."""
    from sapo_core.swarm.validation import owner_peer_id

    return next((v for sub, (v, _) in values_of(values, with_subkeys=True) if owner_peer_id(sub) == peer), None)


def judge_record(
    entry: IndexEntry,
    payload: bytes | None,
    tasks: QuestionSource,
    swarm: str,
    me: str,
    limits: VerifyLimits = VerifyLimits(),
) -> RecordVerdict:
    """The verdict on the record `entry` names (`payload` None: it was not found)."""
    verdict = RecordVerdict()
    if payload is None:  # an index entry naming a record that is not there: a ghost, or lost
        verdict.figures["records_missing"] += 1
        verdict.rejected["record_missing"] += 1
        verdict.useless = True
        return verdict
    verdict.figures["records"] += 1
    verdict.figures["bytes_in"] += len(payload)
    try:
        record = decode_record(payload, swarm)
        if record.window != entry.window or record.peer_id != entry.peer_id:
            raise RecordError("wrong_key", "record is not the one its key names")
    except RecordError as e:
        verdict.rejected[e.reason] += 1
        verdict.junk = True
        return verdict
    _judge_groups(verdict, entry, record, tasks, me, limits)
    return verdict


def _judge_groups(
    verdict: RecordVerdict, entry: IndexEntry, record: Record, tasks: QuestionSource, me: str, limits: VerifyLimits
) -> None:
    """Verify a decoded record's groups and judge the record against its index entry."""
    if record.round != entry.round:  # the entry says fresh, the record is an old one
        verdict.rejected["wrong_round"] += 1
        verdict.useless = True
        return
    f = verdict.figures
    f["received"] += len(record.groups)
    checked = verify_record(record, tasks, entry.peer_id, limits)
    verdict.rejected.update(checked.rejected)
    f["completions_cut"] += checked.cut
    f["logprobs_unaligned"] += checked.unaligned
    f["duplicates_collapsed"] += checked.duplicates
    f["verify_cpu_s"] += checked.cpu_seconds
    verdict.accepted = checked.accepted
    verdict.junk = checked.junk
    late = "over_deadline" in checked.rejected  # our time ran out: not the peer's fault
    if not verdict.junk and not checked.accepted and not late:
        if entry.signal_groups > 0:
            verdict.useless = True  # it promised signal and holds none (zero advantage, duplicates only...)
            verdict.rejected["no_signal"] += 1
        else:  # announced as holding nothing with signal, and so it is: read for its receipts
            verdict.neutral = True
            f["records_without_signal"] += 1
    if entry.signal_groups > 2 * len(checked.accepted) + 2 and not late:
        verdict.useless = True  # its index entry promised signal the record does not hold
        verdict.rejected["index_lied"] += 1
    if not verdict.junk:
        verdict.receipts = [(entry.peer_id, r[1], r[2]) for r in record.receipts if r[0] == me]
