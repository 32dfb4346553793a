"""Where a round's external groups come from: the `RolloutSource` protocol and its two sources.

- `NoSwarm`: training alone (publishes nothing, gathers nothing).
- `DhtRolloutSource`: publishes our groups into the swarm's DHT and gathers verified groups
  from peers (keys.py has the key space, records.py the wire format, validation.py the DHT's
  validators, verify.py the checks on receipt, dht.py the DHT thread).

A gather, step by step: list index shards of the current and previous windows (a random few
first, the rest only while too few peers turned up); choose up to `records_per_gather`
peers, never ourselves nor an ignored peer, preferring records not taken before; fetch their
records; verify every group (verify.py); sample J uniformly from what passed. Everything
that can fail on the network is bounded by `gather_timeout` and costs only its records.
"""

from __future__ import annotations

import dataclasses
import math
import random
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any, Protocol, Sequence

from sapo_core.config import SwarmConfig
from sapo_core.hooks import NullHooks, RoundHooks
from sapo_core.rollouts import Group
from sapo_core.swarm.identity import KEY_FILE_NAME, NodeIdentity, load_or_create_identity, node_name
from sapo_core.swarm.keys import KeySpace
from sapo_core.swarm.records import (
    IndexEntry, Record, RecordError, decode_index, decode_record, encode_index, encode_record, fit_record,
)
from sapo_core.swarm.verify import PeerReputation, QuestionSource, sample_groups, verify_record


REPUBLISH_WINDOWS = 2  # how long a round may outlast its window and stay readable


class RolloutSource(Protocol):
    def publish(self, round: int, groups: Sequence[Group]) -> None:
        """Share our scored local groups of this round."""

    def gather(self, round: int, want: int, rng: random.Random) -> list[Group]:
        """Up to `want` peers' groups: verified, re-scored by us, zero-advantage dropped,
        sampled uniformly; `source` is the peer id; `token_ids` None (the node re-tokenises)."""

    def stats(self) -> dict[str, float]:
        """This round's figures, namespaced `swarm/...`, for the store row."""

    def close(self) -> None: ...


class NoSwarm:
    """Training alone: nothing goes out, nothing comes in."""

    node_id = "alone"

    def publish(self, round: int, groups: Sequence[Group]) -> None:
        return None

    def gather(self, round: int, want: int, rng: random.Random) -> list[Group]:
        return []

    def stats(self) -> dict[str, float]:
        return {}

    def close(self) -> None:
        return None


class DhtRolloutSource:
    """Publishes to and gathers from the swarm's DHT (a started `SwarmDHT`)."""

    def __init__(self, cfg: SwarmConfig, tasks: QuestionSource, identity: NodeIdentity, dht: Any,
                 hooks: RoundHooks | None = None, clock: Any = None) -> None:
        from hivemind.utils import get_dht_time

        self.cfg = cfg
        self.tasks = tasks
        self.identity = identity
        self.dht = dht
        self.keyspace: KeySpace = dht.keyspace
        self.hooks = hooks or NullHooks()
        self._clock = clock or get_dht_time
        self.reputation = PeerReputation(cfg.strikes_to_ignore, cfg.ignore_minutes * 60.0)
        self._taken: dict[str, int] = {}  # peer -> newest round whose record we already used
        self._round: int | None = None
        self._figures: Counter = Counter()
        self._dht_rejections_before: dict[str, int] = {}
        self._entries_per_key: float | None = None  # moving average over gathers
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
            self._round = round
            self._figures = Counter()
            self._dht_rejections_before = self.dht.dht_rejections.snapshot()

    def publish(self, round: int, groups: Sequence[Group]) -> None:
        self._begin(round)
        started = time.perf_counter()
        now = self._clock()
        window = self.keyspace.window_at(now)
        fitted = fit_record(self.cfg.swarm_name, window, self.node_id, round, groups,
                            self.cfg.max_record_kib * 1024)
        items = self._items(fitted.record, fitted.signal_groups, now)
        if fitted.dropped_groups or fitted.dropped_completions:
            self.hooks.log("info", f"swarm: record cut to {self.cfg.max_record_kib} KiB: {fitted.dropped_groups} "
                                   f"group(s), {fitted.dropped_completions} completion(s) left out")
        f = self._figures
        try:
            ok = self.dht.store(items, timeout=self.cfg.publish_timeout)
            f["publish_failed"] += sum(not v for v in ok.values())
        except Exception as e:  # the round goes on without sharing this time
            f["publish_failed"] += 2
            self._dht_failed(f"publishing round {round}", e)
        with self._latest_lock:
            self._latest = (fitted.record, fitted.signal_groups, window)
        f["published"] += len(fitted.record.groups)
        f["published_signal"] += fitted.signal_groups
        f["dropped_to_fit"] += fitted.dropped_groups
        f["bytes_out"] += sum(len(payload) for _, payload, _ in items)
        f["publish_s"] += time.perf_counter() - started

    def gather(self, round: int, want: int, rng: random.Random) -> list[Group]:
        self._begin(round)
        if want <= 0:
            return []
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
            found = self.dht.get_many(list(keys.values()), timeout=max(0.1, deadline - time.perf_counter()),
                                      newer_than=newer_than)
        except Exception as e:
            found = {}
            self._dht_failed("fetching peers' records", e)
        verify_started = time.perf_counter()
        f["fetch_s"] += verify_started - fetch_started
        pool: list[Group] = []
        for i, entry in enumerate(chosen):
            self.hooks.checkpoint()
            self.hooks.progress("gather", i, len(chosen), peer=node_name(entry.peer_id))
            pool.extend(self._verify_peer_record(entry, found.get(keys[entry.peer_id], {})))
        f["verify_s"] += time.perf_counter() - verify_started
        out = sample_groups(pool, want, rng)
        for g in out:
            self._taken[g.source] = max(self._taken.get(g.source, -1), g.round)
        f["accepted"] += len(pool)
        f["used"] += len(out)
        f["gather_s"] += time.perf_counter() - started
        return out

    def stats(self) -> dict[str, float]:
        f = self._figures
        out = {f"swarm/{k}": float(v) for k, v in f.items() if not k.startswith("rejected/")}
        for k, v in f.items():
            if k.startswith("rejected/"):
                out[f"swarm/{k}"] = float(v)
        for name in ("published", "received", "accepted", "used", "records", "bytes_out", "bytes_in",
                     "publish_s", "gather_s"):
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
        self.dht.close()

    def _items(self, record: Record, signal_groups: int, now: float) -> list[tuple[str, bytes, float]]:
        """The record and its index entry, ready to store: (key, payload, expiration) each."""
        window = record.window
        payload = encode_record(record)
        shard = self.keyspace.shard_of(self.node_id, window)
        index = encode_index(IndexEntry(self.cfg.swarm_name, window, shard, self.node_id, record.round,
                                        len(record.groups), signal_groups, len(payload)))
        expiration = self.keyspace.expiration(now)
        return [(self.keyspace.record_key(window, self.node_id), payload, expiration),
                (self.keyspace.index_key(window, shard), index, expiration)]

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
            self.hooks.log("warning", f"swarm: {what} timed out ({error})")
        else:
            self._figures["dht_errors"] += 1
            self.hooks.log("warning", f"swarm: {what} failed: {type(error).__name__}: {error}")

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

        Shards in a random order, in batches that double (k, k, 2k, ...) until enough usable
        peers turned up, every peer in our routing table did, the shards run out or the
        deadline passes.
        """
        windows = self.keyspace.readable_windows(self._clock())
        order = rng.sample(range(self.keyspace.shards), self.keyspace.shards)
        entries: dict[str, tuple[IndexEntry, float]] = {}
        seen_peers: set[str] = set()
        f = self._figures
        pos, size = 0, self._first_batch()
        while pos < len(order) and time.perf_counter() < deadline:
            if len(self._usable(e for e, _ in entries.values())) >= self.cfg.records_per_gather:
                break
            if seen_peers and len(seen_peers) >= self.dht.num_peers():
                break  # every peer we know of has turned up: a small swarm has nothing more to find
            batch, pos = order[pos:pos + size], pos + size
            size = max(size, pos)  # k, k, 2k, 4k ...
            keys = {self.keyspace.index_key(w, s): (w, s) for w in windows for s in batch}
            try:
                found = self.dht.get_many(list(keys), timeout=max(0.1, deadline - time.perf_counter()),
                                          beam_size=2 * self.cfg.replicas)
            except Exception as e:
                self._dht_failed("reading the index", e)
                break
            f["index_keys"] += len(keys)
            for key, values in found.items():
                window, shard = keys[key]
                for payload, expiration in values.values():
                    f["bytes_in"] += len(payload)
                    f["index_entries"] += 1
                    try:
                        entry = decode_index(payload, self.cfg.swarm_name)
                    except RecordError as e:  # the DHT validated it already: only a broken peer gets here
                        f[f"rejected/index_{e.reason}"] += 1
                        continue
                    if entry.window != window or entry.shard != shard:
                        f["rejected/index_wrong_key"] += 1
                        continue
                    if entry.peer_id != self.node_id:
                        seen_peers.add(entry.peer_id)
                    old = entries.get(entry.peer_id)
                    if old is None or (entry.window, entry.round) > (old[0].window, old[0].round):
                        entries[entry.peer_id] = (entry, expiration)
        f["peers"] = len(seen_peers)
        if f["index_keys"]:
            observed = f["index_entries"] / f["index_keys"]
            old = self._entries_per_key
            self._entries_per_key = observed if old is None else 0.5 * old + 0.5 * observed
        return entries

    def _usable(self, entries: Any) -> list[IndexEntry]:
        return [e for e in entries if e.peer_id != self.node_id and e.groups > 0
                and not self.reputation.is_ignored(e.peer_id)]

    def _choose(self, entries: list[IndexEntry], rng: random.Random) -> list[IndexEntry]:
        """Up to records_per_gather peers whose records we fetch.

        Records not taken before come first. Among them, trusted peers (earlier records gave
        good groups) fill all but a third of the slots and the rest explore unknown peers, those
        claiming signal first; leftover slots take whatever remains. A flood of fresh
        identities can take the exploring slots, never the trusted ones.
        """
        limit = self.cfg.records_per_gather
        usable = self._usable(entries)
        rng.shuffle(usable)
        fresh = [e for e in usable if e.round > self._taken.get(e.peer_id, -1)]
        stale = [e for e in usable if e.round <= self._taken.get(e.peer_id, -1)]
        trusted = [e for e in fresh if self.reputation.is_trusted(e.peer_id)]
        unknown = sorted((e for e in fresh if not self.reputation.is_trusted(e.peer_id)),
                         key=lambda e: e.signal_groups == 0)  # stable: the shuffle stays within each
        explore = max(1, limit // 3)
        first = trusted[:limit - explore] + unknown[:explore]
        rest = trusted[limit - explore:] + unknown[explore:] + stale
        return (first + rest)[:limit]

    def _verify_peer_record(self, entry: IndexEntry, values: dict[bytes, tuple[bytes, float]]) -> list[Group]:
        from sapo_core.swarm.validation import owner_peer_id

        f = self._figures
        peer = entry.peer_id
        payload = next((v for sub, (v, _) in values.items() if owner_peer_id(sub) == peer), None)
        if payload is None:
            f["records_missing"] += 1
            return []
        f["records"] += 1
        f["bytes_in"] += len(payload)
        rejected: Counter = Counter()
        try:
            record = decode_record(payload, self.cfg.swarm_name)
            if record.window != entry.window or record.peer_id != peer:
                raise RecordError("wrong_key", "record is not the one its key names")
        except RecordError as e:
            rejected[e.reason] += 1
            accepted: list[Group] = []
            junk = True
        else:
            f["received"] += len(record.groups)
            verdict = verify_record(record, self.tasks, peer)
            rejected, accepted, junk = verdict.rejected, verdict.accepted, verdict.junk
        for reason, n in rejected.items():
            f[f"rejected/{reason}"] += n
        if self.reputation.observe(peer, rejected, junk, accepted=len(accepted)):
            self.hooks.log("warning", f"swarm: ignoring peer {node_name(peer)} ({peer}) for "
                                      f"{self.cfg.ignore_minutes:g} min: it keeps sending junk")
        elif junk:
            self.hooks.log("warning", f"swarm: peer {node_name(peer)} sent junk: "
                                      + ", ".join(f"{n} {r}" for r, n in sorted(rejected.items())))
        return accepted


def open_swarm(cfg: SwarmConfig, tasks: QuestionSource, identity_dir: Path,
               hooks: RoundHooks | None = None) -> RolloutSource:
    """The node's rollout source: `NoSwarm` if sharing is off, else a started DHT source.

    Raises `SwarmError` (readable) if the DHT cannot start; a swarm without reachable peers is
    not an error (the node trains alone and keeps trying to join).
    """
    hooks = hooks or NullHooks()
    if not cfg.enabled:
        return NoSwarm()
    from sapo_core.swarm.dht import SwarmDHT
    from sapo_core.swarm.validation import ReasonCounter

    identity = load_or_create_identity(Path(cfg.identity_path) if cfg.identity_path
                                       else Path(identity_dir) / KEY_FILE_NAME)
    hooks.log("info", f"swarm: this node is {identity.name} ({identity.peer_id})")
    keyspace = KeySpace(cfg.swarm_name, cfg.window_seconds, cfg.shards)
    dht = SwarmDHT(cfg, identity, keyspace, ReasonCounter(), hooks.log)
    dht.start()
    return DhtRolloutSource(cfg, tasks, identity, dht, hooks)
