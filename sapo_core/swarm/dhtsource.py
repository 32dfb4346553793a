"""The swarm's rollout source: publishes our groups into the DHT, gathers verified peers' groups.

`DhtRolloutSource` runs the steps; the rules are pure functions elsewhere: publish.py (what is
published), selection.py (which peers are read, which of their groups are taken), judge.py
(what a record costs its peer), verify.py (the checks on each group); dht.py is the DHT
thread, keys.py the key space, records.py the wire format.

A gather (`DhtRolloutSource._gather`), step by step: read index shards of the current and
previous windows (`selection.read_index`); choose up to `records_per_gather` records
(`selection.choose_records`); fetch them, each search stopping at the first copy as new as its
index entry; judge each record (`judge.judge_record`: verify its groups, cut to our token limit,
duplicates collapsed, re-scored, bounded in CPU time) and apply the verdict to the peer's
reputation; drop groups already used once (`selection.unused_groups`); take J of the rest
(`selection.UniformChoice` unless `open_swarm` is given another `GroupChoice`). Everything that
can fail on the network is bounded by `gather_timeout` (verification by `verify_grace_seconds`
more) and costs only its records. Nothing a peer sends raises out of `gather()`.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections import Counter, OrderedDict
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from sapo_core import __version__ as APP_VERSION
from sapo_core.config import SwarmConfig
from sapo_core.hooks import Interrupted, NullHooks, RoundHooks
from sapo_core.rollouts import Group
from sapo_core.swarm.identity import NodeIdentity, node_name
from sapo_core.swarm.judge import RecordVerdict, judge_record, owned_payload
from sapo_core.swarm.keys import KeySpace
from sapo_core.swarm.publish import Item, fit_record, publish_items, republished
from sapo_core.swarm.records import IndexEntry, Receipt, Record
from sapo_core.swarm.selection import (
    GroupChoice,
    PeerView,
    UniformChoice,
    Wanted,
    choose_records,
    entries_per_key,
    first_batch_size,
    read_index,
    unused_groups,
)
from sapo_core.swarm.verify import CachedQuestions, CompletionCutter, PeerReputation, QuestionSource, VerifyLimits
from sapo_core.swarm.versions import newer_version, version_notice

log = logging.getLogger(__name__)

USED_MEMORY = 4096  # (peer, round) records whose used groups we remember
# figures every round's row carries, 0 when nothing happened
ALWAYS_REPORTED = (
    "published",
    "received",
    "accepted",
    "used",
    "records",
    "bytes_out",
    "bytes_in",
    "publish_s",
    "gather_s",
)


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
        choice: GroupChoice | None = None,
    ) -> None:
        """`cutter`: our tokenizer and max_new_tokens, so peers' completions are scored exactly
        as they will be trained (None: scored whole, the node re-tokenises). `choice`: which of
        the verified peer groups a gather takes (default: the paper's, `UniformChoice`)."""
        from hivemind.utils import get_dht_time

        self.cfg = cfg
        self.tasks = CachedQuestions(tasks)
        self.cutter = cutter
        self.choice: GroupChoice = choice or UniformChoice()
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

    def gather(self, round: int, want: int, rng: random.Random, need: Mapping[str, float] | None = None) -> list[Group]:
        """`need`: topic -> what our own groups lack there, for the choice (`Wanted.need`).
        Never raises for anything peers send (docs/swarm.md, 'Hostile peers'): a failure
        inside is counted as `swarm/gather_errors`, logged, and costs this round its external
        groups."""
        self._begin(round)
        if want <= 0:
            return []
        try:
            return self._gather(round, Wanted(want, dict(need or {})), rng)
        except Interrupted:
            raise
        except Exception as e:
            self._figures["gather_errors"] += 1
            log.error(f"swarm: gather failed, training on local groups only: {type(e).__name__}: {e}")
            return []

    def _gather(self, round: int, wanted: Wanted, rng: random.Random) -> list[Group]:
        """The gather's steps (module docstring); the rules are selection.py's and judge.py's."""
        started = time.perf_counter()
        deadline = started + self.cfg.gather_timeout
        f = self._figures
        entries = self._read_index(rng, deadline)
        chosen = choose_records([e for e, _ in entries.values()], self._peer_view(), self.cfg.records_per_gather, rng)
        fetch_started = time.perf_counter()
        f["index_s"] += fetch_started - started
        found = self._fetch_records(chosen, entries, deadline)
        verify_started = time.perf_counter()
        f["fetch_s"] += verify_started - fetch_started
        pool = self._verify_records(chosen, found, deadline)
        f["verify_s"] += time.perf_counter() - verify_started
        fresh = unused_groups(pool, self._used)
        f["reuse_avoided"] += len(pool) - len(fresh)
        out = self.choice(fresh, wanted, rng)
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
        for name in ALWAYS_REPORTED:
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

    # --- publishing's steps -------------------------------------------------------------------

    def own_figures(self) -> dict[str, Any]:
        """This node's round, last round time and held-out figure, for its page's /metrics."""
        return {"round": self._round, "round_seconds": self.round_seconds, "held_out": self._held_out}

    def _items(self, record: Record, signal_groups: int, now: float) -> list[Item]:
        """The record and its index entry, ready to store (publish.py)."""
        return publish_items(self.keyspace, record, signal_groups, now, self._model, self._held_out)

    def _republish_items(self) -> list[Item]:
        """Called in the DHT thread: our latest record again, in the window it is now, if the
        round that made it is still running (`publish.republished`)."""
        now = self._clock()
        with self._latest_lock:
            again = republished(self._latest, self.keyspace.window_at(now))
            if again is None:
                return []
            self._latest = again
        return self._items(again[0], again[1], now)

    def _dht_failed(self, what: str, error: Exception) -> None:
        """A DHT call timed out or failed: count it, say it, and let the round go on."""
        if isinstance(error, TimeoutError):
            self._figures["dht_timeouts"] += 1
            log.warning(f"swarm: {what} timed out ({error})")
        else:
            self._figures["dht_errors"] += 1
            log.warning(f"swarm: {what} failed: {type(error).__name__}: {error}")

    # --- gather's steps ---------------------------------------------------------------------

    def _peer_view(self) -> PeerView:
        """What we know of peers now, for selection.py's rules."""
        rep = self.reputation
        return PeerView(
            self.node_id,
            tuple(rep.trusted()),
            frozenset(rep.ignored()),
            frozenset(rep.struck()),
            frozenset(self.dht.routing_peer_ids()),
            self.dht.num_peers(),
            self._used,
        )

    def _read_index(self, rng: random.Random, deadline: float) -> dict[str, tuple[IndexEntry, float]]:
        """peer -> (newest index entry, its expiration) over the current and previous windows
        (`selection.read_index` over our DHT)."""
        view = self._peer_view()

        def read(pairs: Sequence[tuple[int, int]]) -> dict[tuple[int, int], Any]:
            keys = {self.keyspace.index_key(w, s): (w, s) for w, s in pairs}
            timeout = max(0.1, deadline - time.perf_counter())
            found = self.dht.get_many(list(keys), timeout=timeout, beam_size=2 * self.cfg.replicas)
            return {keys[k]: values for k, values in found.items() if k in keys}

        limit = self.cfg.records_per_gather
        first = first_batch_size(
            self._entries_per_key, view.known_peers, limit, self.keyspace.shards, self.cfg.shards_read
        )
        windows = self.keyspace.readable_windows(self._clock())
        got = read_index(read, self.keyspace, windows, view, rng, limit, first, deadline)
        f = self._figures
        f.update(got.figures)
        if got.error is not None:
            self._dht_failed("reading the index", got.error)
        for entry in got.announced:
            self._note_version(entry)
        f["peers"] = len(got.seen)
        f["peers_suspect"] = sum(view.is_suspect(p) for p in got.seen)
        self._entries_per_key = entries_per_key(self._entries_per_key, f["index_entries"], f["index_keys"])
        return got.entries

    def _note_version(self, entry: IndexEntry) -> None:
        """Peers that announce a newer SAPO Swarm than ours: counted (`swarm/peers_newer`) and said
        once per version, with what to do (`version_notice`)."""
        if entry.app_version and newer_version(entry.app_version, APP_VERSION):
            self._figures["peers_newer"] += 1
            said = version_notice(entry.app_version, APP_VERSION, self._newer_seen)
            if said:
                log.warning(f"swarm: peer {node_name(entry.peer_id)} {said}")

    def _fetch_records(
        self, chosen: Sequence[IndexEntry], entries: dict[str, tuple[IndexEntry, float]], deadline: float
    ) -> dict[str, Any]:
        """peer -> the values found under its record key (empty where none came in time)."""
        keys = {e.peer_id: self.keyspace.record_key(e.window, e.peer_id) for e in chosen}
        # a record is stored with its index entry's expiration: a copy that new is the one named
        newer_than = {keys[e.peer_id]: entries[e.peer_id][1] for e in chosen}
        try:
            found = self.dht.get_many(
                list(keys.values()), timeout=max(0.1, deadline - time.perf_counter()), newer_than=newer_than
            )
        except Exception as e:
            found = {}
            self._dht_failed("fetching peers' records", e)
        return {peer: found.get(key, {}) for peer, key in keys.items()}

    def _verify_records(self, chosen: Sequence[IndexEntry], found: dict[str, Any], deadline: float) -> list[Group]:
        """Every chosen record's accepted groups; verification may outlast the gather's deadline
        by the grace only, and what it has no time for is not its peer's fault."""
        limits = VerifyLimits(
            self.cutter,
            self.cfg.verify_cpu_seconds,
            deadline + self.cfg.verify_grace_seconds,
            keep_flat_right=self.cfg.take == "mixed",
        )
        pool: list[Group] = []
        for i, entry in enumerate(chosen):
            self.hooks.checkpoint()
            self.hooks.progress("gather", i, len(chosen), peer=node_name(entry.peer_id))
            if time.perf_counter() > limits.deadline:
                self._figures["records_unverified"] += len(chosen) - i
                break
            pool.extend(self._verify_peer_record_guarded(entry, found[entry.peer_id], limits))
        return pool

    def _verify_peer_record_guarded(
        self, entry: IndexEntry, values: Any, limits: VerifyLimits = VerifyLimits()
    ) -> list[Group]:
        """The record's verdict (`judge.judge_record`) applied to its peer, and a strike instead of
        an exception if anything in it breaks on what this peer sent (a bug of ours that a peer's
        bytes trigger must not stop the round)."""
        try:
            payload = owned_payload(values, entry.peer_id)
            verdict = judge_record(entry, payload, self.tasks, self.cfg.swarm_name, self.node_id, limits)
            return self._apply_verdict(entry.peer_id, verdict)
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

    def _apply_verdict(self, peer: str, verdict: RecordVerdict) -> list[Group]:
        """Count a record's verdict, keep the receipts naming us, judge its peer (PeerReputation)."""
        f = self._figures
        f.update(verdict.figures)
        for reason, n in verdict.rejected.items():
            f[f"rejected/{reason}"] += n
        self._receipts.update(verdict.receipts)
        rep = self.reputation
        if rep.observe(peer, verdict.rejected, verdict.junk, len(verdict.accepted), verdict.useless, verdict.neutral):
            log.warning(
                f"swarm: ignoring peer {node_name(peer)} ({peer}) for "
                f"{self.cfg.ignore_minutes:g} min: it keeps sending junk or nothing useful"
            )
        elif verdict.junk:
            log.warning(
                f"swarm: peer {node_name(peer)} sent junk: "
                + ", ".join(f"{n} {r}" for r, n in sorted(verdict.rejected.items()))
            )
        return verdict.accepted
