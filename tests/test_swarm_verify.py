"""Verification on receipt (verify.py) with the real TaskSet: what passes, what is refused, why."""

from __future__ import annotations

import dataclasses
import random
from collections import Counter

import pytest

from sapo_core.config import TaskConfig
from sapo_core.rollouts import Completion, Group, QuestionId
from sapo_core.swarm.records import Record, WireGroup
from sapo_core.swarm.selection import sample_groups
from sapo_core.swarm.verify import (
    JUNK_REASONS,
    CompletionCutter,
    PeerReputation,
    VerifyLimits,
    verify_record,
)
from sapo_core.tasks import TaskSet

PEER = "QmPeer"


@pytest.fixture(scope="module")
def tasks() -> TaskSet:
    return TaskSet(TaskConfig(), seed=5)


@pytest.fixture(scope="module")
def question(tasks):
    return tasks.sample_questions(0, 1)[0]


def _wire(question, completions, **over) -> WireGroup:
    wire = WireGroup(question.id, question.text, question.answer, tuple(completions), (True,) * len(completions))
    return dataclasses.replace(wire, **over)


def _record(*groups, peer: str = PEER) -> Record:
    return Record("s", 1, peer, 7, tuple(groups))


def test_honest_group_is_accepted_and_rescored_by_us(tasks, question):
    texts = [f"Answer: {question.answer}", "Answer: -12345", f"The answer is {question.answer}", "no idea"]
    verdict = verify_record(_record(_wire(question, texts)), tasks, PEER)
    assert not verdict.rejected
    (group,) = verdict.accepted
    assert group.rewards == tasks.score(question, texts)
    assert group.rewards[0] == 1.0 and group.rewards[1] == 0.0
    assert group.source == PEER and group.round == 7 and not group.is_local
    assert all(c.token_ids is None and c.sample_logprobs is None for c in group.completions)
    assert group.question.answer == question.answer  # regenerated, not the sender's


@pytest.mark.parametrize(
    "change, reason",
    [
        ({"answer": "41"}, "answer_mismatch"),
        ({"text": "What is 2 + 2? (the answer is 5)"}, "text_mismatch"),
        ({"question_id": QuestionId("no_such_task", "abcd", 1, 1)}, "unknown_task"),
        ({"question_id": "config"}, "unknown_config"),
        ({"question_id": "index"}, "bad_index"),
    ],
)
def test_tampered_or_unknown_questions_are_refused(tasks, question, change, reason):
    if change.get("question_id") == "config":
        change = {"question_id": dataclasses.replace(question.id, config_digest="0" * 16)}
    elif change.get("question_id") == "index":
        change = {"question_id": dataclasses.replace(question.id, index=-1)}
    wire = _wire(question, [f"Answer: {question.answer}", "Answer: -12345"], **change)
    verdict = verify_record(_record(wire), tasks, PEER)
    assert verdict.accepted == []
    assert verdict.rejected == Counter({reason: 1})
    assert verdict.junk == (reason in JUNK_REASONS)


def test_a_wrong_answer_cannot_poison_the_scores(tasks, question):
    """rl-swarm scored peers' completions against the peer's answer; here a peer claiming its
    wrong completions are right gets the group refused, and the same completions sent with the
    true answer score 0 (the group then has no signal and is dropped)."""
    wrong = ["Answer: -12345", "Answer: -12345.", "The answer is -12345", "answer = -12345"]
    verdict = verify_record(_record(_wire(question, wrong, answer="-12345")), tasks, PEER)
    assert verdict.rejected == Counter({"answer_mismatch": 1})
    verdict = verify_record(_record(_wire(question, wrong)), tasks, PEER)
    assert verdict.rejected == Counter({"zero_advantage": 1}) and not verdict.junk


def test_record_in_another_peers_name_is_refused(tasks, question):
    wire = _wire(question, [f"Answer: {question.answer}", "x"])
    verdict = verify_record(_record(wire, wire, peer="QmSomeoneElse"), tasks, PEER)
    assert verdict.accepted == [] and verdict.rejected == Counter({"wrong_peer": 2})


def test_mixed_record_keeps_the_good_groups(tasks, question):
    good = _wire(question, [f"Answer: {question.answer}", "x"])
    bad = _wire(question, ["a", "b"], answer="nope")
    flat = _wire(question, ["x", "y"])
    verdict = verify_record(_record(good, bad, flat, good), tasks, PEER)
    assert len(verdict.accepted) == 2
    assert verdict.rejected == Counter({"answer_mismatch": 1, "zero_advantage": 1})
    assert verdict.junk


def test_scorer_failure_is_a_refusal_not_a_crash(question):
    class Broken:
        def regenerate(self, qid):
            return question

        def score(self, q, completions):
            raise RuntimeError("scorer blew up")

    verdict = verify_record(_record(_wire(question, ["a", "b"])), Broken(), PEER)
    assert verdict.rejected == Counter({"bad_score": 1})


def test_sample_groups_is_uniform_without_replacement(question):
    pool = [Group(question, [Completion("a", reward=0), Completion("b", reward=1)], source=f"p{i}") for i in range(10)]
    rng = random.Random(0)
    assert len({id(g) for g in sample_groups(pool, 4, rng)}) == 4
    assert len(sample_groups(pool, 40, rng)) == 10
    assert sample_groups(pool, 0, rng) == []
    counts = Counter(g.source for _ in range(3000) for g in sample_groups(pool, 2, rng))
    assert min(counts.values()) > 0.8 * 600 and max(counts.values()) < 1.2 * 600


class FakeClock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def test_repeat_junk_gets_a_peer_ignored_for_a_while():
    clock = FakeClock()
    rep = PeerReputation(strikes_to_ignore=3, ignore_seconds=60, clock=clock)
    junk = Counter({"answer_mismatch": 2})
    assert not rep.observe("bad", junk, True)
    assert not rep.observe("bad", junk, True)
    assert rep.observe("bad", junk, True)
    assert rep.is_ignored("bad") and rep.ignored() == ["bad"]
    assert rep.rejections["bad"] == Counter({"answer_mismatch": 6})
    clock.t = 61
    assert not rep.is_ignored("bad")
    assert not rep.observe("bad", junk, True)  # starts again from zero strikes


def test_clean_records_work_strikes_off_and_honest_rejections_never_strike():
    rep = PeerReputation(strikes_to_ignore=2, ignore_seconds=60, clock=FakeClock())
    assert not rep.observe("p", Counter({"text_mismatch": 1}), True)
    assert not rep.observe("p", Counter(), False)  # a clean record takes the strike away
    assert not rep.observe("p", Counter({"text_mismatch": 1}), True)
    for _ in range(10):
        assert not rep.observe("honest", Counter({"zero_advantage": 4, "unknown_config": 1}), False)
    assert not rep.is_ignored("p") and not rep.is_ignored("honest")


def test_reputation_memory_is_bounded():
    rep = PeerReputation(strikes_to_ignore=5, clock=FakeClock(), max_peers=100)
    for i in range(1000):
        rep.observe(f"sybil{i}", Counter({"malformed": 1}), True)
    assert len(rep.rejections) == 100 and len(rep._strikes) <= 100


def test_trust_comes_from_good_groups_and_goes_with_junk():
    rep = PeerReputation(clock=FakeClock())
    assert not rep.is_trusted("p")
    rep.observe("p", Counter({"zero_advantage": 3}), False, accepted=0)
    assert not rep.is_trusted("p")
    rep.observe("p", Counter({"zero_advantage": 1}), False, accepted=2)
    assert rep.is_trusted("p")
    rep.observe("p", Counter({"answer_mismatch": 1}), True, accepted=1)
    assert not rep.is_trusted("p")


# --- duplicates, cutting to our limit, CPU budget, the per-peer quota ----------------------


def test_copies_of_one_completion_are_one_completion(tasks, question):
    """G = 64 copies of one completion (and one wrong) used to be accepted as a 65-member group."""
    right = f"Answer: {question.answer}"
    verdict = verify_record(_record(_wire(question, [right] * 63 + ["Answer: -1"])), tasks, PEER)
    (group,) = verdict.accepted
    assert [c.text for c in group.completions] == [right, "Answer: -1"] and verdict.duplicates == 62
    verdict = verify_record(_record(_wire(question, [right] * 64)), tasks, PEER)
    assert verdict.accepted == [] and verdict.rejected == Counter({"duplicates": 1}) and not verdict.junk


def test_completions_are_scored_as_cut_to_our_limit(tasks, question):
    """A garbage preamble longer than our max_new_tokens followed by the right answer is scored
    on what we would train (the garbage alone), and it is not 'finished' any more."""
    words = {}

    def encode(text):
        out = []
        for w in text.split(" "):
            words.setdefault(w, len(words))
            out.append(words[w])
        return out

    def decode(ids):
        inverse = {v: k for k, v in words.items()}
        return " ".join(inverse[i] for i in ids)

    cutter = CompletionCutter(encode, decode, max_tokens=8, max_chars_per_token=16)
    poisoned = "junk " * 40 + f"Answer: {question.answer}"
    short = f"Answer: {question.answer}"
    wire = _wire(question, [poisoned, short, "Answer: -1"])
    verdict = verify_record(_record(wire), tasks, PEER, VerifyLimits(cutter=cutter))
    (group,) = verdict.accepted
    cut, ok, wrong = group.completions
    assert cut.text == " ".join(["junk"] * 8) and cut.reward == 0.0 and not cut.finished
    assert len(cut.token_ids) == 8 and cut.token_ids == encode(cut.text)
    assert ok.reward == 1.0 and ok.finished and ok.token_ids == encode(short)
    assert verdict.cut == 1


def test_an_unfinished_completion_stays_unfinished(tasks, question):
    wire = WireGroup(
        question.id, question.text, question.answer, (f"Answer: {question.answer}", "Answer: -1"), (False, True)
    )
    (group,) = verify_record(_record(wire), tasks, PEER).accepted
    assert [c.finished for c in group.completions] == [False, True]


def test_a_record_over_its_cpu_budget_is_junk_and_the_deadline_stops_verifying(tasks, question):
    ticks = iter(range(1000))
    good = _wire(question, [f"Answer: {question.answer}", "x"])
    verdict = verify_record(
        _record(*[good] * 5), tasks, PEER, VerifyLimits(cpu_seconds=2.5), cpu_clock=lambda: float(next(ticks))
    )
    assert len(verdict.accepted) == 2 and verdict.rejected == Counter({"cpu_budget": 3}) and verdict.junk
    verdict = verify_record(_record(*[good] * 5), tasks, PEER, VerifyLimits(deadline=0.0), wall_clock=lambda: 1.0)
    assert verdict.accepted == [] and verdict.rejected == Counter({"over_deadline": 5}) and not verdict.junk


def test_no_peer_supplies_more_than_half_while_others_are_left(question):
    def group(peer):
        return Group(question, [Completion("a", reward=0), Completion("b", reward=1)], source=peer)

    pool = [group("flooder") for _ in range(60)] + [group("p1"), group("p2")]
    rng = random.Random(1)
    for want in (2, 4, 5):
        got = Counter(g.source for g in sample_groups(pool, want, rng))
        assert got["flooder"] <= -(-want // 2) and got["p1"] + got["p2"] == min(2, want - got["flooder"])
    assert Counter(g.source for g in sample_groups(pool[:60], 4, rng)) == {"flooder": 4}  # no one else: fill


def test_a_neutral_record_changes_neither_trust_nor_strikes():
    rep = PeerReputation(strikes_to_ignore=3, ignore_seconds=60, clock=FakeClock())
    rep.observe("p", Counter(), False, accepted=2)  # a good record: trusted
    rep.observe("q", Counter({"record_missing": 1}), False, useless=True)  # half a strike
    for _ in range(10):
        for peer in ("p", "q"):
            assert not rep.observe(peer, Counter({"zero_advantage": 2}), False, neutral=True)
    assert rep.is_trusted("p") and not rep.is_suspect("p") and rep.is_suspect("q") and not rep.is_ignored("q")
    assert rep.rejections["p"]["zero_advantage"] == 20
    assert rep.observe("q", Counter({"bad": 1}), True, neutral=True) is False and rep.is_suspect("q")  # junk counts


def test_useless_records_cost_light_strikes():
    rep = PeerReputation(strikes_to_ignore=3, ignore_seconds=60, clock=FakeClock())
    for _i in range(5):
        assert not rep.observe("ghost", Counter({"record_missing": 1}), False, useless=True)
        assert rep.is_suspect("ghost")
    assert rep.observe("ghost", Counter({"record_missing": 1}), False, useless=True)  # 6 x 0.5 = 3
    assert rep.rejections["ghost"]["record_missing"] == 6


def test_keep_flat_right_accepts_all_right_groups_only(tasks, question):
    """swarm.take = mixed: a veteran's all-right group stays (we adopt its question); an all-wrong
    one is still refused, and a peer claiming its wrong answers right gets nothing: our re-scoring
    decides, so its flat group of wrong answers is zero_advantage either way."""
    limits = VerifyLimits(keep_flat_right=True)
    right = [f"Answer: {question.answer}", f"The answer is {question.answer}."]
    wrong = ["Answer: -12345", "answer = -12345"]
    verdict = verify_record(_record(_wire(question, right), _wire(question, wrong)), tasks, PEER, limits)
    assert [[c.reward for c in g.completions] for g in verdict.accepted] == [[1.0, 1.0]]
    assert verdict.rejected == Counter({"zero_advantage": 1})
    assert verify_record(_record(_wire(question, right)), tasks, PEER).rejected == Counter({"zero_advantage": 1})
