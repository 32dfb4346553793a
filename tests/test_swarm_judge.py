"""What a fetched record costs or earns its peer (judge.py): a table of records against their
index entries, and no DHT. Questions are toy ones: question i asks for i + 1."""

from __future__ import annotations

import math
from collections import Counter
from pathlib import Path

import pytest

from sapo_core.rollouts import Question, QuestionId
from sapo_core.swarm.judge import judge_record, owned_payload
from sapo_core.swarm.records import IndexEntry, Record, WireGroup, encode_record
from sapo_core.swarm.verify import VerifyLimits

SWARM = "swarm-j"
PEER = "QmPeer"
ME = "QmMe"


class Toy:
    """A QuestionSource: question i asks for i + 1; 'Answer: <i + 1>' scores 1, anything else 0."""

    def regenerate(self, qid: QuestionId) -> Question:
        if qid.dataset != "toy":
            raise ValueError("unknown dataset")
        return Question(qid, f"What is {qid.index} + 1?", str(qid.index + 1))

    def score(self, question: Question, completions) -> list[float]:
        return [float(c == f"Answer: {question.answer}") for c in completions]


def wire(i: int, completions: tuple[str, ...], answer: str | None = None) -> WireGroup:
    qid = QuestionId("toy", "d", 1, i)
    return WireGroup(qid, f"What is {i} + 1?", answer or str(i + 1), completions, (True,) * len(completions))


def signal(i: int) -> WireGroup:  # one right, one wrong: rewards 1, 0
    return wire(i, (f"Answer: {i + 1}", "Answer: 0"))


def flat(i: int) -> WireGroup:  # both wrong: zero advantage
    return wire(i, ("Answer: 0", "no idea"))


def lie(i: int) -> WireGroup:  # a wrong answer claimed as the question's
    return wire(i, ("Answer: 99", "Answer: 0"), answer="99")


def payload(groups, round: int = 5, window: int = 10, peer: str = PEER, receipts=()) -> bytes:
    return encode_record(Record(SWARM, window, peer, round, tuple(groups), tuple(receipts)))


def idx(groups: int = 2, signal_groups: int = 2, round: int = 5) -> IndexEntry:
    return IndexEntry(SWARM, 10, 0, PEER, round, groups, signal_groups, 1000)


@pytest.mark.parametrize(
    "name, entry, sent, accepted, junk, useless, neutral, rejected",
    [
        ("clean", idx(), payload([signal(1), signal(2)]), 2, False, False, False, {}),
        ("ghost", idx(), None, 0, False, True, False, {"record_missing": 1}),
        ("not msgpack", idx(), b"\xc1junk", 0, True, False, False, {"malformed": 1}),
        ("another window", idx(), payload([signal(1)], window=9), 0, True, False, False, {"wrong_key": 1}),
        ("another peer", idx(), payload([signal(1)], peer="QmOther"), 0, True, False, False, {"wrong_key": 1}),
        ("older than its entry", idx(), payload([signal(1)], round=4), 0, False, True, False, {"wrong_round": 1}),
        # zero advantage only, as announced: neither a strike nor trust
        ("announced flat", idx(2, 0), payload([flat(1), flat(2)]), 0, False, False, True, {"zero_advantage": 2}),
        # zero advantage only, though signal was promised: half a strike
        (
            "promised signal",
            idx(2, 2),
            payload([flat(1), flat(2)]),
            0,
            False,
            True,
            False,
            {"zero_advantage": 2, "no_signal": 1},
        ),
        # 1 group with signal, 5 promised: 5 > 2 x 1 + 2, the entry lied
        (
            "index lied",
            idx(2, 5),
            payload([signal(1), flat(2)]),
            1,
            False,
            True,
            False,
            {"zero_advantage": 1, "index_lied": 1},
        ),
        ("index generous", idx(2, 4), payload([signal(1), flat(2)]), 1, False, False, False, {"zero_advantage": 1}),
        ("wrong answer", idx(), payload([signal(1), lie(2)]), 1, True, False, False, {"answer_mismatch": 1}),
        (
            "unknown task",
            idx(),
            payload([WireGroup(QuestionId("nope", "d", 1, 1), "q", "a", ("x", "y"), (True, True))]),
            0,
            False,
            True,
            False,
            {"unknown_task": 1, "no_signal": 1},
        ),
    ],
)
def test_what_a_record_costs_its_peer(name, entry, sent, accepted, junk, useless, neutral, rejected):
    verdict = judge_record(entry, sent, Toy(), SWARM, ME)
    assert len(verdict.accepted) == accepted, name
    assert (verdict.junk, verdict.useless, verdict.neutral) == (junk, useless, neutral), name
    assert dict(verdict.rejected) == rejected, name
    assert all(g.source == PEER and g.round == entry.round for g in verdict.accepted)
    assert all(len(set(g.rewards)) > 1 for g in verdict.accepted)  # zero-advantage groups never accepted


def test_figures_of_a_record():
    sent = payload([signal(1), flat(2), wire(3, ("Answer: 4", "Answer: 4", "Answer: 0"))])
    verdict = judge_record(idx(3, 2), sent, Toy(), SWARM, ME)
    f = verdict.figures
    assert (f["records"], f["bytes_in"], f["received"], f["duplicates_collapsed"]) == (1, len(sent), 3, 1)
    assert f["verify_cpu_s"] >= 0 and "records_missing" not in f
    assert judge_record(idx(), None, Toy(), SWARM, ME).figures == Counter({"records_missing": 1})
    neutral = judge_record(idx(1, 0), payload([flat(1)]), Toy(), SWARM, ME)
    assert neutral.figures["records_without_signal"] == 1


def test_receipts_naming_us_are_kept_unless_the_record_is_junk():
    receipts = [(ME, 3, 0), ("QmSomeoneElse", 3, 1), (ME, 4, 2)]
    clean = judge_record(idx(), payload([signal(1)], receipts=receipts), Toy(), SWARM, ME)
    assert clean.receipts == [(PEER, 3, 0), (PEER, 4, 2)]  # (receipting peer, our round, our group)
    junk = judge_record(idx(), payload([lie(1)], receipts=receipts), Toy(), SWARM, ME)
    assert junk.junk and junk.receipts == []
    flat_only = judge_record(idx(1, 0), payload([flat(1)], receipts=receipts), Toy(), SWARM, ME)
    assert flat_only.neutral and len(flat_only.receipts) == 2  # what such records are read for


def test_a_record_we_had_no_time_for_is_not_its_peers_fault():
    late = VerifyLimits(deadline=-math.inf)  # the gather's time is up before the first group
    verdict = judge_record(idx(2, 5), payload([signal(1), signal(2)]), Toy(), SWARM, ME, late)
    assert verdict.rejected == Counter({"over_deadline": 2})
    assert not (verdict.junk or verdict.useless or verdict.neutral)  # no no_signal, no index_lied


def test_only_the_peers_own_value_is_its_record():
    from cryptography.hazmat.primitives.asymmetric import rsa

    from sapo_core.swarm.identity import NodeIdentity
    from sapo_core.swarm.validation import owner_tag

    def identity() -> NodeIdentity:
        return NodeIdentity.from_key(Path("-"), rsa.generate_private_key(public_exponent=65537, key_size=2048))

    peer, other = identity(), identity()

    def tag(i: NodeIdentity) -> bytes:
        return owner_tag(i.hivemind_key().get_public_key().to_bytes())

    values = {tag(other): (b"theirs", 1.0), tag(peer): (b"mine", 1.0)}
    assert owned_payload(values, peer.peer_id) == b"mine"
    assert owned_payload({tag(other): (b"theirs", 1.0)}, peer.peer_id) is None
    for hostile in (None, "junk", {tag(peer): None}, {tag(peer): ("text", 1.0)}, {None: (b"x", 1.0)}):
        assert owned_payload(hostile, peer.peer_id) is None
