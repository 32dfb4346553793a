"""Peers' groups are verified, not believed: regenerate, compare, re-score, filter, sample.

For every group of a decoded peer record (records.py has already checked its shape):

1. regenerate the question and its answer from the id alone (`TaskSet.regenerate`): an
   unknown dataset, config or index is rejected (`unknown_task`, `unknown_config`,
   `bad_index`);
2. the sender's question text and answer must equal ours (`text_mismatch`,
   `answer_mismatch`): a peer cannot teach us a wrong answer or swap the question;
3. every completion is re-scored with *our* reward functions; the sender's rewards are
   never even sent;
4. groups whose rewards are all equal give zero advantage and are dropped
   (`zero_advantage`, the SAPO paper's filter, §4).

Accepted groups carry the peer id as `source`, no token ids (the node re-tokenises them with
its own tokenizer) and our rewards. Every rejection is counted by reason and by peer; a peer
whose records keep holding junk is ignored for a while (`PeerReputation`). Pure: no network,
no clock except the one passed in, nothing raised for any peer input.

Departure from the reference code (rl-swarm): it scored external completions against the
sender's answer with the sender's choice of scorer; SAPO.md explains why that is unsafe.
"""

from __future__ import annotations

import random
import time
from collections import Counter, OrderedDict
from dataclasses import dataclass, field
from typing import Callable, Protocol, Sequence

from sapo_core.rollouts import Completion, Group, Question, QuestionId
from sapo_core.swarm.records import Record

# Reasons that only a broken or hostile peer produces; honest peers can produce the others
# (a zero-advantage group, a task or difficulty level we do not run).
JUNK_REASONS = frozenset({
    "malformed", "oversized", "wrong_version", "wrong_swarm", "wrong_key", "wrong_owner", "wrong_peer",
    "text_mismatch", "answer_mismatch", "bad_index", "bad_score",
})


class QuestionSource(Protocol):
    """The part of `sapo_core.tasks.TaskSet` verification uses."""

    def regenerate(self, qid: QuestionId) -> Question: ...

    def score(self, question: Question, completions: Sequence[str]) -> list[float]: ...


@dataclass
class Verdict:
    accepted: list[Group] = field(default_factory=list)
    rejected: Counter = field(default_factory=Counter)  # reason -> groups

    @property
    def junk(self) -> bool:
        return any(r in JUNK_REASONS for r in self.rejected)


def verify_record(record: Record, tasks: QuestionSource, peer_id: str) -> Verdict:
    """Check every group of one peer's record; never raises for anything the peer sent."""
    verdict = Verdict()
    if record.peer_id != peer_id:
        verdict.rejected["wrong_peer"] += max(1, len(record.groups))
        return verdict
    for wire in record.groups:
        try:
            question = tasks.regenerate(wire.question_id)
        except ValueError as e:  # tasks.UnknownQuestion is a ValueError carrying .reason
            verdict.rejected[getattr(e, "reason", "unknown_task")] += 1
            continue
        except Exception:  # a dataset generator failing on a peer's id is that id's problem
            verdict.rejected["bad_index"] += 1
            continue
        if wire.text != question.text:
            verdict.rejected["text_mismatch"] += 1
            continue
        if wire.answer != question.answer:
            verdict.rejected["answer_mismatch"] += 1
            continue
        try:
            rewards = [float(r) for r in tasks.score(question, list(wire.completions))]
        except Exception:
            rewards = []
        if len(rewards) != len(wire.completions):
            verdict.rejected["bad_score"] += 1
            continue
        group = Group(
            question=question,
            completions=[Completion(text=t, token_ids=None, reward=r) for t, r in zip(wire.completions, rewards)],
            source=peer_id,
            round=record.round,
        )
        if not group.has_signal():
            verdict.rejected["zero_advantage"] += 1
            continue
        verdict.accepted.append(group)
    return verdict


def sample_groups(pool: Sequence[Group], want: int, rng: random.Random) -> list[Group]:
    """J groups uniformly without replacement from the verified pool (all of it if smaller)."""
    return rng.sample(list(pool), min(max(want, 0), len(pool)))


class PeerReputation:
    """Strikes for junk, a time-out for repeat offenders, trust for peers that gave good
    groups, and rejections counted per peer.

    A record holding any junk group is one strike; a clean record takes one away. At
    `strikes_to_ignore` strikes the peer is ignored for `ignore_seconds`, then starts again
    from zero. A clean record with at least one accepted group makes a peer trusted (until it
    sends junk): gathers fill most of their slots from trusted peers, so a flood of fresh
    identities (cheap to make) cannot crowd out peers that have proven useful. Memory is
    bounded (`max_peers`, least recently seen forgotten first).
    """

    def __init__(self, strikes_to_ignore: int = 3, ignore_seconds: float = 600.0,
                 clock: Callable[[], float] = time.monotonic, max_peers: int = 4096) -> None:
        self.strikes_to_ignore = strikes_to_ignore
        self.ignore_seconds = ignore_seconds
        self._clock = clock
        self._max_peers = max_peers
        self._strikes: OrderedDict[str, int] = OrderedDict()
        self._ignored_until: dict[str, float] = {}
        self._trusted: OrderedDict[str, None] = OrderedDict()
        self.rejections: OrderedDict[str, Counter] = OrderedDict()  # peer -> reason -> groups

    def is_ignored(self, peer_id: str) -> bool:
        until = self._ignored_until.get(peer_id)
        if until is None:
            return False
        if self._clock() >= until:
            del self._ignored_until[peer_id]
            return False
        return True

    def ignored(self) -> list[str]:
        return [p for p in list(self._ignored_until) if self.is_ignored(p)]

    def is_trusted(self, peer_id: str) -> bool:
        return peer_id in self._trusted

    def observe(self, peer_id: str, rejected: Counter, junk: bool, accepted: int = 0) -> bool:
        """Record one record's outcome; True if this peer has just been put on ignore."""
        self._trusted.pop(peer_id, None)
        if accepted > 0 and not junk:
            self._trusted[peer_id] = None
            while len(self._trusted) > self._max_peers:
                self._trusted.popitem(last=False)
        if rejected:
            counts = self.rejections.pop(peer_id, Counter())
            counts.update(rejected)
            self.rejections[peer_id] = counts
            while len(self.rejections) > self._max_peers:
                self.rejections.popitem(last=False)
        strikes = self._strikes.pop(peer_id, 0) + (1 if junk else -1)
        if strikes >= self.strikes_to_ignore:
            self._ignored_until[peer_id] = self._clock() + self.ignore_seconds
            return True
        if strikes > 0:
            self._strikes[peer_id] = strikes
            while len(self._strikes) > self._max_peers:
                self._strikes.popitem(last=False)
        return False
