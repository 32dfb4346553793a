"""Which peers a gather reads, and which of their verified groups it takes: pure rules.

The network enters only as `read`, a callable from (window, shard) pairs to the values found
under those index keys, and what we know of peers only as a `PeerView` (a snapshot of the
reputation, the routing table and the groups already used), the way hivemind's
`dht/traverse.py` takes its network as a callable. So every rule here is tested with tables
and no DHT (tests/test_swarm_selection.py); `DhtRolloutSource._gather` (source.py) runs them
against the real one.

1. `read_index`: index shards of the current and previous windows, trusted peers' shards
   first (`shard_order`), then batches that double (k, k, 2k, 4k ...; k from
   `first_batch_size`) until enough *promising* peers turned up (`found_enough`), the shards
   run out or the deadline passes. Promising: unstruck peers that run a DHT node in our
   routing table or proved useful. An identity costs nothing, a live DHT node does, so a
   flood of fresh identities never ends the reading early.
2. `choose_records`: at most `limit` records to fetch (docs/swarm.md, "A gather, step by step").
3. `unused_groups`: each (peer, round, group) is trained on once, ever.
4. A `GroupChoice` takes the round's groups from the verified candidates. `UniformChoice` is
   the paper's: J uniformly, at most ceil(J/2) from one peer while others have groups left
   (`sample_groups`). `NeedChoice` (swarm.choice = need) draws them in proportion to what our
   own groups lack on each candidate's dataset and level (`Wanted.need`, from adopt.TopicNeeds),
   with the same cap. Another rule is another `GroupChoice`, given to `open_swarm`; what it
   needs to know about the round goes into `Wanted`.
"""

from __future__ import annotations

import math
import random
import time
from collections import Counter
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, Protocol

from sapo_core.rollouts import Group, one_per_question
from sapo_core.swarm.keys import KeySpace, values_of
from sapo_core.swarm.records import IndexEntry, RecordError, decode_index

# (window, shard) pairs -> the values found under each pair's index key, as SwarmDHT.get_many
# returns them (owner subkey -> (payload, expiration)); raises if the read failed
ReadShards = Callable[[Sequence[tuple[int, int]]], Mapping[tuple[int, int], Any]]


@dataclass(frozen=True)
class PeerView:
    """What a gather knows of peers when it chooses: a snapshot, so the rules are pure."""

    me: str  # our own peer id: never read
    trusted: tuple[str, ...] = ()  # earlier records gave good groups; least recently confirmed first
    ignored: frozenset[str] = frozenset()  # on ignore for now (PeerReputation)
    struck: frozenset[str] = frozenset()  # strikes not yet forgiven
    live: frozenset[str] = frozenset()  # peer ids of the DHT nodes in our routing table
    known_peers: int = 0  # DHT nodes in our routing table
    # (peer, round) -> indices of that record's groups already trained on (read only here)
    used: Mapping[tuple[str, int], Collection[int]] = field(default_factory=dict)

    @cached_property
    def _trusted_set(self) -> frozenset[str]:
        return frozenset(self.trusted)

    def is_trusted(self, peer: str) -> bool:
        return peer in self._trusted_set

    def is_suspect(self, peer: str) -> bool:
        """Struck or ignored: it does not count as a peer worth having found."""
        return peer in self.struck or peer in self.ignored

    def usable(self, entries: Iterable[IndexEntry]) -> list[IndexEntry]:
        """Entries whose record may be fetched: not ours, not an ignored peer's, with groups
        and not all of them used already."""
        return [
            e
            for e in entries
            if e.peer_id != self.me
            and e.groups > 0
            and e.peer_id not in self.ignored
            and len(self.used.get((e.peer_id, e.round), ())) < e.groups
        ]


@dataclass
class IndexRead:
    """What `read_index` found."""

    entries: dict[str, tuple[IndexEntry, float]] = field(default_factory=dict)  # peer -> (newest, expiration)
    seen: set[str] = field(default_factory=set)  # peers other than us with an entry
    announced: list[IndexEntry] = field(default_factory=list)  # others' decoded entries, as read
    figures: Counter = field(default_factory=Counter)  # index_keys, index_entries, bytes_in, rejected/index_*
    error: Exception | None = None  # the read that failed and ended the reading


def shard_order(
    keyspace: KeySpace, windows: Sequence[int], trusted: Sequence[str], limit: int, rng: random.Random
) -> tuple[list[int], int]:
    """Index shards in reading order, and how many lead it: the shards of the `limit` most
    recently trusted peers in these windows, then every other shard in a random order."""
    first: list[int] = []
    for peer in trusted[-limit:]:
        for w in windows:
            shard = keyspace.shard_of(peer, w)
            if shard not in first:
                first.append(shard)
    order = first + [s for s in rng.sample(range(keyspace.shards), keyspace.shards) if s not in first]
    return order, len(first)


def first_batch_size(entries_per_key: float | None, known_peers: int, limit: int, shards: int, at_least: int) -> int:
    """Shards to read first: enough to expect 1.5 × `limit` peers over both windows, at least
    `at_least`. Entries per index key come from earlier gathers; before the first, from the
    routing table (all peers in a small swarm, fewer in a large one)."""
    per_key = entries_per_key if entries_per_key is not None else max(known_peers, 1) / shards
    need = math.ceil(1.5 * limit / (2 * max(per_key, 0.05)))
    return max(at_least, min(need, shards))


def entries_per_key(old: float | None, entries: int, keys: int) -> float | None:
    """The moving average of index entries per key read (half the old, half this gather's)."""
    if not keys:
        return old
    observed = entries / keys
    return observed if old is None else 0.5 * old + 0.5 * observed


def found_enough(found: IndexRead, view: PeerView, limit: int) -> bool:
    """Whether the reading can stop: `limit` promising peers turned up, or every peer of our
    routing table did (a small swarm has nothing more to find). Struck peers never count."""
    promising = [
        e
        for e in view.usable(e for e, _ in found.entries.values())
        if not view.is_suspect(e.peer_id) and (e.peer_id in view.live or view.is_trusted(e.peer_id))
    ]
    if len(promising) >= limit:
        return True
    good_seen = [p for p in found.seen if not view.is_suspect(p) and p in view.live]
    return bool(good_seen) and len(good_seen) >= view.known_peers


def read_index(
    read: ReadShards,
    keyspace: KeySpace,
    windows: Sequence[int],
    view: PeerView,
    rng: random.Random,
    limit: int,
    first_size: int,
    deadline: float,
    clock: Callable[[], float] = time.perf_counter,
) -> IndexRead:
    """Read index shards in batches that double until `found_enough`, the shards run out,
    `clock()` passes `deadline` or a read fails (`IndexRead.error`; what came before stays)."""
    order, leading = shard_order(keyspace, windows, view.trusted, limit, rng)
    found = IndexRead()
    pos, size = 0, max(leading, first_size)
    while pos < len(order) and clock() < deadline and not found_enough(found, view, limit):
        batch, pos = order[pos : pos + size], pos + size
        size = max(size, pos)  # k, k, 2k, 4k ...
        pairs = [(w, s) for w in windows for s in batch]
        try:
            values = read(pairs)
        except Exception as e:  # a timeout or a failed search: the reading ends, the gather goes on
            found.error = e
            break
        found.figures["index_keys"] += len(pairs)
        asked = set(pairs)
        for (window, shard), raw in values.items():
            if (window, shard) in asked:
                add_entries(found, window, shard, values_of(raw), keyspace.swarm_name, view.me)
    return found


def add_entries(
    found: IndexRead, window: int, shard: int, values: Iterable[tuple[bytes, float]], swarm: str, me: str
) -> None:
    """Decode the (payload, expiration) values of one index key into `found`: per peer the
    newest entry (window, then round); anything that is not an entry for this very key is
    counted as rejected. Never raises for what a peer sent."""
    f = found.figures
    for payload, expiration in values:
        f["bytes_in"] += len(payload)
        f["index_entries"] += 1
        try:
            entry = decode_index(payload, swarm)
        except RecordError as e:  # the DHT validated it already: only a broken peer gets here
            f[f"rejected/index_{e.reason}"] += 1
            continue
        except Exception:  # decode_index raises only RecordError; a peer's bytes never crash us
            f["rejected/index_malformed"] += 1
            continue
        if entry.window != window or entry.shard != shard:
            f["rejected/index_wrong_key"] += 1
            continue
        if entry.peer_id != me:
            found.seen.add(entry.peer_id)
            found.announced.append(entry)
        old = found.entries.get(entry.peer_id)
        if old is None or (entry.window, entry.round) > (old[0].window, old[0].round):
            found.entries[entry.peer_id] = (entry, expiration)


def choose_records(entries: Sequence[IndexEntry], view: PeerView, limit: int, rng: random.Random) -> list[IndexEntry]:
    """Up to `limit` entries whose records we fetch.

    Records none of whose groups we used come first. Among them, trusted peers fill all but a
    third of the slots, those announcing signal first (a record without can only give
    receipts), and the rest explore unknown peers: unstruck ones first, then those running a
    DHT node we know (a Sybil identity costs nothing, a live node does), then those claiming
    signal. Leftover slots take whatever remains, partly used records last. A flood of fresh
    identities can take the exploring slots, never the trusted ones; struck ones lose even
    those to unstruck newcomers.
    """
    usable = view.usable(entries)
    rng.shuffle(usable)
    fresh = [e for e in usable if (e.peer_id, e.round) not in view.used]
    stale = [e for e in usable if (e.peer_id, e.round) in view.used]
    trusted = sorted((e for e in fresh if view.is_trusted(e.peer_id)), key=lambda e: e.signal_groups == 0)
    unknown = sorted(
        (e for e in fresh if not view.is_trusted(e.peer_id)),
        key=lambda e: (view.is_suspect(e.peer_id), e.peer_id not in view.live, e.signal_groups == 0),
    )
    explore = max(1, limit // 3)
    first = trusted[: limit - explore] + unknown[:explore]
    rest = trusted[limit - explore :] + unknown[explore:] + stale
    return (first + rest)[:limit]


def unused_groups(pool: Sequence[Group], used: Mapping[tuple[str, int], Collection[int]]) -> list[Group]:
    """The verified groups never trained on before: each (peer, round, group) trains once."""
    return [g for g in pool if g.index not in used.get((g.source, g.round), ())]


@dataclass(frozen=True)
class Wanted:
    """What this round asks of the swarm, as a `GroupChoice` reads it. A rule that needs more
    about the round (our own groups, say) takes it from a new field here."""

    groups: int  # J: peers' groups this round trains on
    # topic (QuestionId.topic: dataset and level) -> how much a peer's right answer there would teach
    # us, from our own recent groups (adopt.TopicNeeds); read by NeedChoice, empty when unknown
    need: Mapping[str, float] = field(default_factory=dict)


class GroupChoice(Protocol):
    """Which of the verified, unused candidate groups this round takes: pure, at most
    `wanted.groups` of them, every one from `candidates`, randomness from `rng` only."""

    def __call__(self, candidates: Sequence[Group], wanted: Wanted, rng: random.Random) -> list[Group]: ...


@dataclass(frozen=True)
class UniformChoice:
    """The SAPO paper's choice: J groups uniformly, at most ceil(J × `per_peer_share`) from one
    peer while others have groups left (a single peer cannot fill the round)."""

    per_peer_share: float = 0.5

    def __post_init__(self) -> None:
        if not 0 < self.per_peer_share <= 1:
            raise ValueError(f"per_peer_share must be in (0, 1], not {self.per_peer_share}")

    def __call__(self, candidates: Sequence[Group], wanted: Wanted, rng: random.Random) -> list[Group]:
        per_peer = max(1, math.ceil(wanted.groups * self.per_peer_share))
        return sample_groups(candidates, wanted.groups, rng, per_peer=per_peer)


@dataclass(frozen=True)
class NeedChoice:
    """Success-gated sharing that prefers what we lack (issue 36): J groups drawn without
    replacement with probability in proportion to `wanted.need` of their topic (`unknown` for a
    topic we have no groups of lately; every weight at least `floor`, so nothing is shut out),
    one group per question, at most ceil(J × `per_peer_share`) from one peer while others have
    groups left. The candidates are verified and re-scored by us already, so under swarm.take =
    mixed each holds a right answer; the need comes from our own groups only, never from what a
    peer says, so a peer can at most offer groups on the topics we need (and is capped)."""

    per_peer_share: float = 0.5
    unknown: float = 0.5
    floor: float = 0.05

    def __post_init__(self) -> None:
        if not 0 < self.per_peer_share <= 1:
            raise ValueError(f"per_peer_share must be in (0, 1], not {self.per_peer_share}")
        if not 0 < self.floor <= self.unknown <= 1:
            raise ValueError(f"need weights must satisfy 0 < floor <= unknown <= 1, not {self.floor}, {self.unknown}")

    def weight(self, group: Group, need: Mapping[str, float]) -> float:
        w = need.get(group.question.id.topic(), self.unknown)
        return min(1.0, max(self.floor, w)) if math.isfinite(w) else self.floor

    def __call__(self, candidates: Sequence[Group], wanted: Wanted, rng: random.Random) -> list[Group]:
        per_peer = max(1, math.ceil(wanted.groups * self.per_peer_share))
        # a weighted order without replacement (Efraimidis and Spirakis: key u ** (1 / w), largest first)
        keys = [rng.random() ** (1.0 / self.weight(g, wanted.need)) for g in candidates]
        ranked = sorted(range(len(candidates)), key=lambda i: keys[i], reverse=True)
        distinct = list(one_per_question(candidates[i] for i in ranked))
        return _capped(distinct, min(max(wanted.groups, 0), len(distinct)), per_peer)


def sample_groups(pool: Sequence[Group], want: int, rng: random.Random, per_peer: int | None = None) -> list[Group]:
    """J groups uniformly without replacement from the verified pool (all of it if smaller),
    no peer supplying more than `per_peer` of them (default ceil(J/2)) while groups of other
    peers are left; only then does the rest of one peer's groups fill the remaining slots."""
    want = min(max(want, 0), len(pool))
    cap = per_peer if per_peer is not None else max(1, math.ceil(want / 2))
    return _capped(rng.sample(list(pool), len(pool)), want, cap)


def _capped(order: Sequence[Group], want: int, cap: int) -> list[Group]:
    """The first `want` groups of `order`, no peer supplying more than `cap` while groups of
    other peers are left; then the rest of the order fills the remaining slots."""
    taken: Counter = Counter()
    out: list[Group] = []
    rest: list[Group] = []
    for g in order:
        if len(out) == want:
            break
        if taken[g.source] < cap:
            taken[g.source] += 1
            out.append(g)
        else:
            rest.append(g)
    out.extend(rest[: want - len(out)])
    return out
