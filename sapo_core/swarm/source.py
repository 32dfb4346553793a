"""Where a round's external groups come from: the `RolloutSource` protocol and its two sources.

- `NoSwarm`: training alone (publishes nothing, gathers nothing).
- `DhtRolloutSource`: publishes our groups into the swarm's DHT and gathers verified groups
  from peers (keys.py has the key space, records.py the wire format, validation.py the DHT's
  validators, verify.py the checks on receipt, dht.py the DHT thread).

A gather, step by step: list index shards of the current and previous windows (trusted
peers' shards first, then a random few, the rest only while too few promising peers turned
up: struck peers and Sybils do not count); choose up to `records_per_gather` peers, never
ourselves nor an ignored peer, trusted ones first, preferring records not used before; fetch
their records; verify every group (verify.py: cut to our token limit, duplicates collapsed,
re-scored, bounded in CPU time); drop groups already used once; sample J uniformly with at
most ceil(J/2) from one peer. Everything that can fail on the network is bounded by
`gather_timeout` (verification by `verify_grace_seconds` more) and costs only its records.
Peers whose records are missing, hold nothing with signal though their index entry said they
would, or contradict their entry otherwise get light strikes (verify.USELESS_REASONS), so a flood
of such identities ends up ignored; a record announced as holding nothing with signal, and
holding none, is neither a strike nor a reason for trust (honest small models publish many).
Nothing a peer sends raises out of `gather()`.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import random
import threading
import time
from collections import Counter, OrderedDict
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol

from sapo_core import __version__ as APP_VERSION
from sapo_core.config import SwarmConfig
from sapo_core.hooks import Interrupted, NullHooks, RoundHooks
from sapo_core.rollouts import Group
from sapo_core.swarm.identity import KEY_FILE_NAME, NodeIdentity, load_or_create_identity, node_name
from sapo_core.swarm.keys import KeySpace
from sapo_core.swarm.keys import values_of as _values_of
from sapo_core.swarm.records import (
    IndexEntry,
    Receipt,
    Record,
    RecordError,
    decode_index,
    decode_record,
    encode_index,
    encode_record,
    fit_record,
)
from sapo_core.swarm.verify import (
    CompletionCutter,
    PeerReputation,
    QuestionSource,
    VerifyLimits,
    sample_groups,
    verify_record,
)

log = logging.getLogger(__name__)

REPUBLISH_WINDOWS = 2  # how long a round may outlast its window and stay readable


USED_MEMORY = 4096  # (peer, round) records whose used groups we remember


class RolloutSource(Protocol):
    def publish(self, round: int, groups: Sequence[Group], receipts: Sequence[Receipt] = ()) -> None:
        """Share our scored local groups of this round, and the receipts of the external
        groups we trained on last round ((peer id, peer's round, group index) each)."""

    def gather(self, round: int, want: int, rng: random.Random) -> list[Group]:
        """Up to `want` peers' groups never returned before: verified, re-scored by us,
        zero-advantage dropped, sampled uniformly; `source` is the peer id, `round`/`index`
        name the group; `token_ids` are our tokenizer's ids of exactly the scored text when the
        source has our tokenizer (else None: the node re-tokenises)."""

    def receipts_for_us(self) -> list[tuple[str, int, int]]:
        """Receipts naming this node in the records this round's gather fetched:
        (receipting peer id, our round named, group index), deduplicated, non-ignored peers."""

    def reject(self, peer: str, reason: str, n: int = 1, strike: bool = True) -> None:
        """The node dropped n of this peer's gathered completions for `reason` (e.g.
        `unlikely`): counted against the peer, and a light strike if `strike`."""

    def stats(self) -> dict[str, float]:
        """This round's figures, namespaced `swarm/...`, for the store row."""

    def describe(self, model: str | None = None, held_out: tuple[int, float, int] | None = None) -> None:
        """What this node says about itself in its next index entries, for the swarm's page:
        its model, its latest held-out figure (after round, solve rate, completions)."""

    def close(self) -> None: ...


class NoSwarm:
    """Training alone: nothing goes out, nothing comes in."""

    node_id = "alone"

    def publish(self, round: int, groups: Sequence[Group], receipts: Sequence[Receipt] = ()) -> None:
        return None

    def gather(self, round: int, want: int, rng: random.Random) -> list[Group]:
        return []

    def receipts_for_us(self) -> list[tuple[str, int, int]]:
        return []

    def reject(self, peer: str, reason: str, n: int = 1, strike: bool = True) -> None:
        return None

    def stats(self) -> dict[str, float]:
        return {}

    def describe(self, model: str | None = None, held_out: tuple[int, float, int] | None = None) -> None:
        return None

    def close(self) -> None:
        return None


class DhtRolloutSource:
    """Publishes to and gathers from the swarm's DHT (a started `SwarmDHT`)."""

    def __init__(
        self,
        cfg: SwarmConfig,
        tasks: QuestionSource,
        identity: NodeIdentity,
        dht: Any,
        hooks: RoundHooks | None = None,
        clock: Any = None,
        cutter: CompletionCutter | None = None,
    ) -> None:
        """`cutter`: our tokenizer and max_new_tokens, so peers' completions are scored exactly
        as they will be trained (None: scored whole, the node re-tokenises)."""
        from hivemind.utils import get_dht_time

        self.cfg = cfg
        self.tasks = _CachedQuestions(tasks)
        self.cutter = cutter
        self.identity = identity
        self.dht = dht
        self.keyspace: KeySpace = dht.keyspace
        self.hooks = hooks or NullHooks()
        self._clock = clock or get_dht_time
        self.reputation = PeerReputation(cfg.strikes_to_ignore, cfg.ignore_minutes * 60.0)
        self._used: OrderedDict[tuple[str, int], set[int]] = OrderedDict()  # (peer, round) -> group indices
        self._receipts: set[tuple[str, int, int]] = set()  # naming us, found this round
        self._round: int | None = None
        self._round_started: float | None = None  # monotonic, when this round first touched the swarm
        self.round_seconds: float | None = None  # the last round's wall time, for the page's /metrics
        self._figures: Counter = Counter()
        self._dht_rejections_before: dict[str, int] = {}
        self._entries_per_key: float | None = None  # moving average over gathers
        self._newer_seen: set[str] = set()  # newer versions peers announced, said once each
        self.page: Any = None  # the swarm's page, where swarm.page_port asks for it (open_swarm)
        self._model = ""  # what we say about ourselves (describe)
        self._held_out: tuple[int, float, int] | None = None
        # our latest record, kept readable while rounds outlast windows (see _republish_items)
        self._latest_lock = threading.Lock()
        self._latest: tuple[Record, int, int] | None = None  # (record, signal groups, first window)
        dht.store_periodically(cfg.window_seconds / 4, self._republish_items)

    # --- identity, for the node and the GUI ---------------------------------------------------

    @property
    def node_id(self) -> str:
        return self.identity.peer_id

    @property
    def node_name(self) -> str:
        return self.identity.name

    @property
    def visible_maddrs(self) -> list[str]:
        return list(self.dht.visible_maddrs)

    @property
    def join_address(self) -> str:
        """The multiaddr others pass as --initial-peers to join through this node."""
        return self.dht.best_maddr()

    # --- the protocol -----------------------------------------------------------------------

    def _begin(self, round: int) -> None:
        if round != self._round:
            now = time.monotonic()
            if self._round is not None and self._round_started is not None and round > self._round:
                self.round_seconds = (now - self._round_started) / (round - self._round)
            self._round, self._round_started = round, now
            self._figures = Counter()
            self._receipts = set()
            self._dht_rejections_before = self.dht.dht_rejections.snapshot()

    def publish(self, round: int, groups: Sequence[Group], receipts: Sequence[Receipt] = ()) -> None:
        self._begin(round)
        started = time.perf_counter()
        now = self._clock()
        window = self.keyspace.window_at(now)
        fitted = fit_record(
            self.cfg.swarm_name, window, self.node_id, round, groups, self.cfg.max_record_kib * 1024, receipts=receipts
        )
        items = self._items(fitted.record, fitted.signal_groups, now)
        if fitted.dropped_groups or fitted.dropped_completions:
            log.info(
                f"swarm: record cut to {self.cfg.max_record_kib} KiB: {fitted.dropped_groups} "
                f"group(s), {fitted.dropped_completions} completion(s) left out"
            )
        f = self._figures
        try:
            ok = self.dht.store(items, timeout=self.cfg.publish_timeout)
            f["publish_failed"] += sum(not v for v in ok.values())
        except Exception as e:  # the round goes on without sharing this time
            f["publish_failed"] += 2
            self._dht_failed(f"publishing round {round}", e)
        with self._latest_lock:
            self._latest = (fitted.record, fitted.signal_groups, window)
        f["receipts_out"] += len(fitted.record.receipts)
        f["published"] += len(fitted.record.groups)
        f["published_signal"] += fitted.signal_groups
        f["dropped_to_fit"] += fitted.dropped_groups
        f["bytes_out"] += sum(len(payload) for _, payload, _ in items)
        f["publish_s"] += time.perf_counter() - started

    def gather(self, round: int, want: int, rng: random.Random) -> list[Group]:
        """Never raises for anything peers send (docs/swarm.md, 'Hostile peers'): a failure
        inside is counted as `swarm/gather_errors`, logged, and costs this round its external
        groups."""
        self._begin(round)
        if want <= 0:
            return []
        try:
            return self._gather(round, want, rng)
        except Interrupted:
            raise
        except Exception as e:
            self._figures["gather_errors"] += 1
            log.error(f"swarm: gather failed, training on local groups only: {type(e).__name__}: {e}")
            return []

    def _gather(self, round: int, want: int, rng: random.Random) -> list[Group]:
        started = time.perf_counter()
        deadline = started + self.cfg.gather_timeout
        f = self._figures
        entries = self._read_index(rng, deadline)
        chosen = self._choose([e for e, _ in entries.values()], rng)
        keys = {e.peer_id: self.keyspace.record_key(e.window, e.peer_id) for e in chosen}
        # a record is stored with its index entry's expiration: a copy that new is the one named
        newer_than = {keys[e.peer_id]: entries[e.peer_id][1] for e in chosen}
        fetch_started = time.perf_counter()
        f["index_s"] += fetch_started - started
        try:
            found = self.dht.get_many(
                list(keys.values()), timeout=max(0.1, deadline - time.perf_counter()), newer_than=newer_than
            )
        except Exception as e:
            found = {}
            self._dht_failed("fetching peers' records", e)
        verify_started = time.perf_counter()
        f["fetch_s"] += verify_started - fetch_started
        # verification runs after the fetch; it may outlast the gather's deadline by the grace only
        limits = VerifyLimits(self.cutter, self.cfg.verify_cpu_seconds, deadline + self.cfg.verify_grace_seconds)
        pool: list[Group] = []
        for i, entry in enumerate(chosen):
            self.hooks.checkpoint()
            self.hooks.progress("gather", i, len(chosen), peer=node_name(entry.peer_id))
            if time.perf_counter() > limits.deadline:
                f["records_unverified"] += len(chosen) - i  # the gather's time is up; not their fault
                break
            pool.extend(self._verify_peer_record_guarded(entry, found.get(keys[entry.peer_id], {}), limits))
        f["verify_s"] += time.perf_counter() - verify_started
        fresh = [g for g in pool if g.index not in self._used.get((g.source, g.round), ())]
        f["reuse_avoided"] += len(pool) - len(fresh)
        out = sample_groups(fresh, want, rng, per_peer=max(1, math.ceil(want / 2)))
        for g in out:  # each (peer, round, group) is returned once, ever: never trained twice
            self._used.setdefault((g.source, g.round), set()).add(g.index)
            self._used.move_to_end((g.source, g.round))
        while len(self._used) > USED_MEMORY:
            self._used.popitem(last=False)
        f["accepted"] += len(fresh)
        f["used"] += len(out)
        f["gather_s"] += time.perf_counter() - started
        return out

    def receipts_for_us(self) -> list[tuple[str, int, int]]:
        return sorted(r for r in self._receipts if not self.reputation.is_ignored(r[0]))

    def reject(self, peer: str, reason: str, n: int = 1, strike: bool = True) -> None:
        if n <= 0:
            return
        self._figures[f"rejected/{reason}"] += n
        if not strike:
            self.reputation.count(peer, Counter({reason: n}))
        elif self.reputation.strike(peer, reason, n):
            log.warning(
                f"swarm: ignoring peer {node_name(peer)} ({peer}) for "
                f"{self.cfg.ignore_minutes:g} min: its groups keep being {reason}"
            )

    def stats(self) -> dict[str, float]:
        f = self._figures
        out = {f"swarm/{k}": float(v) for k, v in f.items() if not k.startswith("rejected/")}
        for k, v in f.items():
            if k.startswith("rejected/"):
                out[f"swarm/{k}"] = float(v)
        for name in (
            "published",
            "received",
            "accepted",
            "used",
            "records",
            "bytes_out",
            "bytes_in",
            "publish_s",
            "gather_s",
        ):
            out.setdefault(f"swarm/{name}", 0.0)
        out["swarm/rejected"] = float(sum(v for k, v in f.items() if k.startswith("rejected/")))
        out["swarm/dht_peers"] = float(self.dht.num_peers())
        out.update(self.dht.figures())  # reachability, relay, client mode, LAN peers (dht.py)
        out["swarm/ignored_peers"] = float(len(self.reputation.ignored()))
        before = self._dht_rejections_before
        for reason, n in self.dht.dht_rejections.snapshot().items():
            if n - before.get(reason, 0):
                out[f"swarm/dht_rejected/{reason}"] = float(n - before.get(reason, 0))
        return out

    def close(self) -> None:
        if self.page is not None:
            self.page.close()
        self.dht.close()

    def describe(self, model: str | None = None, held_out: tuple[int, float, int] | None = None) -> None:
        if model is not None:
            # a name the index can carry (records._model); a GGUF path of the volunteer's own is
            # not shared, only its file name
            name = Path(model).name[:64]
            self._model = name if all(c.isalnum() or c in "._-/+" for c in name) else ""
        if held_out is not None:
            self._held_out = held_out

    def own_figures(self) -> dict[str, Any]:
        """This node's round, last round time and held-out figure, for its page's /metrics."""
        return {"round": self._round, "round_seconds": self.round_seconds, "held_out": self._held_out}

    def _items(self, record: Record, signal_groups: int, now: float) -> list[tuple[str, bytes, float]]:
        """The record and its index entry, ready to store: (key, payload, expiration) each."""
        window = record.window
        payload = encode_record(record)
        shard = self.keyspace.shard_of(self.node_id, window)
        index = encode_index(
            IndexEntry(
                self.cfg.swarm_name,
                window,
                shard,
                self.node_id,
                record.round,
                len(record.groups),
                signal_groups,
                len(payload),
                APP_VERSION,
                self._model,
                self._held_out,
            )
        )
        expiration = self.keyspace.expiration(now)
        return [
            (self.keyspace.record_key(window, self.node_id), payload, expiration),
            (self.keyspace.index_key(window, shard), index, expiration),
        ]

    def _republish_items(self) -> list[tuple[str, bytes, float]]:
        """Called in the DHT thread: our latest record again, in the window it is now, if the
        round that made it is still running (a round longer than a window would otherwise leave
        this node invisible to readers). At most REPUBLISH_WINDOWS windows after it was made."""
        now = self._clock()
        window = self.keyspace.window_at(now)
        with self._latest_lock:
            if self._latest is None:
                return []
            record, signal, first = self._latest
            if record.window >= window or window - first > REPUBLISH_WINDOWS:
                return []
            record = dataclasses.replace(record, window=window)
            self._latest = (record, signal, first)
        return self._items(record, signal, now)

    def _dht_failed(self, what: str, error: Exception) -> None:
        """A DHT call timed out or failed: count it, say it, and let the round go on."""
        if isinstance(error, TimeoutError):
            self._figures["dht_timeouts"] += 1
            log.warning(f"swarm: {what} timed out ({error})")
        else:
            self._figures["dht_errors"] += 1
            log.warning(f"swarm: {what} failed: {type(error).__name__}: {error}")

    # --- gather's steps ---------------------------------------------------------------------

    def _first_batch(self) -> int:
        """Shards to read first: enough to expect 1.5 × records_per_gather peers over both
        windows (at least shards_read). Entries per index key come from earlier gathers; before
        the first, from the routing table (all peers in a small swarm, fewer in a large one)."""
        per_key = self._entries_per_key
        if per_key is None:
            per_key = max(self.dht.num_peers(), 1) / self.keyspace.shards
        need = math.ceil(1.5 * self.cfg.records_per_gather / (2 * max(per_key, 0.05)))
        return max(self.cfg.shards_read, min(need, self.keyspace.shards))

    def _read_index(self, rng: random.Random, deadline: float) -> dict[str, tuple[IndexEntry, float]]:
        """peer -> (newest index entry, its expiration) over the current and previous windows.

        Trusted peers' shards first, then the others in a random order, in batches that double
        (k, k, 2k, ...) until enough promising peers turned up, every peer in our routing table
        did, the shards run out or the deadline passes. Peers with strikes (Sybils sending
        junk, ghosts, liars) do not count as found: a flood cannot end the reading early.
        """
        windows = self.keyspace.readable_windows(self._clock())
        first = []
        for peer in self.reputation.trusted()[-self.cfg.records_per_gather :]:
            for w in windows:
                shard = self.keyspace.shard_of(peer, w)
                if shard not in first:
                    first.append(shard)
        order = first + [s for s in rng.sample(range(self.keyspace.shards), self.keyspace.shards) if s not in first]
        entries: dict[str, tuple[IndexEntry, float]] = {}
        seen_peers: set[str] = set()
        f = self._figures
        live = self._live_peers()
        pos, size = 0, max(len(first), self._first_batch())
        while pos < len(order) and time.perf_counter() < deadline:
            # promising: unstruck peers that run a DHT node we know (or that proved useful); an
            # identity is free, a DHT node in our routing table is not: fresh Sybil ids do not count
            promising = [
                e
                for e in self._usable(e for e, _ in entries.values())
                if not self.reputation.is_suspect(e.peer_id)
                and (e.peer_id in live or self.reputation.is_trusted(e.peer_id))
            ]
            if len(promising) >= self.cfg.records_per_gather:
                break
            good_seen = [p for p in seen_peers if not self.reputation.is_suspect(p) and p in live]
            if good_seen and len(good_seen) >= self.dht.num_peers():
                break  # every peer we know of has turned up: a small swarm has nothing more to find
            batch, pos = order[pos : pos + size], pos + size
            size = max(size, pos)  # k, k, 2k, 4k ...
            keys = {self.keyspace.index_key(w, s): (w, s) for w in windows for s in batch}
            try:
                found = self.dht.get_many(
                    list(keys), timeout=max(0.1, deadline - time.perf_counter()), beam_size=2 * self.cfg.replicas
                )
            except Exception as e:
                self._dht_failed("reading the index", e)
                break
            f["index_keys"] += len(keys)
            for key, values in found.items():
                if key not in keys:
                    continue
                window, shard = keys[key]
                for payload, expiration in _values_of(values):
                    f["bytes_in"] += len(payload)
                    f["index_entries"] += 1
                    try:
                        entry = decode_index(payload, self.cfg.swarm_name)
                    except RecordError as e:  # the DHT validated it already: only a broken peer gets here
                        f[f"rejected/index_{e.reason}"] += 1
                        continue
                    except Exception:  # decode_index raises only RecordError; a peer's bytes never crash us
                        f["rejected/index_malformed"] += 1
                        continue
                    if entry.window != window or entry.shard != shard:
                        f["rejected/index_wrong_key"] += 1
                        continue
                    if entry.peer_id != self.node_id:
                        seen_peers.add(entry.peer_id)
                        self._note_version(entry)
                    old = entries.get(entry.peer_id)
                    if old is None or (entry.window, entry.round) > (old[0].window, old[0].round):
                        entries[entry.peer_id] = (entry, expiration)
        f["peers"] = len(seen_peers)
        f["peers_suspect"] = sum(self.reputation.is_suspect(p) for p in seen_peers)
        if f["index_keys"]:
            observed = f["index_entries"] / f["index_keys"]
            old = self._entries_per_key
            self._entries_per_key = observed if old is None else 0.5 * old + 0.5 * observed
        return entries

    def _note_version(self, entry: IndexEntry) -> None:
        """Peers that announce a newer SAPO Swarm than ours: counted (`swarm/peers_newer`) and said
        once per version, with what to do (`version_notice`)."""
        if entry.app_version and newer_version(entry.app_version, APP_VERSION):
            self._figures["peers_newer"] += 1
            said = version_notice(entry.app_version, APP_VERSION, self._newer_seen)
            if said:
                log.warning(f"swarm: peer {node_name(entry.peer_id)} {said}")

    def _live_peers(self) -> set[str]:
        """Peer ids of the DHT nodes in our routing table (empty if the DHT cannot say)."""
        try:
            table = self.dht._node.protocol.routing_table
            return {p.to_base58() for p in list(table.uid_to_peer_id.values())}
        except Exception:  # no node yet, or another hivemind: only a hint is lost
            return set()

    def _usable(self, entries: Any) -> list[IndexEntry]:
        return [
            e
            for e in entries
            if e.peer_id != self.node_id
            and e.groups > 0
            and not self.reputation.is_ignored(e.peer_id)
            and len(self._used.get((e.peer_id, e.round), ())) < e.groups
        ]

    def _choose(self, entries: list[IndexEntry], rng: random.Random) -> list[IndexEntry]:
        """Up to records_per_gather peers whose records we fetch.

        Records none of whose groups we used come first. Among them, trusted peers (earlier
        records gave good groups) fill all but a third of the slots and the rest explore
        unknown peers, unstruck ones first, then those running a DHT node we know (a Sybil
        identity costs nothing, a live node does), then those claiming signal; leftover slots take whatever remains
        (partly used records last). A flood of fresh identities can take the exploring slots,
        never the trusted ones; struck ones lose even those to unstruck newcomers.
        """
        limit = self.cfg.records_per_gather
        usable = self._usable(entries)
        rng.shuffle(usable)
        live = self._live_peers()
        fresh = [e for e in usable if (e.peer_id, e.round) not in self._used]
        stale = [e for e in usable if (e.peer_id, e.round) in self._used]
        # a record announced without signal can only give receipts: after those that may train
        trusted = sorted(
            (e for e in fresh if self.reputation.is_trusted(e.peer_id)), key=lambda e: e.signal_groups == 0
        )
        unknown = sorted(
            (e for e in fresh if not self.reputation.is_trusted(e.peer_id)),
            key=lambda e: (self.reputation.is_suspect(e.peer_id), e.peer_id not in live, e.signal_groups == 0),
        )
        explore = max(1, limit // 3)
        first = trusted[: limit - explore] + unknown[:explore]
        rest = trusted[limit - explore :] + unknown[explore:] + stale
        return (first + rest)[:limit]

    def _verify_peer_record_guarded(
        self, entry: IndexEntry, values: Any, limits: VerifyLimits = VerifyLimits()
    ) -> list[Group]:
        """`_verify_peer_record`, and a strike instead of an exception if anything in it breaks on
        what this peer sent (a bug of ours that a peer's bytes trigger must not stop the round)."""
        try:
            return self._verify_peer_record(entry, values, limits)
        except Interrupted:
            raise
        except Exception as e:
            self._figures["verify_errors"] += 1
            self.reputation.observe(entry.peer_id, Counter({"verify_error": 1}), True)
            log.warning(
                f"swarm: verifying peer {node_name(entry.peer_id)}'s record failed "
                f"({type(e).__name__}: {e}); its record is dropped"
            )
            return []

    def _verify_peer_record(self, entry: IndexEntry, values: Any, limits: VerifyLimits = VerifyLimits()) -> list[Group]:
        from sapo_core.swarm.validation import owner_peer_id

        f = self._figures
        peer = entry.peer_id
        payload = next((v for sub, (v, _) in _values_of(values, with_subkeys=True) if owner_peer_id(sub) == peer), None)
        rejected: Counter = Counter()
        accepted: list[Group] = []
        junk = useless = neutral = False
        if payload is None:  # an index entry naming a record that is not there: a ghost, or lost
            f["records_missing"] += 1
            rejected["record_missing"] += 1
            useless = True
        else:
            f["records"] += 1
            f["bytes_in"] += len(payload)
            try:
                record = decode_record(payload, self.cfg.swarm_name)
                if record.window != entry.window or record.peer_id != peer:
                    raise RecordError("wrong_key", "record is not the one its key names")
            except RecordError as e:
                rejected[e.reason] += 1
                junk = True
            else:
                accepted, junk, useless, neutral = self._judge_record(entry, record, limits, rejected)
        for reason, n in rejected.items():
            f[f"rejected/{reason}"] += n
        if self.reputation.observe(peer, rejected, junk, accepted=len(accepted), useless=useless, neutral=neutral):
            log.warning(
                f"swarm: ignoring peer {node_name(peer)} ({peer}) for "
                f"{self.cfg.ignore_minutes:g} min: it keeps sending junk or nothing useful"
            )
        elif junk:
            log.warning(
                f"swarm: peer {node_name(peer)} sent junk: "
                + ", ".join(f"{n} {r}" for r, n in sorted(rejected.items()))
            )
        return accepted

    def _judge_record(
        self, entry: IndexEntry, record: Record, limits: VerifyLimits, rejected: Counter
    ) -> tuple[list[Group], bool, bool, bool]:
        """(accepted groups, junk, useless, neutral) of a decoded record; rejections added to
        `rejected`. Neutral: nothing trainable, as its index entry said (an honest node whose
        round had no group with signal: most rounds of a small model); it neither earns nor
        costs the peer anything. Only a record that promised signal and held none is useless."""
        f = self._figures
        if record.round != entry.round:  # the entry says fresh, the record is an old one
            rejected["wrong_round"] += 1
            return [], False, True, False
        f["received"] += len(record.groups)
        verdict = verify_record(record, self.tasks, entry.peer_id, limits)
        rejected.update(verdict.rejected)
        f["completions_cut"] += verdict.cut
        f["logprobs_unaligned"] += verdict.unaligned
        f["duplicates_collapsed"] += verdict.duplicates
        f["verify_cpu_s"] += verdict.cpu_seconds
        junk = verdict.junk
        useless = neutral = False
        if not junk and not verdict.accepted and "over_deadline" not in verdict.rejected:
            if entry.signal_groups > 0:
                useless = True  # it promised signal and holds none (zero advantage, duplicates only...)
                rejected["no_signal"] += 1
            else:
                # announced as holding nothing with signal, and so it is: read for its receipts (or
                # a last free slot), not a strike. Before, such honest records were half strikes,
                # and with a small model (~2 rounds in 3 without signal) sharing nodes ignored
                # each other: 0.17 peer groups per round instead of 1 after 60 rounds of
                # sapo-experiment
                neutral = True
                f["records_without_signal"] += 1
        if entry.signal_groups > 2 * len(verdict.accepted) + 2 and "over_deadline" not in verdict.rejected:
            useless = True  # its index entry promised signal the record does not hold
            rejected["index_lied"] += 1
        if not junk:
            for receipt in record.receipts:
                if receipt[0] == self.node_id:
                    self._receipts.add((entry.peer_id, receipt[1], receipt[2]))
        return verdict.accepted, junk, useless, neutral


class _CachedQuestions:
    """The verifier's TaskSet with regenerated questions remembered: a record repeating one
    question (64 copies of a slow bf item) costs one regeneration."""

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


def newer_version(theirs: str, ours: str) -> bool:
    """Whether version `theirs` is later than `ours` (release numbers compared as integers; a
    suffix such as '+local' or '-rc1' is ignored, and anything unparseable is never newer)."""

    def release(v: str) -> tuple[int, ...] | None:
        head = v.split("+", 1)[0].split("-", 1)[0]
        parts = head.split(".")
        return tuple(int(p) for p in parts) if all(p.isdigit() for p in parts) and parts else None

    a, b = release(theirs), release(ours)
    return a is not None and b is not None and a > b


def version_notice(theirs: str, ours: str, seen: set[str], limit: int = 16) -> str | None:
    """What to tell the volunteer the first time a peer announces a newer version (`seen` holds
    those told, at most `limit`); None when there is nothing new to say. A version only helps a
    person decide: nothing a peer claims here changes what we accept from it."""
    if not newer_version(theirs, ours) or theirs in seen or len(seen) >= limit:
        return None
    seen.add(theirs)
    return (
        f"runs SAPO Swarm {theirs}, this node {ours}: update when you can (the installer, or the app's "
        "update); this version goes on sharing with it meanwhile"
    )


def open_swarm(
    cfg: SwarmConfig,
    tasks: QuestionSource,
    identity_dir: Path,
    hooks: RoundHooks | None = None,
    cutter: CompletionCutter | None = None,
) -> RolloutSource:
    """The node's rollout source: `NoSwarm` if sharing is off, else a started DHT source.

    Raises `SwarmError` (readable) if the DHT cannot start; a swarm without reachable peers is
    not an error (the node trains alone and keeps trying to join).
    """
    hooks = hooks or NullHooks()
    if not cfg.enabled:
        return NoSwarm()
    from sapo_core.swarm.dht import SwarmDHT
    from sapo_core.swarm.validation import ReasonCounter

    identity = load_or_create_identity(
        Path(cfg.identity_path) if cfg.identity_path else Path(identity_dir) / KEY_FILE_NAME
    )
    log.info(f"swarm: this node is {identity.name} ({identity.peer_id})")
    keyspace = KeySpace(cfg.swarm_name, cfg.window_seconds, cfg.shards)
    dht = SwarmDHT(cfg, identity, keyspace, ReasonCounter())
    dht.start()
    source = DhtRolloutSource(cfg, tasks, identity, dht, hooks, cutter=cutter)
    if cfg.page_port:
        from sapo_core.swarm.page import start_page

        join = [source.join_address] if source.join_address else []
        try:
            args = (dht, keyspace, tasks, identity, join, cfg.page_host, cfg.page_port)
            page = start_page(*args, data_dir=identity_dir, own=source.own_figures)
            source.page = page
            log.info(f"swarm: the swarm's page, as this node sees it: {source.page.url}")
        except OSError as e:  # the node trains without its page
            log.warning(f"swarm: the swarm's page cannot listen on {cfg.page_host}:{cfg.page_port} ({e})")
    return source
