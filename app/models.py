"""Plain-Python state behind the views: no Qt here, so it is tested without a display.

- `NodeStatus`: what the node is doing now (state, its reason, round, phase, or the model's
  download on a first start), from events.
- `Series` / `RoundHistory`: every figure of every round, as growing numpy arrays, with the
  derived curves the dashboard draws (rolling mean, cumulative sum; binned for the screen in
  binning.py).
- `SwarmModel`: who this node is in the swarm and what it exchanged, summed over rounds.
The event log's model is in eventlog.py.
"""

from __future__ import annotations

import math
import time
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

import numpy as np

from sapo_core.control import protocol as P
from sapo_core.control import vocabulary as K
from sapo_core.downloads import download_text

STATE_WORDS = {
    P.STARTING: "Starting",
    P.RUNNING: "Running",
    P.PAUSING: "Pausing",
    P.PAUSED: "Paused",
    P.SNOOZED: "Snoozed",
    P.STOPPING: "Stopping",
    P.STOPPED: "Stopped",
    P.CRASHED: "Stopped on an error",
    "not started": "Not started",
}


@dataclass
class NodeStatus:
    """The node as the status bar shows it; `apply(event)` says whether anything changed."""

    state: str = "not started"
    reason: str = ""
    round: int = 0
    phase: str = ""
    done: int = 0
    total: int = 0
    until: float | None = None
    throttle: float = 1.0
    threads: int | None = None
    rss_bytes: int = 0
    model_id: str = ""
    sampler: str = ""
    run_dir: str = ""
    pid: int | None = None
    started_round: int = 0  # the round `round_started` belongs to
    round_started: float | None = None  # time.monotonic() when it began (first sign of it)
    info: dict = field(default_factory=dict)  # the last Progress's info (a download's model, size, time left)

    def round_eta(self, typical_seconds: float, now: float | None = None) -> float | None:
        """Seconds until the running round ends, from how long rounds take; None if unknown."""
        if self.state != P.RUNNING or self.round_started is None or typical_seconds <= 0:
            return None
        elapsed = (time.monotonic() if now is None else now) - self.round_started
        return max(0.0, typical_seconds - elapsed)

    def apply(self, ev: P.Message) -> bool:
        if isinstance(ev, P.State):
            self.state, self.reason, self.until = ev.state, ev.reason, ev.until
            self.round = ev.round or self.round
            if ev.state != P.RUNNING or self.downloading:  # (a download is over once the node runs)
                self.phase, self.done, self.total, self.info = "", 0, 0, {}
            return True
        if isinstance(ev, P.Progress):
            if ev.phase == K.DOWNLOAD:  # before the first round (round 0): no round has started
                self.phase, self.done, self.total, self.info = ev.phase, ev.done, ev.total, dict(ev.info)
                return True
            if ev.round and ev.round != self.started_round:
                self.started_round, self.round_started = ev.round, time.monotonic()
            self.round, self.phase, self.done, self.total = ev.round or self.round, ev.phase, ev.done, ev.total
            self.info = {}
            return True
        if isinstance(ev, P.RoundDone):
            self.round, self.phase, self.done, self.total = ev.round + 1, "", 0, 0
            self.started_round, self.round_started = ev.round + 1, time.monotonic()
            return True
        if isinstance(ev, P.Heartbeat):
            changed = (self.rss_bytes, self.throttle) != (ev.rss_bytes, ev.throttle)
            self.rss_bytes, self.throttle = ev.rss_bytes, ev.throttle
            return changed
        if isinstance(ev, P.Status):
            self.throttle, self.threads = ev.throttle, ev.threads
            return True
        if isinstance(ev, P.NodeInfo):
            self.model_id, self.sampler, self.run_dir = ev.model_id, ev.sampler, ev.run_dir
            self.round = ev.next_round
            if self.downloading:  # the model is loaded: its download is history
                self.phase, self.done, self.total, self.info = "", 0, 0, {}
            return True
        if isinstance(ev, P.Hello):
            self.pid = ev.pid
            return True
        return False

    @property
    def title(self) -> str:
        return STATE_WORDS.get(self.state, self.state.capitalize())

    @property
    def detail(self) -> str:
        """The reason, or what the round is doing: one line under the state."""
        if self.downloading:
            return download_text(self.info, self.done, self.total)
        if self.state == P.RUNNING and self.phase:
            word = K.PHASE_WORDS.get(self.phase, self.phase)
            unit = K.PHASE_UNITS.get(self.phase)
            count = (
                (f" {self.done:,} of {self.total:,} {unit}" if unit else f" {self.done}/{self.total}")
                if self.total > 1
                else ""
            )
            return f"round {self.round}: {word}{count}"
        if self.state == P.RUNNING and not self.reason:
            return f"round {self.round}" if self.round else ""
        return self.reason

    @property
    def downloading(self) -> bool:
        """The node is fetching its model (first start), or just did, or could not."""
        return self.phase == K.DOWNLOAD

    @property
    def download_fraction(self) -> float | None:
        """How much of the model is here, 0..1; None when unknown or the download failed."""
        if not self.downloading or self.total <= 0 or self.info.get("failed"):
            return None
        return min(1.0, max(0.0, self.done / self.total))

    @property
    def holding(self) -> bool:
        return self.state in (P.PAUSED, P.SNOOZED, P.PAUSING)

    @property
    def alive(self) -> bool:
        return self.state not in ("not started", P.STOPPED, P.CRASHED)


class Series:
    """(x, y) points of one figure in numpy arrays that double when full: appending is O(1)."""

    def __init__(self, capacity: int = 256) -> None:
        self._x = np.empty(capacity, dtype=np.float64)
        self._y = np.empty(capacity, dtype=np.float64)
        self.n = 0
        self._sums = np.zeros(1)  # running sums of y, [0] = 0, as far as `_summed` points
        self._summed = 0

    def append(self, x: float, y: float) -> None:
        if self.n == len(self._x):
            self._x = np.concatenate([self._x, np.empty_like(self._x)])
            self._y = np.concatenate([self._y, np.empty_like(self._y)])
        self._x[self.n], self._y[self.n] = x, y
        self.n += 1

    def extend(self, xs: Iterable[float], ys: Iterable[float]) -> None:
        xs, ys = np.asarray(list(xs), dtype=np.float64), np.asarray(list(ys), dtype=np.float64)
        need = self.n + len(xs)
        if need > len(self._x):
            size = max(need, 2 * len(self._x))
            self._x = np.concatenate([self._x[: self.n], np.empty(size - self.n)])
            self._y = np.concatenate([self._y[: self.n], np.empty(size - self.n)])
        self._x[self.n : need], self._y[self.n : need] = xs, ys
        self.n = need

    @property
    def x(self) -> np.ndarray:
        return self._x[: self.n]

    def sums(self) -> np.ndarray:
        """[0, y0, y0 + y1, ...]: n + 1 running sums, only the new points added since the last call.
        The same additions in the same order as one np.cumsum of all of y, so the same floats."""
        if self._summed != self.n:
            if len(self._sums) < self.n + 1:
                grown = np.empty(max(self.n + 1, 2 * len(self._sums)))
                grown[: self._summed + 1] = self._sums[: self._summed + 1]
                self._sums = grown
            k = self._summed
            self._sums[k : self.n + 1] = np.cumsum(np.concatenate(([self._sums[k]], self._y[k : self.n])))
            self._summed = self.n
        return self._sums[: self.n + 1]

    @property
    def y(self) -> np.ndarray:
        return self._y[: self.n]

    def __len__(self) -> int:
        return self.n


def rolling_mean(y: np.ndarray, window: int, sums: np.ndarray | None = None) -> np.ndarray:
    """Mean of the last `window` values at each point (of all so far, before the window is full).
    `sums`: y's running sums if known ([0, y0, y0 + y1, ...], `Series.sums`)."""
    n = len(y)
    if n == 0:
        return np.empty(0)
    w = max(1, min(window, n))
    if sums is None:
        c = np.empty(n + 1)
        c[0] = 0.0
        np.cumsum(y, out=c[1:])
    else:
        c = sums
    out = np.empty(n)
    out[:w] = c[1 : w + 1] / np.arange(1, w + 1)
    out[w:] = (c[w + 1 :] - c[1 : n - w + 1]) / w
    return out


class RoundHistory:
    """Every figure of every completed round, by key; rounds only ever grow."""

    def __init__(self) -> None:
        self.clear()

    def clear(self) -> None:
        """Forget every round (another run is shown now)."""
        self.generation = getattr(self, "generation", -1) + 1  # what was drawn from the old rounds is stale
        self.series: dict[str, Series] = {}
        self.last_round = 0
        self.rounds = 0

    def add(self, round: int, metrics: Mapping[str, float]) -> bool:
        """Add one round; False (and nothing changes) if it is not newer than the last one."""
        if round <= self.last_round:
            return False
        for key, value in metrics.items():
            if not isinstance(value, (int, float)) or not math.isfinite(value):
                continue  # the plots skip their finite checks: only numbers get in
            s = self.series.get(key)
            if s is None:
                s = self.series[key] = Series()
            s.append(float(round), float(value))
        self.last_round, self.rounds = round, self.rounds + 1
        return True

    def add_many(self, rows: Iterable[tuple[int, Mapping[str, float]]]) -> int:
        """Bulk load (the run store at start-up): column by column, far faster than `add` per row."""
        columns: dict[str, tuple[list[float], list[float]]] = {}
        added = 0
        last = self.last_round
        for r, metrics in rows:
            if r <= last:
                continue
            last = r
            added += 1
            for key, value in metrics.items():
                if isinstance(value, (int, float)) and math.isfinite(value):
                    xs, ys = columns.setdefault(key, ([], []))
                    xs.append(float(r))
                    ys.append(float(value))
        for key, (xs, ys) in columns.items():
            self.series.setdefault(key, Series(max(256, len(xs)))).extend(xs, ys)
        self.last_round, self.rounds = last, self.rounds + added
        return added

    def get(self, key: str) -> tuple[np.ndarray, np.ndarray]:
        s = self.series.get(key)
        return (s.x, s.y) if s is not None else (np.empty(0), np.empty(0))

    def rolling(self, key: str, window: int) -> tuple[np.ndarray, np.ndarray]:
        s = self.series.get(key)
        if s is None:
            return np.empty(0), np.empty(0)
        return s.x, rolling_mean(s.y, window, s.sums())

    def cumulative(self, key: str) -> tuple[np.ndarray, np.ndarray]:
        s = self.series.get(key)
        if s is None:
            return np.empty(0), np.empty(0)
        return s.x, s.sums()[1:]

    def stacked(
        self, groups: tuple[tuple[str, tuple[str, ...]], ...], window: int, prefix: str = K.TIME_PREFIX
    ) -> tuple[np.ndarray, list[np.ndarray]]:
        """Rolling means of groups of figures, stacked: (rounds, [band 1, band 1+2, ...]); `groups`:
        (name, the figures' names after `prefix`), vocabulary.PHASE_BANDS for the time per phase.

        Rounds are those of any member; a figure missing in a round counts 0 there."""
        present = [
            self.series[prefix + k]
            for _, members in groups
            for k in members
            if prefix + k in self.series and len(self.series[prefix + k])
        ]
        if not present:
            return np.empty(0), [np.empty(0) for _ in groups]
        # usually every phase is timed in every round: then the rounds are simply shared
        first = present[0]
        same = all(len(s) == len(first) and s.x[0] == first.x[0] and s.x[-1] == first.x[-1] for s in present)
        x = first.x if same else np.unique(np.concatenate([s.x for s in present]))
        bands, total = [], np.zeros(len(x))
        for _, members in groups:
            band = np.zeros(len(x))
            for k in members:
                s = self.series.get(prefix + k)
                if s is not None and len(s):
                    if same:
                        band += s.y
                    else:
                        band[np.searchsorted(x, s.x)] += s.y
            total = total + rolling_mean(band, window)
            bands.append(total)
        return x, bands

    def keys_under(self, prefix: str, skip: Iterable[str] = ()) -> list[str]:
        """Keys `prefix/name` with a single level below the prefix, e.g. accuracy/<task>, but not
        the keys in `skip` (accuracy/mean)."""
        skip = set(skip)
        return sorted(k for k in self.series if k.startswith(prefix) and "/" not in k[len(prefix) :] and k not in skip)

    def last(self, key: str, default: float = float("nan")) -> float:
        s = self.series.get(key)
        return float(s.y[-1]) if s is not None and len(s) else default

    def total(self, key: str) -> float:
        s = self.series.get(key)
        return float(s.y.sum()) if s is not None else 0.0


SWARM_TOTALS = ("published", "received", "accepted", "used", "rejected")
# sapo_core.swarm's rejection reasons (records.py, verify.py), in the user's words
REJECTION_WORDS = {
    "zero_advantage": "all answers scored the same (nothing to learn)",
    "text_mismatch": "question differs from the one its id regenerates",
    "answer_mismatch": "answer differs from the regenerated question's",
    "bad_score": "claimed scores differ from ours",
    "bad_index": "question index out of range",
    "unknown_task": "a task this node does not know",
    "malformed": "malformed record",
    "oversized": "record too large",
    "wrong_version": "another protocol version",
    "wrong_swarm": "a record of another swarm",
    "wrong_key": "record stored under the wrong key",
    "wrong_owner": "signed by someone else",
    "wrong_peer": "sent on behalf of another peer",
}


def rejection_words(reason: str) -> str:
    """'index_malformed' -> 'index entry: malformed record'; unknown reasons keep their name."""
    if reason.startswith("index_"):
        return "index entry: " + rejection_words(reason[len("index_") :])
    return REJECTION_WORDS.get(reason, reason.replace("_", " "))


@dataclass
class SwarmModel:
    """This node in the swarm: identity from NodeInfo, exchanges from the rounds' `swarm/...` figures."""

    node_name: str = ""
    peer_id: str = ""
    join_address: str = ""
    visible_maddrs: list[str] = field(default_factory=list)
    alone: bool | None = None  # None until the node said who it is
    totals: Counter = field(default_factory=Counter)
    rejections: Counter = field(default_factory=Counter)  # reason -> count, over all rounds
    peers_now: int = 0  # peers found in the last round's gather
    dht_peers: int = 0
    ignored_peers: int = 0
    peers_seen: dict[str, int] = field(default_factory=dict)  # peer name -> last round it sent us groups
    rounds: int = 0
    last_figures: dict[str, float] = field(default_factory=dict)  # the last round's swarm/... metrics (joining)

    def clear(self) -> None:
        """Forget identity and exchanges (another run is shown now)."""
        self.__init__()  # type: ignore[misc]  # a dataclass: back to its field defaults

    def apply_info(self, ev: P.NodeInfo) -> None:
        self.node_name, self.peer_id, self.join_address = ev.node_name, ev.peer_id, ev.join_address
        self.visible_maddrs = list(ev.visible_maddrs)
        self.alone = not ev.peer_id

    def add_round(self, round: int, metrics: Mapping[str, float]) -> None:
        if not any(k.startswith(K.SWARM_PREFIX) for k in metrics):
            return
        self.rounds += 1
        self.last_figures = {k: float(v) for k, v in metrics.items() if k.startswith(K.SWARM_PREFIX)}
        for name in SWARM_TOTALS:
            self.totals[name] += int(metrics.get(K.swarm_of(name), 0) or 0)
        for key, value in metrics.items():
            for prefix in (K.SWARM_REJECTED_PREFIX, K.SWARM_DHT_REJECTED_PREFIX):
                if key.startswith(prefix) and value:
                    where = "DHT: " if prefix == K.SWARM_DHT_REJECTED_PREFIX else ""
                    self.rejections[where + rejection_words(key[len(prefix) :])] += int(value)
        self.peers_now = int(metrics.get(K.SWARM_PEERS, self.peers_now) or 0)
        self.dht_peers = int(metrics.get(K.SWARM_DHT_PEERS, self.dht_peers) or 0)
        self.ignored_peers = int(metrics.get(K.SWARM_IGNORED_PEERS, self.ignored_peers) or 0)

    def apply_progress(self, ev: P.Progress) -> bool:
        """Gather progress names the peer whose record is being verified."""
        peer = ev.info.get("peer") if ev.phase == K.GATHER else None
        if not peer:
            return False
        self.peers_seen[str(peer)] = ev.round
        return True

    @property
    def invite(self) -> str:
        return self.join_address or (self.visible_maddrs[0] if self.visible_maddrs else "")


__all__ = [
    "NodeStatus",
    "Series",
    "RoundHistory",
    "SwarmModel",
    "rolling_mean",
    "rejection_words",
    "STATE_WORDS",
    "SWARM_TOTALS",
]
