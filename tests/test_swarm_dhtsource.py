"""The DHT rollout source (dhtsource.py) end to end over an in-memory DHT: publish, read the
index, fetch, judge, choose. No network: `MemoryDHT` is the part of `SwarmDHT` the source uses,
over one dict that the test's nodes share; the real DHT is tests/test_swarm.py's."""

from __future__ import annotations

import math
import random
from collections import Counter
from pathlib import Path

import pytest

from sapo_core.config import SwarmConfig
from sapo_core.rollouts import Completion, Group, Question, QuestionId
from sapo_core.swarm.dhtsource import DhtRolloutSource
from sapo_core.swarm.keys import KeySpace
from sapo_core.swarm.records import IndexEntry, encode_index
from sapo_core.swarm.selection import Wanted

NOW = 100_000.0  # DHT time, fixed


class Toy:
    """A QuestionSource: question i asks for i + 1; 'Answer: <i + 1>' scores 1, anything else 0."""

    def regenerate(self, qid: QuestionId) -> Question:
        return Question(qid, f"What is {qid.index} + 1?", str(qid.index + 1))

    def score(self, question: Question, completions) -> list[float]:
        return [float(c == f"Answer: {question.answer}") for c in completions]


class MemoryDHT:
    """`SwarmDHT`'s surface over a shared dict: key -> {owner subkey: (payload, expiration)}."""

    def __init__(self, keyspace: KeySpace, identity, table: dict, live=()) -> None:
        from sapo_core.swarm.validation import ReasonCounter, owner_tag

        self.keyspace = keyspace
        self.table = table
        self.live = set(live)
        self.subkey = owner_tag(identity.hivemind_key().get_public_key().to_bytes())
        self.dht_rejections = ReasonCounter()
        self.visible_maddrs: list[str] = []
        self.reads: list[list[str]] = []

    def store_periodically(self, interval, make_items) -> None:
        self.republish = make_items

    def store(self, items, timeout: float) -> dict[str, bool]:
        for key, payload, expiration in items:
            self.table.setdefault(key, {})[self.subkey] = (payload, expiration)
        return {key: True for key, _, _ in items}

    def get_many(self, keys, timeout: float, newer_than=None, beam_size=None) -> dict:
        self.reads.append(list(keys))
        return {k: dict(self.table[k]) for k in keys if k in self.table}

    def num_peers(self) -> int:
        return len(self.live)

    def routing_peer_ids(self) -> set[str]:
        return set(self.live)

    def figures(self) -> dict[str, float]:
        return {}

    def best_maddr(self) -> str:
        return ""

    def close(self) -> None:
        return None


def identity():
    from cryptography.hazmat.primitives.asymmetric import rsa

    from sapo_core.swarm.identity import NodeIdentity

    return NodeIdentity.from_key(Path("-"), rsa.generate_private_key(public_exponent=65537, key_size=2048))


def groups(first: int, n: int, with_signal: bool = True) -> list[Group]:
    out = []
    for i in range(first, first + n):
        q = Question(QuestionId("toy", "d", 1, i), f"What is {i} + 1?", str(i + 1))
        right = 1.0 if with_signal else 0.0
        out.append(
            Group(q, [Completion(f"Answer: {i + 1}" if with_signal else "x", reward=right), Completion("Answer: 0")])
        )
    return out


class Recording:
    """A GroupChoice that takes the first `wanted.groups` candidates and remembers its calls."""

    def __init__(self) -> None:
        self.calls: list[tuple[list[Group], Wanted]] = []

    def __call__(self, candidates, wanted, rng) -> list[Group]:
        self.calls.append((list(candidates), wanted))
        return list(candidates[: wanted.groups])


@pytest.fixture(scope="module")
def ids():
    return [identity() for _ in range(3)]


class Clock:
    """DHT time, set by the test."""

    def __init__(self) -> None:
        self.now = NOW

    def __call__(self) -> float:
        return self.now


def _swarm(ids, choice=None, live_publishers: bool = True):
    """Publishers a and b and a reader, over one table; the DHT nodes the reader knows are a and
    b's (`live_publishers`) or none (then the reader reads every shard)."""
    cfg = SwarmConfig(swarm_name="mem", shards=4)
    ks = KeySpace(cfg.swarm_name, cfg.window_seconds, cfg.shards)
    table: dict = {}
    clock = Clock()
    live = {i.peer_id for i in ids[:2]} if live_publishers else set()
    a, b, reader = (
        DhtRolloutSource(cfg, Toy(), who, MemoryDHT(ks, who, table, live), clock=clock, choice=choice) for who in ids
    )
    return (a, b), reader, ks, table, clock


def test_a_gather_over_an_in_memory_dht_hands_the_verified_groups_to_the_choice(ids):
    choice = Recording()
    (a, b), reader, ks, table, _ = _swarm(ids, choice, live_publishers=False)  # every shard read: the ghost too
    a.publish(7, groups(0, 3) + groups(10, 2, with_signal=False), receipts=[(reader.node_id, 6, 1)])
    b.publish(9, groups(20, 2))
    ghost = "QmGhostWithoutARecord"
    w = ks.window_at(NOW)
    ghost_entry = IndexEntry("mem", w, ks.shard_of(ghost, w), ghost, 1, 4, 4, 100)
    table.setdefault(ks.index_key(w, ghost_entry.shard), {})[b"ghost"] = (encode_index(ghost_entry), NOW + 600)

    got = reader.gather(1, 4, random.Random(0))
    ((candidates, wanted),) = choice.calls
    assert wanted == Wanted(4)
    # every verified group with signal of both peers: a's 3 (its 2 flat ones dropped), b's 2
    assert Counter(g.source for g in candidates) == {a.node_id: 3, b.node_id: 2}
    assert {(g.round, g.index) for g in candidates if g.source == a.node_id} == {(7, 0), (7, 1), (7, 2)}
    assert got == candidates[:4]
    stats = reader.stats()
    assert (stats["swarm/records"], stats["swarm/records_missing"], stats["swarm/accepted"]) == (2, 1, 5)
    assert stats["swarm/rejected/zero_advantage"] == 2 and stats["swarm/used"] == 4
    assert reader.reputation.is_suspect(ghost) and reader.reputation.is_trusted(a.node_id)
    assert reader.receipts_for_us() == [(a.node_id, 6, 1)]

    # the next gather never returns a group twice: only the fifth is left
    again = reader.gather(2, 4, random.Random(0))
    (left,) = [g for g in candidates if g not in got]
    assert [(g.source, g.round, g.index) for g in again] == [(left.source, left.round, left.index)]
    # a record whose groups were all used is not fetched again (b's 2, when both were taken: which
    # ones were depends on the order of the random ids); the used groups of the others are avoided
    used, published = Counter(g.source for g in got), {a.node_id: 5, b.node_id: 2}
    assert reader.stats()["swarm/reuse_avoided"] == sum(n for peer, n in used.items() if n < published[peer])


def test_the_default_choice_takes_at_most_half_the_round_from_one_peer(ids):
    (a, b), reader, _, _, _ = _swarm(ids)
    for r in range(1, 4):
        a.publish(r, groups(0, 6))
        b.publish(r, groups(30, 1))
        got = reader.gather(r, 4, random.Random(r))
        # ceil(4 / 2) = 2 from a while b has one, then a fills the rest: 3 + 1
        assert Counter(g.source for g in got) == {a.node_id: 3, b.node_id: 1}


def test_a_gather_reads_what_its_first_batch_is_sized_for(ids):
    (a, b), reader, ks, _, _ = _swarm(ids)
    a.publish(3, groups(0, 2))
    b.publish(3, groups(9, 2))
    reader.gather(1, 2, random.Random(0))
    index_reads = [keys for keys in reader.dht.reads if "/idx/" in keys[0]]
    record_reads = [keys for keys in reader.dht.reads if "/rec/" in keys[0]]
    # 2 known peers over 4 shards, 0.5 an index key: ceil(1.5 x 6 / (2 x 0.5)) = 9 shards, at most
    # 4: one read of every shard in both windows; then one fetch of the 2 records
    assert [len(k) for k in index_reads] == [2 * ks.shards] and [len(k) for k in record_reads] == [2]
    stats = reader.stats()
    assert (stats["swarm/peers"], stats["swarm/index_keys"], stats["swarm/records"]) == (2, 8, 2)
    assert math.isfinite(stats["swarm/gather_s"])


def test_republishing_moves_the_latest_record_into_the_new_window_for_two_windows(ids):
    (a, _), _, ks, _, clock = _swarm(ids)
    a.publish(3, groups(0, 2))
    w = ks.window_at(NOW)
    assert a.dht.republish() == []  # still the window it was published in
    for later, moved in ((1, True), (2, True), (3, False)):
        clock.now = NOW + later * ks.window_seconds
        items = a.dht.republish()
        assert bool(items) == moved
        if moved:
            assert {key for key, _, _ in items} == {
                ks.record_key(w + later, a.node_id),
                ks.index_key(w + later, ks.shard_of(a.node_id, w + later)),
            }


def test_a_liar_on_the_topic_we_need_cannot_buy_the_round_with_need_choice(ids):
    """swarm.choice = need, take = mixed: we fail topic toy/hard (need 1) and master toy/easy (need 0).
    A liar offers groups on toy/hard whose "right" answers are wrong, an honest peer groups on
    toy/easy. The need is ours, the rewards are our re-scoring: the liar's groups are flat wrong and
    dropped before the choice, so the round takes the honest ones, however little we need them."""
    from sapo_core.swarm.selection import NeedChoice

    cfg = SwarmConfig(swarm_name="mem", shards=4, take="mixed", choice="need")
    ks = KeySpace(cfg.swarm_name, cfg.window_seconds, cfg.shards)
    table: dict = {}
    clock = Clock()
    liar, honest, reader = (
        DhtRolloutSource(cfg, Toy(), who, MemoryDHT(ks, who, table), clock=clock, choice=NeedChoice()) for who in ids
    )

    def on(digest: str, i: int, texts: list[str]) -> Group:
        q = Question(QuestionId("toy", digest, 1, i), f"What is {i} + 1?", str(i + 1))
        return Group(q, [Completion(t, reward=1.0) for t in texts])  # a sender's rewards are never sent

    liar.publish(4, [on("hard", i, ["Answer: 0", "Answer: -1"]) for i in range(6)])
    honest.publish(4, [on("easy", i, [f"Answer: {i + 1}", "Answer: 0"]) for i in range(10, 12)])
    got = reader.gather(5, 2, random.Random(0), {"toy/hard": 1.0, "toy/easy": 0.0})
    assert sorted((g.source, g.question.id.topic()) for g in got) == [(honest.node_id, "toy/easy")] * 2
    assert reader.stats()["swarm/rejected/zero_advantage"] == 6


def test_the_choice_is_given_the_need_of_the_gather(ids):
    choice = Recording()
    (a, _), reader, _, _, _ = _swarm(ids, choice)
    a.publish(1, groups(0, 2))
    reader.gather(2, 1, random.Random(0), {"toy/d": 0.25})
    assert choice.calls[-1][1] == Wanted(1, {"toy/d": 0.25})
