"""A gather's peer selection (selection.py) with tables and no DHT: the index is a dict behind a
read callable, what we know of peers a `PeerView`. Every expected value is worked out by hand in
the comment beside it."""

from __future__ import annotations

import dataclasses
import math
import random
from collections import Counter

import pytest

from sapo_core.rollouts import Completion, Group, Question, QuestionId
from sapo_core.swarm.keys import KeySpace
from sapo_core.swarm.records import IndexEntry, encode_index
from sapo_core.swarm.selection import (
    IndexRead,
    NeedChoice,
    PeerView,
    UniformChoice,
    Wanted,
    add_entries,
    choose_records,
    entries_per_key,
    first_batch_size,
    found_enough,
    read_index,
    shard_order,
    unused_groups,
)

SWARM = "swarm-s"
KS = KeySpace(SWARM, 60.0, 4)
W = 10  # the current window; the reader reads (10, 9)
WINDOWS = (W, W - 1)


def entry(peer: str, round: int = 5, groups: int = 4, signal: int = 4, window: int = W, shard: int = 0) -> IndexEntry:
    return IndexEntry(SWARM, window, shard, peer, round, groups, signal, 1000)


def group(source: str, index: int = 0, round: int = 5) -> Group:
    q = Question(QuestionId("toy", "d", 1, index), f"What is {index} + 1?", str(index + 1))
    return Group(q, [Completion("a", reward=1.0), Completion("b", reward=0.0)], source=source, round=round, index=index)


def peer_in_shard(shard: int, prefix: str, window: int = W) -> str:
    """A peer id that the key space puts in `shard` in `window`."""
    return next(p for p in (f"{prefix}{i}" for i in range(1000)) if KS.shard_of(p, window) == shard)


# --- which index entries are usable ---------------------------------------------------------------


@pytest.mark.parametrize(
    "e, used, usable",
    [
        (entry("p"), {}, True),
        (entry("me"), {}, False),  # our own entry
        (entry("bad"), {}, False),  # ignored
        (entry("p", groups=0, signal=0), {}, False),  # nothing to fetch
        (entry("p", groups=4), {("p", 5): {0, 1, 2, 3}}, False),  # every group used already
        (entry("p", groups=4), {("p", 5): {0, 1}}, True),  # half used: the rest may train
        (entry("p", groups=4), {("p", 4): {0, 1, 2, 3}}, True),  # another round of the peer
    ],
)
def test_usable_entries(e, used, usable):
    view = PeerView("me", ignored=frozenset({"bad"}), used=used)
    assert view.usable([e]) == ([e] if usable else [])


def test_suspect_means_struck_or_ignored():
    view = PeerView("me", trusted=("t",), ignored=frozenset({"i"}), struck=frozenset({"s"}))
    assert [view.is_suspect(p) for p in ("i", "s", "t", "x")] == [True, True, False, False]
    assert [view.is_trusted(p) for p in ("i", "s", "t", "x")] == [False, False, True, False]


# --- which records are fetched --------------------------------------------------------------------


def test_trusted_peers_fill_all_but_a_third_of_the_slots():
    # limit 6: explore = max(1, 6 // 3) = 2, so 4 trusted and 2 unknown, whatever the flood
    trusted = [entry(f"t{i}") for i in range(6)]
    flood = [entry(f"sybil{i}") for i in range(40)]
    view = PeerView("me", trusted=tuple(e.peer_id for e in trusted))
    for seed in range(20):
        chosen = choose_records(trusted + flood, view, 6, random.Random(seed))
        assert Counter(e.peer_id[0] for e in chosen) == {"t": 4, "s": 2}
    # with only 2 trusted peers, the unknown ones take the slots they leave
    chosen = choose_records(trusted[:2] + flood, PeerView("me", trusted=("t0", "t1")), 6, random.Random(0))
    assert Counter(e.peer_id[0] for e in chosen) == {"t": 2, "s": 4}


def test_unknown_peers_are_explored_unstruck_then_live_then_claiming_signal_first():
    # sort key (struck, not live, no signal): a (F,F,F) < b (F,F,T) < c (F,T,F) < d (T,F,F)
    es = [
        entry("d-struck-live-signal"),
        entry("c-unstruck-dead-signal"),
        entry("b-unstruck-live-nosignal", signal=0),
        entry("a-unstruck-live-signal"),
    ]
    live = frozenset({"a-unstruck-live-signal", "b-unstruck-live-nosignal", "d-struck-live-signal"})
    view = PeerView("me", struck=frozenset({"d-struck-live-signal"}), live=live)
    for seed in range(10):
        chosen = choose_records(es, view, 3, random.Random(seed))
        assert [e.peer_id[0] for e in chosen] == ["a", "b", "c"]


def test_trusted_records_without_signal_come_after_those_with():
    es = [entry("t-nosignal", signal=0), entry("t-signal")]
    view = PeerView("me", trusted=("t-nosignal", "t-signal"))
    for seed in range(10):
        assert [e.peer_id for e in choose_records(es, view, 3, random.Random(seed))] == ["t-signal", "t-nosignal"]


def test_partly_used_records_come_last_and_ignored_peers_and_ourselves_never():
    es = [entry("stale"), entry("fresh"), entry("me"), entry("ignored"), entry("trusted-stale")]
    used = {("stale", 5): {0}, ("trusted-stale", 5): {1}}
    view = PeerView("me", trusted=("trusted-stale", "ignored"), ignored=frozenset({"ignored"}), used=used)
    chosen = choose_records(es, view, 6, random.Random(1))
    assert chosen[0].peer_id == "fresh" and {e.peer_id for e in chosen[1:]} == {"stale", "trusted-stale"}
    assert [e.peer_id for e in choose_records(es, view, 1, random.Random(1))] == ["fresh"]


# --- reading the index ----------------------------------------------------------------------------


class Index:
    """The sharded index as a dict: (window, shard) -> {subkey: (payload, expiration)}; `read`
    is the callable read_index takes, and it remembers the shards of every call."""

    def __init__(self, entries=(), fail_on_call: int | None = None) -> None:
        self.values: dict[tuple[int, int], dict[bytes, tuple[bytes, float]]] = {}
        self.calls: list[list[int]] = []
        self.fail_on_call = fail_on_call
        for i, e in enumerate(entries):
            self.put(e.window, e.shard, f"sub{i}".encode(), encode_index(e))

    def put(self, window: int, shard: int, subkey: bytes, payload: bytes, expiration: float = 2000.0) -> None:
        self.values.setdefault((window, shard), {})[subkey] = (payload, expiration)

    def read(self, pairs):
        self.calls.append(sorted({s for _, s in pairs}))
        if self.fail_on_call == len(self.calls):
            raise TimeoutError("DHT call took more than 3.0 s")
        return {p: self.values[p] for p in pairs if p in self.values}


def placed(peer: str, window: int = W, **kw) -> IndexEntry:
    return entry(peer, window=window, shard=KS.shard_of(peer, window), **kw)


def test_shards_are_read_trusted_first_then_in_batches_that_double():
    order, leading = shard_order(KS, WINDOWS, (), 6, random.Random(0))
    assert sorted(order) == [0, 1, 2, 3] and leading == 0
    index = Index()
    read_index(index.read, KS, WINDOWS, PeerView("me"), random.Random(0), 6, 1, math.inf)
    # nothing found: batches of 1, 1, 2 shards (k, k, 2k) cover the 4 shards, both windows each
    assert index.calls == [sorted(order[:1]), sorted(order[1:2]), sorted(order[2:4])]
    # a trusted peer's shards (one per window) lead, and the first batch is at least that large
    t = "trusted-peer"
    mine = [KS.shard_of(t, W), KS.shard_of(t, W - 1)]
    order, leading = shard_order(KS, WINDOWS, (t,), 6, random.Random(0))
    assert order[:leading] == list(dict.fromkeys(mine))
    index = Index()
    read_index(index.read, KS, WINDOWS, PeerView("me", trusted=(t,)), random.Random(0), 6, 1, math.inf)
    assert index.calls[0] == sorted(set(mine))


def _flood_and_honest(sybil_struck: bool, sybil_live: bool) -> tuple[Index, list[int], PeerView]:
    """An honest live peer in the shard read last; a Sybil in each of the three others."""
    order, _ = shard_order(KS, WINDOWS, (), 1, random.Random(7))
    honest = peer_in_shard(order[-1], "honest")
    sybils = [peer_in_shard(s, f"sybil{s}-") for s in order[:-1]]
    view = PeerView(
        "me",
        struck=frozenset(sybils if sybil_struck else ()),
        live=frozenset([honest] + (sybils if sybil_live else [])),
        known_peers=10,
    )
    return Index([placed(p) for p in [honest, *sybils]]), order, view


@pytest.mark.parametrize(
    "struck, live, calls",
    [
        (True, True, 3),  # struck Sybils do not count as found: read on to the honest peer (1, 1, 2 shards)
        (False, False, 3),  # identities without a live DHT node do not count either
        (False, True, 1),  # an unstruck live peer is promising: the first shard is enough (limit 1)
    ],
)
def test_a_flood_of_sybils_does_not_end_the_reading_early(struck, live, calls):
    index, order, view = _flood_and_honest(struck, live)
    read_index(index.read, KS, WINDOWS, view, random.Random(7), 1, 1, math.inf)
    assert len(index.calls) == calls
    assert (order[-1] in index.calls[-1]) == (calls == 3)


def test_reading_stops_once_every_peer_of_the_routing_table_turned_up():
    order, _ = shard_order(KS, WINDOWS, (), 6, random.Random(3))
    alone = peer_in_shard(order[0], "only")
    view = PeerView("me", live=frozenset({alone}), known_peers=1)
    index = Index([placed(alone)])
    found = read_index(index.read, KS, WINDOWS, view, random.Random(3), 6, 1, math.inf)
    assert len(index.calls) == 1 and set(found.entries) == {alone}  # limit 6 unmet, yet nothing more to find
    assert found_enough(found, view, 6)
    assert not found_enough(found, dataclasses.replace(view, known_peers=2), 6)  # one more to find
    assert not found_enough(found, dataclasses.replace(view, struck=frozenset({alone})), 6)  # struck: not found


def test_a_failed_read_ends_the_reading_and_keeps_what_came_before():
    order, _ = shard_order(KS, WINDOWS, (), 6, random.Random(5))
    first = peer_in_shard(order[0], "first")
    index = Index([placed(first), placed(peer_in_shard(order[1], "second"))], fail_on_call=2)
    found = read_index(index.read, KS, WINDOWS, PeerView("me"), random.Random(5), 6, 1, math.inf)
    assert isinstance(found.error, TimeoutError) and set(found.entries) == {first}
    assert found.figures["index_keys"] == 2  # one successful call: 1 shard x 2 windows


def test_nothing_is_read_after_the_deadline():
    index = Index([placed("p")])
    found = read_index(index.read, KS, WINDOWS, PeerView("me"), random.Random(0), 6, 4, 10.0, clock=lambda: 11.0)
    assert index.calls == [] and found.entries == {}


def test_index_values_are_decoded_strictly_and_the_newest_entry_per_peer_kept():
    found = IndexRead()
    shard = KS.shard_of("p", W)
    values = [
        (encode_index(entry("p", round=5, shard=shard)), 1.0),
        (encode_index(entry("p", round=7, shard=shard)), 2.0),  # newer round: kept
        (encode_index(entry("p", round=6, shard=shard)), 3.0),
        (encode_index(entry("q", shard=(shard + 1) % 4)), 1.0),  # under another shard's key
        (encode_index(entry("me", shard=shard)), 1.0),  # ours: kept, never "seen"
        (b"\xc1junk", 1.0),
        (encode_index(IndexEntry("other-swarm", W, shard, "r", 1, 1, 1, 10)), 1.0),
    ]
    add_entries(found, W, shard, values, SWARM, "me")
    assert {p: (e.round, x) for p, (e, x) in found.entries.items()} == {"p": (7, 2.0), "me": (5, 1.0)}
    assert found.seen == {"p"} and [e.round for e in found.announced] == [5, 7, 6]
    assert found.figures["index_entries"] == 7
    assert found.figures["bytes_in"] == sum(len(v) for v, _ in values)
    rejected = {k: v for k, v in found.figures.items() if k.startswith("rejected/")}
    assert rejected == {"rejected/index_wrong_key": 1, "rejected/index_malformed": 1, "rejected/index_wrong_swarm": 1}
    # a newer window wins over a later round of an older one
    add_entries(found, W + 1, KS.shard_of("p", W + 1), [(encode_index(placed("p", W + 1, round=1)), 9.0)], SWARM, "me")
    assert found.entries["p"][0].round == 1


def test_hostile_values_under_an_index_key_never_raise():
    index = Index()
    for i, raw in enumerate([None, "junk", {b"s": None}, {b"s": ("text", 1.0)}, {b"s": (b"x", float("nan"))}]):
        index.values[(W, i % 4)] = raw  # what a broken storage node might hand back
    found = read_index(index.read, KS, WINDOWS, PeerView("me"), random.Random(0), 6, 4, math.inf)
    assert found.entries == {} and found.error is None


@pytest.mark.parametrize(
    "per_key, known, expected",
    [
        (None, 0, 4),  # before any gather, 1 peer over 4 shards: 0.25 per key -> ceil(9 / 0.5) = 18, at most 4
        (None, 40, 2),  # 10 per key: ceil(9 / 20) = 1, at least shards_read = 2
        (1.0, 0, 4),  # ceil(9 / 2) = 5, at most 4
        (0.0, 0, 4),  # an empty index counts as 0.05 per key
    ],
)
def test_first_batch_size(per_key, known, expected):
    assert first_batch_size(per_key, known, 6, 4, 2) == expected


def test_entries_per_key_is_a_moving_average():
    assert entries_per_key(None, 6, 4) == 1.5
    assert entries_per_key(1.5, 2, 4) == 1.0  # (1.5 + 0.5) / 2
    assert entries_per_key(1.5, 0, 0) == 1.5  # nothing read: unchanged


# --- which groups are taken -----------------------------------------------------------------------


def test_groups_are_trained_once():
    pool = [group("a", 0), group("a", 1), group("a", 0, round=6), group("b", 0)]
    assert unused_groups(pool, {("a", 5): {0}, ("b", 4): {0}}) == pool[1:]


@pytest.mark.parametrize(
    "sources, want, share, expected",
    [
        ("aaaaab", 3, 0.5, {"a": 2, "b": 1}),  # ceil(3/2) = 2 from a, then b's one
        ("aaaaab", 4, 0.5, {"a": 3, "b": 1}),  # a capped at 2 while b has groups; then a fills the rest
        ("aaaaab", 1, 0.5, None),  # one group, from either
        ("aaaabc", 3, 1 / 3, {"a": 1, "b": 1, "c": 1}),  # ceil(3 x 1/3) = 1 each
        ("aaaa", 3, 0.5, {"a": 3}),  # no one else: the one peer fills the round
        ("ab", 5, 0.5, {"a": 1, "b": 1}),  # fewer than asked: all of them
        ("ab", 0, 0.5, {}),
    ],
)
def test_uniform_choice_takes_at_most_a_share_per_peer_while_others_have_groups(sources, want, share, expected):
    pool = [group(s, i) for i, s in enumerate(sources)]
    for seed in range(30):
        got = UniformChoice(share)(pool, Wanted(want), random.Random(seed))
        assert len(got) == min(want, len(pool)) and len({id(g) for g in got}) == len(got)
        assert all(any(g is p for p in pool) for g in got)
        if expected is not None:
            assert Counter(g.source for g in got) == expected


def test_uniform_choice_is_uniform():
    pool = [group(s, i) for i, s in enumerate("abcd")]
    counts = Counter(g.source for seed in range(2000) for g in UniformChoice()(pool, Wanted(1), random.Random(seed)))
    assert all(430 < counts[s] < 570 for s in "abcd"), counts


def test_uniform_choice_refuses_a_share_outside_0_1():
    with pytest.raises(ValueError, match="per_peer_share"):
        UniformChoice(0.0)


# --- the need-weighted choice (swarm.choice = need) -----------------------------------------------


def on_topic(source: str, index: int, digest: str) -> Group:
    """A verified group of `source` on question `index` of topic toy/<digest>."""
    q = Question(QuestionId("toy", digest, 1, index), f"What is {index} + 1?", str(index + 1))
    return Group(q, [Completion("a", reward=1.0), Completion("b", reward=0.0)], source=source, round=5, index=index)


@pytest.mark.parametrize(
    "need, first_share",
    [
        # J = 1 from one group of topic A and one of topic B: the first of a weighted order is A with
        # probability w_A / (w_A + w_B)
        ({"toy/A": 1.0, "toy/B": 0.0}, 1.0 / 1.05),  # B at the floor 0.05
        ({"toy/A": 1.0}, 1.0 / 1.5),  # B unknown: 0.5
        ({"toy/A": 0.25, "toy/B": 0.25}, 0.5),
        ({}, 0.5),  # nothing known: both 0.5, the paper's uniform draw
        ({"toy/A": 3.0, "toy/B": -1.0}, 1.0 / 1.05),  # out of range: 1 and the floor
        ({"toy/A": float("nan"), "toy/B": 1.0}, 0.05 / 1.05),  # not a number: the floor
    ],
)
def test_need_choice_draws_in_proportion_to_need_by_hand(need, first_share):
    pool = [on_topic("p", 0, "A"), on_topic("q", 1, "B")]
    n = 4000
    got = Counter(
        g.question.id.topic() for s in range(n) for g in NeedChoice()(pool, Wanted(1, need), random.Random(s))
    )
    # binomial sd at n = 4000 is at most 0.008: 4 sd
    assert abs(got["toy/A"] / n - first_share) < 0.032, (got, first_share)


def test_need_choice_takes_a_question_once_and_caps_a_peer():
    # p and q answered question 0 (topic A, needed), p also 1-5, r offers 9 (topic B, mastered)
    pool = [on_topic("p", i, "A") for i in range(6)] + [on_topic("q", 0, "A"), on_topic("r", 9, "B")]
    need = {"toy/A": 1.0, "toy/B": 0.0}
    for seed in range(200):
        got = NeedChoice()(pool, Wanted(4, need), random.Random(seed))
        keys = [g.question.id.key() for g in got]
        assert len(got) == 4 and len(set(keys)) == 4  # question 0 once, whoever answered it
        # ceil(4 / 2) = 2 from p while q or r have groups: p takes at most 3 of the 4 once the others
        # are in the order; q's question 0 and r's 9 each fit under the cap
        assert Counter(g.source for g in got)["p"] <= 3
    # fewer distinct questions than asked: each once
    assert len(NeedChoice()([on_topic("p", 0, "A"), on_topic("q", 0, "A")], Wanted(2, need), random.Random(0))) == 1


def test_need_choice_mostly_leaves_a_peer_flooding_a_topic_we_master():
    # a peer floods 20 groups on a topic our own groups always get right (weight: the floor 0.05);
    # two honest peers offer one group each on a topic we fail (weight 1). J = 2, at most 1 a peer
    # while others have groups, so a round holds at least one honest group either way, and both
    # honest ones only where they head the order: weighted, 2/3 x 1/2 = 1/3, so the honest share of
    # the slots is (1 + 1/3) / 2 = 2/3; uniformly, 2/22 x 1/21, a share of 0.502
    pool = [on_topic("flood", i, "B") for i in range(20)] + [on_topic("h1", 100, "A"), on_topic("h2", 101, "A")]
    need = {"toy/A": 1.0, "toy/B": 0.0}
    n = 1500

    def honest_share(choice) -> float:
        return sum(g.source != "flood" for s in range(n) for g in choice(pool, Wanted(2, need), random.Random(s))) / (
            2 * n
        )

    # the share's sd over n rounds: sqrt(1/3 x 2/3 / n) / 2 = 0.006
    assert abs(honest_share(NeedChoice()) - 2 / 3) < 0.025
    assert abs(honest_share(UniformChoice()) - (1 + 2 / 22 / 21) / 2) < 0.025


def test_need_choice_refuses_bad_weights():
    with pytest.raises(ValueError, match="per_peer_share"):
        NeedChoice(per_peer_share=0.0)
    with pytest.raises(ValueError, match="floor"):
        NeedChoice(floor=0.6, unknown=0.5)
