"""What a seed (or a node that opts in) sees of its swarm: the figures of the swarm's page.

`SwarmObserver.poll()` reads the index of the readable windows (every shard, at most
`MAX_INDEX_KEYS` keys a poll, the rest on the next), remembers each node it finds (its name,
version, model and self-reported held-out figure, from its index entries), then fetches up to
`records_per_poll` records it has not examined yet (newest round per peer, the peers examined
longest ago first) and verifies them as a node would (verify.py; scored whole, a seed has no
tokenizer): groups verified (a node could train on them) and refused by reason, and the
receipts the record carries, which build the contribution board (whose groups other nodes
trained on, and how often).

Bounded whatever the swarm sends: at most `max_nodes` peers remembered (the longest unseen
forgotten first), a fixed number of (peer, round) records examined a poll and remembered, CPU
per record (`VerifyLimits.cpu_seconds`), hourly history kept for `HISTORY_HOURS`. Nothing a
peer sends raises out of `poll()`: a payload that fails to decode is counted by reason and
dropped. The page's JSON is built once a poll, never per request (page.py serves it).

Self-reported figures (model, held-out solve rate) are what each node says about itself in
its signed index entries: shown as such, never checked (a seed cannot evaluate a model).
"""

from __future__ import annotations

import json
import logging
import statistics
import threading
import time
from collections import Counter, OrderedDict, deque
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sapo_core.swarm.identity import node_name
from sapo_core.swarm.keys import KeySpace, values_of
from sapo_core.swarm.records import IndexEntry, RecordError, decode_index, decode_record
from sapo_core.swarm.verify import JUNK_REASONS, QuestionSource, VerifyLimits, verify_record

log = logging.getLogger(__name__)

MAX_INDEX_KEYS = 256  # index keys read a poll (2 windows x 128 shards)
HISTORY_HOURS = 24 * 30  # a month of hourly points
HISTORY_FILE = "page-history.json"
NODES_SHOWN = 200  # rows of the nodes table (the JSON and the page); the rest are counted
BOARD_SHOWN = 50
_CONSUMERS_KEPT = 256  # distinct nodes remembered per producer on the board


@dataclass
class NodeSeen:
    peer_id: str
    first_seen: float
    last_seen: float = 0.0
    last_round: int = 0
    app_version: str = ""
    model: str = ""
    held_out: tuple[int, float, int] | None = None
    rounds: int = 0  # distinct rounds announced while we watched
    verified: int = 0  # its groups we verified as trainable
    refused: Counter = field(default_factory=Counter)
    trained_on: int = 0  # receipts naming its groups, from other nodes' records
    consumers: set[str] = field(default_factory=set)
    last_examined: float = 0.0


class SwarmObserver:
    def __init__(
        self,
        dht: Any,
        keyspace: KeySpace,
        tasks: QuestionSource,
        about: dict[str, Any],
        history_path: Path | None = None,
        dht_clock: Callable[[], float] | None = None,
        clock: Callable[[], float] = time.time,
        max_nodes: int = 4096,
        records_per_poll: int = 16,
        cpu_per_record: float = 0.5,
        timeout: float = 10.0,
    ) -> None:
        """`dht`: a started SwarmDHT (get_many); `about`: what the page says of its host (swarm,
        name, peer id, join addresses, version); `history_path`: where the hourly history
        survives a restart (None: kept in memory only)."""
        if dht_clock is None:
            from hivemind.utils import get_dht_time as dht_clock
        self.dht, self.keyspace, self.tasks, self.about = dht, keyspace, tasks, dict(about)
        self.history_path = history_path
        self._dht_clock, self._clock = dht_clock, clock
        self.max_nodes, self.records_per_poll = max_nodes, records_per_poll
        self.limits = VerifyLimits(cpu_seconds=cpu_per_record)
        self.timeout = timeout
        self.nodes: OrderedDict[str, NodeSeen] = OrderedDict()  # least recently seen first
        self._pending: dict[str, IndexEntry] = {}  # peer -> newest entry not examined yet
        self._examined: OrderedDict[tuple[str, int], None] = OrderedDict()
        self._rounds_seen: OrderedDict[tuple[str, int], None] = OrderedDict()
        self._events: deque[tuple[float, int]] = deque(maxlen=200_000)  # (time, groups) of new rounds
        self.verified = 0
        self.rounds_seen = self.groups_seen = 0  # since the page started: /metrics' counters
        self.refused: Counter = Counter()
        self.undecodable: Counter = Counter()  # index entries and records that failed to decode
        self._shard_pos = 0
        self._history: list[dict[str, Any]] = self._load_history()
        self._hour: dict[str, Any] = self._new_hour(self._clock())
        self._saved = 0.0
        self._lock = threading.Lock()
        self._status: dict[str, Any] = {}
        self.polls = 0
        self.started = self._clock()
        self._render()

    # --- reading the swarm ----------------------------------------------------------------------

    def poll(self) -> None:
        """One look at the swarm: the index, then a few records. Never raises for what peers
        send; a DHT that fails is logged and the next poll tries again."""
        try:
            self._read_index()
            self._examine_records()
        except Exception as e:  # the DHT's own failure (a peer's bytes are handled below)
            log.warning(f"swarm page: reading the swarm failed ({type(e).__name__}: {e}); trying again")
        self.polls += 1
        self._roll_hour()
        self._render()
        if self._clock() - self._saved >= 300:
            self._save_history()

    def _read_index(self) -> None:
        windows = self.keyspace.readable_windows(self._dht_clock())
        shards = self.keyspace.shards
        per_poll = max(1, MAX_INDEX_KEYS // len(windows))
        batch = [(self._shard_pos + i) % shards for i in range(min(shards, per_poll))]
        self._shard_pos = (self._shard_pos + len(batch)) % shards
        keys = {self.keyspace.index_key(w, s): (w, s) for w in windows for s in batch}
        found = self.dht.get_many(list(keys), timeout=self.timeout)
        for key, values in found.items():
            if key not in keys:
                continue
            window, shard = keys[key]
            for payload, _ in values_of(values):
                try:
                    entry = decode_index(payload, self.keyspace.swarm_name)
                except RecordError as e:
                    self.undecodable[f"index_{e.reason}"] += 1
                    continue
                except Exception:  # decode_index raises only RecordError; never let a peer crash us
                    self.undecodable["index_malformed"] += 1
                    continue
                if (entry.window, entry.shard) != (window, shard):
                    self.undecodable["index_wrong_key"] += 1
                    continue
                self._saw(entry)

    def _saw(self, entry: IndexEntry) -> None:
        now = self._clock()
        node = self.nodes.get(entry.peer_id)
        if node is None:
            node = self.nodes[entry.peer_id] = NodeSeen(entry.peer_id, first_seen=now)
            while len(self.nodes) > self.max_nodes:
                gone, _ = self.nodes.popitem(last=False)
                self._pending.pop(gone, None)
        self.nodes.move_to_end(entry.peer_id)
        node.last_seen = now
        if entry.round >= node.last_round:
            node.last_round = entry.round
            node.app_version = entry.app_version or node.app_version
            node.model = entry.model or node.model
            if entry.held_out is not None:
                node.held_out = entry.held_out
                if len(self._hour["held_out"]) < self.max_nodes:
                    self._hour["held_out"][entry.peer_id] = entry.held_out[1]
        if len(self._hour["peers"]) < self.max_nodes:
            self._hour["peers"][entry.peer_id] = None
        seen = (entry.peer_id, entry.round)
        if seen not in self._rounds_seen:
            self._rounds_seen[seen] = None
            _trim(self._rounds_seen, 4 * self.max_nodes)
            node.rounds += 1
            self.rounds_seen += 1
            self.groups_seen += entry.groups
            self._events.append((now, entry.groups))
            self._hour["rounds"] += 1
            self._hour["groups"] += entry.groups
        if seen not in self._examined:
            old = self._pending.get(entry.peer_id)
            if old is None or (entry.window, entry.round) > (old.window, old.round):
                self._pending[entry.peer_id] = entry

    def _examine_records(self) -> None:
        order = sorted(self._pending.values(), key=lambda e: self.nodes[e.peer_id].last_examined)
        todo = order[: self.records_per_poll]
        if not todo:
            return
        keys = {self.keyspace.record_key(e.window, e.peer_id): e for e in todo}
        found = self.dht.get_many(list(keys), timeout=self.timeout)
        from sapo_core.swarm.validation import owner_peer_id

        now = self._clock()
        for key, entry in keys.items():
            node = self.nodes.get(entry.peer_id)
            if node is None:
                continue
            values = values_of(found.get(key), with_subkeys=True)
            payload = next((v for sub, (v, _) in values if owner_peer_id(sub) == entry.peer_id), None)
            if payload is None:
                continue  # not (yet) replicated where we looked: tried again next poll
            del self._pending[entry.peer_id]
            self._examined[(entry.peer_id, entry.round)] = None
            _trim(self._examined, 4 * self.max_nodes)
            node.last_examined = now
            self._judge(node, entry, payload)

    def _judge(self, node: NodeSeen, entry: IndexEntry, payload: bytes) -> None:
        try:
            record = decode_record(payload, self.keyspace.swarm_name)
            if record.window != entry.window or record.peer_id != entry.peer_id or record.round != entry.round:
                raise RecordError("wrong_key", "record is not the one its index entry names")
            verdict = verify_record(record, self.tasks, entry.peer_id, self.limits)
        except RecordError as e:
            self.undecodable[e.reason] += 1
            node.refused[e.reason] += max(1, entry.groups)
            self.refused[e.reason] += max(1, entry.groups)
            self._hour["refused"] += max(1, entry.groups)
            return
        except Exception as e:  # a bug of ours that a peer's bytes trigger: counted, never raised
            log.warning(f"swarm page: verifying {node_name(entry.peer_id)}'s record failed ({type(e).__name__})")
            self.undecodable["verify_error"] += 1
            return
        node.verified += len(verdict.accepted)
        node.refused.update(verdict.rejected)
        self.verified += len(verdict.accepted)
        self.refused.update(verdict.rejected)
        self._hour["verified"] += len(verdict.accepted)
        self._hour["refused"] += sum(verdict.rejected.values())
        if verdict.junk:
            return  # a junk record's receipts are not believed either
        for producer, _round, _index in record.receipts:
            if producer == entry.peer_id:
                continue
            p = self.nodes.get(producer)
            if p is None:
                continue  # a node we never saw publish: not on the board
            p.trained_on += 1
            if len(p.consumers) < _CONSUMERS_KEPT:
                p.consumers.add(entry.peer_id)

    # --- history ----------------------------------------------------------------------------------

    @staticmethod
    def _new_hour(now: float) -> dict[str, Any]:
        zero = {"rounds": 0, "groups": 0, "verified": 0, "refused": 0}
        return {"hour": int(now // 3600), "peers": {}, "held_out": {}, **zero}

    def _roll_hour(self) -> None:
        now = self._clock()
        if int(now // 3600) == self._hour["hour"]:
            return
        self._history.append(_closed(self._hour))
        del self._history[:-HISTORY_HOURS]
        self._hour = self._new_hour(now)
        self._save_history()

    def _load_history(self) -> list[dict[str, Any]]:
        if self.history_path is None or not self.history_path.exists():
            return []
        try:
            rows = json.loads(self.history_path.read_text())
            keys = ("hour", "nodes", "rounds", "groups", "verified", "refused")
            good = [
                r
                for r in rows
                if isinstance(r, dict)
                and all(isinstance(r.get(k), int) and r[k] >= 0 for k in keys)
                and (r.get("held_out_median") is None or isinstance(r["held_out_median"], (int, float)))
            ]
            return sorted(good, key=lambda r: r["hour"])[-HISTORY_HOURS:]
        except (OSError, ValueError, TypeError) as e:
            log.warning(f"swarm page: history {self.history_path} unreadable ({e}); starting a new one")
            return []

    def save(self) -> None:
        """The hourly history, with the current hour as it stands (a stop keeps it)."""
        self._history.append(_closed(self._hour))
        try:
            self._save_history()
        finally:
            self._history.pop()

    def _save_history(self) -> None:
        self._saved = self._clock()
        if self.history_path is None:
            return
        from sapo_core.fsutil import atomic_write_bytes

        try:
            atomic_write_bytes(self.history_path, json.dumps(self._history).encode())
        except OSError as e:  # a full disk costs the history's newest hours, never the seed
            log.warning(f"swarm page: could not save the history ({e})")

    # --- what the page shows ------------------------------------------------------------------

    def status(self) -> dict[str, Any]:
        """The figures of the last poll (the /api/status JSON)."""
        with self._lock:
            return self._status

    def _render(self) -> None:
        now = self._clock()
        while self._events and self._events[0][0] < now - 3600:
            self._events.popleft()
        recent_after = now - 2 * self.keyspace.window_seconds
        last_window = [g for t, g in self._events if t >= now - self.keyspace.window_seconds]
        recent = [n for n in self.nodes.values() if n.last_seen >= recent_after]
        newest = list(reversed(self.nodes.values()))
        board = sorted((n for n in self.nodes.values() if n.trained_on), key=lambda n: -n.trained_on)
        status = {
            **self.about,
            "generated": now,
            "watching_since": self.started,
            "window_seconds": self.keyspace.window_seconds,
            "nodes_recent": len(recent),
            "nodes_known": len(self.nodes),
            "rounds_last_hour": len(self._events),  # counted, not extrapolated: a new seed says less
            "groups_last_hour": sum(g for _, g in self._events),
            "rounds_last_window": len(last_window),
            "groups_last_window": sum(last_window),
            "rounds_seen": self.rounds_seen,
            "groups_seen": self.groups_seen,
            "groups_verified": self.verified,
            "groups_refused": dict(sorted(self.refused.items(), key=lambda kv: -kv[1])),
            "junk_reasons": sorted(r for r in self.refused if r in JUNK_REASONS),
            "undecodable": dict(self.undecodable),
            "models": dict(Counter(n.model or "unknown" for n in recent).most_common()),
            "versions": dict(Counter(n.app_version or "unknown" for n in recent).most_common()),
            "nodes": [_node_row(n, now) for n in newest[:NODES_SHOWN]],
            "nodes_not_shown": max(0, len(newest) - NODES_SHOWN),
            "board": [
                {
                    "name": node_name(n.peer_id),
                    "peer_id": n.peer_id,
                    "trained_on": n.trained_on,
                    "by_nodes": len(n.consumers),
                }
                for n in board[:BOARD_SHOWN]
            ],
            "history": [*self._history, _closed(self._hour)],
            "polls": self.polls,
        }
        with self._lock:
            self._status = status


def _node_row(n: NodeSeen, now: float) -> dict[str, Any]:
    ho = n.held_out
    return {
        "name": node_name(n.peer_id),
        "peer_id": n.peer_id,
        "model": n.model,
        "app_version": n.app_version,
        "last_round": n.last_round,
        "seconds_since_seen": round(now - n.last_seen, 1),
        "rounds_seen": n.rounds,
        "groups_verified": n.verified,
        "groups_refused": sum(n.refused.values()),
        "held_out": None
        if ho is None
        else {"after_round": ho[0], "solve_rate": ho[1], "completions": ho[2], "self_reported": True},
    }


def _closed(hour: dict[str, Any]) -> dict[str, Any]:
    rates = list(hour["held_out"].values())
    return {
        "hour": hour["hour"],
        "nodes": len(hour["peers"]),
        "rounds": hour["rounds"],
        "groups": hour["groups"],
        "verified": hour["verified"],
        "refused": hour["refused"],
        "held_out_median": round(statistics.median(rates), 3) if rates else None,
    }


def _trim(d: OrderedDict, size: int) -> None:
    while len(d) > size:
        d.popitem(last=False)
