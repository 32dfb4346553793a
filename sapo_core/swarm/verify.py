"""Peers' groups are verified, not believed: regenerate, compare, cut, collapse, re-score, filter.

For every group of a decoded peer record (records.py has already checked its shape):

1. regenerate the question and its answer from the id alone (`TaskSet.regenerate`): an
   unknown dataset, config or index is rejected (`unknown_task`, `unknown_config`,
   `bad_index`);
2. the sender's question text and answer must equal ours (`text_mismatch`,
   `answer_mismatch`): a peer cannot teach us a wrong answer or swap the question;
3. every completion is cut to what we would train: re-tokenised with our
   tokenizer and cut to our `max_new_tokens`; the cut text is what gets scored and its token
   ids travel with it, so the update sees exactly what was scored. A completion counts as
   finished (our stop token appended when trained) only if the sender says so and we did not
   cut it;
4. identical completions collapse into one (`Verdict.duplicates` counts the copies): 64 copies
   of one answer are one completion, not a group;
5. the rest is re-scored with *our* reward functions; the sender's rewards are never sent;
6. groups with fewer than two distinct completions (`duplicates`) or whose rewards are all
   equal (`zero_advantage`, the SAPO paper's filter, §4) are dropped; with
   `VerifyLimits.keep_flat_right` (swarm.take = mixed) an all-equal group whose completions are
   right stays: the node adopts its question and may learn from the right answer (adopt.py);
7. the sender's sampling log-probs, where it sent them (records.py), must be plausible: each a
   finite log-prob not below -LOGPROB_BOUND, no more of them than the completion's text has
   bytes (+1) (`bad_logprobs`, junk: an honest sampler cannot produce them). They ride on a
   completion only where they line up with our tokens (the same count as our tokenizer gives
   for the whole text): `Completion.sample_logprobs`, cut with the text, which the update's
   truncated importance sampling reads (trainer.py). Where they do not line up (another
   tokenizer, or a sampled token sequence that our tokenizer splits otherwise when it re-encodes
   the text, ~1 % of a same-model swarm's completions: `Verdict.unaligned` counts it) their sum
   is still the sender's log-prob of the whole text: spread evenly over our tokens
   (`Completion.logprobs_spread`), it gives the update a sequence-level ratio; a text we cut has
   no such sum and trains uncorrected.

Verification is bounded (`VerifyLimits`): a record may use `cpu_seconds` of this thread's CPU
(exceeding it rejects the rest as `cpu_budget`, which is junk: a strike), and nothing is
verified after `deadline` (the gather's; the rest is `over_deadline`, not the peer's fault).
Extraction in rewards.py is linear-time, so one completion's scoring is bounded too.

Accepted groups carry the peer id as `source`, the producer's round and group index, our
token ids and our rewards. Every rejection is counted by reason and by peer; a peer whose
records keep holding junk or nothing useful is ignored for a while (`PeerReputation`). Pure:
no network, no clock except the ones passed in, nothing raised for any peer input.

Departure from the reference code (rl-swarm): it scored external completions against the
sender's answer with the sender's choice of scorer, so any peer could teach any answer by
sending it with a scorer that accepts it (docs/swarm.md, 'What is checked, and where').
"""

from __future__ import annotations

import math
import time
from collections import Counter, OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from sapo_core.rollouts import Completion, Group, Question, QuestionId
from sapo_core.swarm.records import LOGPROB_BOUND, MAX_TEXT_CHARS, Record

# Reasons that only a broken or hostile peer produces; honest peers can produce the others
# (a zero-advantage group, a task or difficulty level we do not run).
JUNK_REASONS = frozenset(
    {
        "malformed",
        "oversized",
        "wrong_version",
        "wrong_swarm",
        "wrong_key",
        "wrong_owner",
        "wrong_peer",
        "text_mismatch",
        "answer_mismatch",
        "bad_index",
        "bad_score",
        "cpu_budget",
        "verify_error",
        "bad_logprobs",
    }
)
# Reasons that cost a light strike: useless rather than hostile, but what a flood is made of
# (docs/swarm.md, 'Hostile peers': ghosts whose records are missing, zero-advantage-only records,
# index entries that lie about the record they name).
USELESS_REASONS = frozenset({"record_missing", "no_signal", "index_lied", "wrong_round", "unlikely"})
LIGHT_STRIKE = 0.5


class QuestionSource(Protocol):
    """The part of `sapo_core.tasks.TaskSet` verification uses."""

    def regenerate(self, qid: QuestionId) -> Question: ...

    def score(self, question: Question, completions: Sequence[str]) -> list[float]: ...


class CachedQuestions:
    """A `QuestionSource` with regenerated questions remembered: a record repeating one
    question (64 copies of a slow bf item) costs one regeneration. Failures are remembered too."""

    def __init__(self, tasks: QuestionSource, size: int = 512) -> None:
        self._tasks = tasks
        self._size = size
        self._cache: OrderedDict[Any, Any] = OrderedDict()  # qid -> Question or the exception

    def regenerate(self, qid: Any) -> Any:
        hit = self._cache.get(qid)
        if hit is None:
            try:
                hit = self._tasks.regenerate(qid)
            except Exception as e:
                hit = e
            self._cache[qid] = hit
            while len(self._cache) > self._size:
                self._cache.popitem(last=False)
        if isinstance(hit, Exception):
            raise hit.with_traceback(None)
        return hit

    def score(self, question: Any, completions: Sequence[str]) -> list[float]:
        return self._tasks.score(question, completions)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._tasks, name)


@dataclass(frozen=True)
class CompletionCutter:
    """Our tokenizer and limit: `cut(text) -> (token ids, the text they decode to, was cut)`.

    `max_chars` (derived from the tokenizer's longest token) bounds what is tokenised at all:
    no text longer than max_tokens tokens of max_chars_per_token characters can fit."""

    encode: Callable[[str], list[int]]
    decode: Callable[[list[int]], str]
    max_tokens: int
    max_chars_per_token: int = 64

    @classmethod
    def for_tokenizer(cls, tokenizer, max_tokens: int) -> CompletionCutter:
        """Cutting with a transformers tokenizer as `Policy` encodes peers' text (no special
        tokens). A vocabulary entry is at least as long as the text it decodes to (byte-level
        BPE), so the longest bounds the characters per token."""
        longest = max((len(t) for t in tokenizer.get_vocab()), default=64)
        return cls(
            lambda text: list(tokenizer(text, add_special_tokens=False)["input_ids"]),
            lambda ids: tokenizer.decode(ids, skip_special_tokens=True),
            max_tokens,
            max(1, longest),
        )

    def cut(self, text: str) -> tuple[list[int], str, bool]:
        ids, text, was_cut, _ = self.cut_counted(text)
        return ids, text, was_cut

    def cut_counted(self, text: str) -> tuple[list[int], str, bool, int]:
        """`cut`, and how many tokens the whole text has (-1: too long to have tokenised it all)."""
        limit = self.max_tokens * self.max_chars_per_token + 256
        ids = self.encode(text[:limit])
        whole = len(ids) if len(text) <= limit else -1
        if len(ids) <= self.max_tokens and len(text) <= limit:
            return ids, text, False, whole
        ids = ids[: self.max_tokens]
        return ids, self.decode(ids), True, whole


@dataclass(frozen=True)
class VerifyLimits:
    cutter: CompletionCutter | None = None  # None: completions are scored whole (tests, tools)
    cpu_seconds: float = math.inf  # per record, of this thread's CPU time
    deadline: float = math.inf  # time.perf_counter() after which nothing more is verified
    keep_flat_right: bool = False  # accept all-equal groups of right completions (swarm.take = mixed)


@dataclass
class Verdict:
    accepted: list[Group] = field(default_factory=list)
    rejected: Counter = field(default_factory=Counter)  # reason -> groups
    duplicates: int = 0  # completions collapsed into an identical one
    cut: int = 0  # completions cut to our max_new_tokens
    unaligned: int = 0  # completions whose sender's log-probs do not line up with our tokens
    cpu_seconds: float = 0.0

    @property
    def junk(self) -> bool:
        return any(r in JUNK_REASONS for r in self.rejected)


def verify_record(
    record: Record,
    tasks: QuestionSource,
    peer_id: str,
    limits: VerifyLimits = VerifyLimits(),
    cpu_clock: Callable[[], float] = time.thread_time,
    wall_clock: Callable[[], float] = time.perf_counter,
) -> Verdict:
    """Check every group of one peer's record; never raises for anything the peer sent."""
    verdict = Verdict()
    if record.peer_id != peer_id:
        verdict.rejected["wrong_peer"] += max(1, len(record.groups))
        return verdict
    started = cpu_clock()
    for i, wire in enumerate(record.groups):
        if wall_clock() > limits.deadline:
            verdict.rejected["over_deadline"] += len(record.groups) - i
            break
        if cpu_clock() - started > limits.cpu_seconds:
            verdict.rejected["cpu_budget"] += len(record.groups) - i
            break
        reason, group = _verify_group(wire, i, record, tasks, peer_id, limits, verdict)
        if reason is not None:
            verdict.rejected[reason] += 1
        elif group is not None:
            verdict.accepted.append(group)
    verdict.cpu_seconds = cpu_clock() - started
    return verdict


def _verify_group(
    wire, index: int, record: Record, tasks: QuestionSource, peer_id: str, limits: VerifyLimits, verdict: Verdict
) -> tuple[str | None, Group | None]:
    try:
        question = tasks.regenerate(wire.question_id)
    except ValueError as e:  # tasks.UnknownQuestion is a ValueError carrying .reason
        return str(getattr(e, "reason", "unknown_task")), None
    except Exception:  # a dataset generator failing on a peer's id is that id's problem
        return "bad_index", None
    if wire.text != question.text:
        return "text_mismatch", None
    if wire.answer != question.answer:
        return "answer_mismatch", None
    if wire.logprobs is not None and not all(map(logprobs_plausible, wire.completions, wire.logprobs)):
        return "bad_logprobs", None
    completions: list[Completion] = []
    seen: set[str] = set()
    sent_lps = wire.logprobs if wire.logprobs is not None else (None,) * len(wire.completions)
    for text, finished, lps in zip(wire.completions, wire.finished, sent_lps):
        ids: list[int] | None = None
        whole = -1
        was_cut = len(text) > MAX_TEXT_CHARS  # records.py bounds it already; kept for direct callers
        if limits.cutter is not None:
            ids, text, was_cut, whole = limits.cutter.cut_counted(text)
        elif was_cut:
            text = text[:MAX_TEXT_CHARS]
        verdict.cut += was_cut
        if text in seen:
            verdict.duplicates += 1
            continue
        seen.add(text)
        aligned, spread = None, False
        if lps is not None and ids is not None:
            if whole == len(lps):
                aligned = list(lps[: len(ids)])
            else:
                verdict.unaligned += 1
                if not was_cut and ids:  # the whole text's log-prob, spread over our tokens
                    aligned, spread = [math.fsum(lps) / len(ids)] * len(ids), True
        completions.append(
            Completion(
                text=text,
                token_ids=ids,
                sample_logprobs=aligned,
                finished=bool(finished) and not was_cut,
                logprobs_spread=spread,
            )
        )
    if len(completions) < 2:
        return "duplicates", None
    try:
        rewards = [float(r) for r in tasks.score(question, [c.text for c in completions])]
    except Exception:
        rewards = []
    if len(rewards) != len(completions) or not all(math.isfinite(r) for r in rewards):
        return "bad_score", None
    for c, r in zip(completions, rewards):
        c.reward = r
    group = Group(question=question, completions=completions, source=peer_id, round=record.round, index=index)
    if not group.has_signal() and not (limits.keep_flat_right and rewards[0] >= 1.0):
        return "zero_advantage", None
    return None, group


def logprobs_plausible(text: str, logprobs: Sequence[float]) -> bool:
    """Whether a sender's log-probs for `text` could have come from an honest sampler (step 7)."""
    if len(logprobs) > len(text.encode("utf-8", "surrogatepass")) + 1:
        return False
    return all(math.isfinite(x) and -LOGPROB_BOUND <= x <= 0.0 for x in logprobs)


def likelihood_score(logprobs: Sequence[float], window: int) -> float:
    """The lowest mean log-likelihood per token over any `window` consecutive tokens of a
    completion (its whole mean when shorter; NaN when empty). A window, not the whole mean: a
    link injected into an otherwise ordinary completion is diluted in the mean, not in the
    window that holds it. Linear time."""
    n = len(logprobs)
    if n == 0:
        return math.nan
    if n <= window:
        return math.fsum(logprobs) / n
    total = math.fsum(logprobs[:window])
    worst = total
    for i in range(window, n):
        total += logprobs[i] - logprobs[i - window]
        worst = min(worst, total)
    return worst / window


class PeerReputation:
    """Strikes for junk and for uselessness, a time-out for repeat offenders, trust for peers
    that gave good groups, and rejections counted per peer.

    A record holding any junk group is one strike; a useless one (its record missing, nothing
    with signal in it, an index entry that lied about it, groups under our likelihood floor:
    `USELESS_REASONS`) half a strike; any other record takes one away. At
    `strikes_to_ignore` strikes the peer is ignored for `ignore_seconds`, then starts again
    from zero. A clean record with at least one accepted group makes a peer trusted (until it
    sends junk or nothing useful): gathers read trusted peers' index shards first and fill most
    of their slots from them, so a flood of fresh identities (cheap to make) cannot crowd out
    peers that have proven useful. Memory is bounded (`max_peers`, least recently seen
    forgotten first).
    """

    def __init__(
        self,
        strikes_to_ignore: int = 3,
        ignore_seconds: float = 600.0,
        clock: Callable[[], float] = time.monotonic,
        max_peers: int = 4096,
    ) -> None:
        self.strikes_to_ignore = strikes_to_ignore
        self.ignore_seconds = ignore_seconds
        self._clock = clock
        self._max_peers = max_peers
        self._strikes: OrderedDict[str, float] = OrderedDict()
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

    def trusted(self) -> list[str]:
        return list(self._trusted)

    def struck(self) -> list[str]:
        """Peers with strikes not yet forgiven (ignored ones may have none left)."""
        return list(self._strikes)

    def is_suspect(self, peer_id: str) -> bool:
        """Struck and not yet forgiven: it does not count as a peer worth having found."""
        return self._strikes.get(peer_id, 0.0) > 0 or self.is_ignored(peer_id)

    def count(self, peer_id: str, rejected: Counter) -> None:
        """Count rejections against a peer without judging it (e.g. groups dropped later)."""
        if not rejected:
            return
        counts = self.rejections.pop(peer_id, Counter())
        counts.update(rejected)
        self.rejections[peer_id] = counts
        while len(self.rejections) > self._max_peers:
            self.rejections.popitem(last=False)

    def observe(
        self,
        peer_id: str,
        rejected: Counter,
        junk: bool,
        accepted: int = 0,
        useless: bool = False,
        neutral: bool = False,
    ) -> bool:
        """Record one record's outcome; True if this peer has just been put on ignore. `neutral`
        (not junk: nothing to train, as announced): its rejections are counted, nothing else
        changes (trust, strikes)."""
        if neutral and not junk:
            self.count(peer_id, rejected)
            return False
        self._trusted.pop(peer_id, None)
        if accepted > 0 and not junk and not useless:
            self._trusted[peer_id] = None
            while len(self._trusted) > self._max_peers:
                self._trusted.popitem(last=False)
        self.count(peer_id, rejected)
        change = 1.0 if junk else LIGHT_STRIKE if useless else -1.0
        strikes = self._strikes.pop(peer_id, 0.0) + change
        if strikes >= self.strikes_to_ignore:
            self._ignored_until[peer_id] = self._clock() + self.ignore_seconds
            return True
        if strikes > 0:
            self._strikes[peer_id] = strikes
            while len(self._strikes) > self._max_peers:
                self._strikes.popitem(last=False)
        return False

    def strike(self, peer_id: str, reason: str, n: int = 1) -> bool:
        """A light strike found after verification (e.g. `unlikely` groups): counted, and the
        peer loses its trust. True if it has just been put on ignore."""
        return self.observe(peer_id, Counter({reason: n}), junk=reason in JUNK_REASONS, useless=True)
