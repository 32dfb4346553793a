"""The run store: one SQLite row per completed round, with its figures.

Figures are namespaced keys (`reward/mean`, `loss/policy`, `swarm/peers`, `time/sample`...)
kept as a JSON object per round, so a new figure needs no migration. The GUI reads the
same file (stdlib sqlite3 only: this module imports no torch). WAL mode lets the GUI read
while the node writes.

Every row also carries `cpu/seconds`, the CPU time the writing process and its children (the
node and its llama.cpp sampler, as the heartbeat counts them: `cpu.tree_cpu_seconds`) used
since the previous row, so CPU-hours survive restarts. Receipts, the (peer, our round, group)
triples by which peers say they trained on our groups, are kept in their own table, one row per
triple however often it is seen. What the volunteer gave and what came back is read from here
by `contributions.py` (totals) and `daily.py` (by day).
"""

from __future__ import annotations

import json
import math
import sqlite3
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from sapo_core.control.vocabulary import CPU_SECONDS
from sapo_core.cpu import tree_cpu_seconds

SCHEMA_VERSION = 1
STORE_NAME = "rounds.sqlite"


class StoreError(RuntimeError):
    """The run store cannot be used; the message says which file and what to do."""


@dataclass(frozen=True)
class RoundRow:
    round: int
    started: float
    ended: float
    metrics: dict[str, float]


def _clean(metrics: dict[str, float]) -> dict[str, float]:
    # JSON has no NaN/inf: drop them rather than write a file other readers reject
    return {k: float(v) for k, v in metrics.items() if isinstance(v, (int, float)) and math.isfinite(v)}


class RunStore:
    def __init__(self, path: Path, readonly: bool = False) -> None:
        self.path = Path(path)
        self._cpu_mark = 0.0
        if readonly:
            if not self.path.is_file():
                raise StoreError(f"no run store at {self.path}")
            uri = f"file:{self.path}?mode=ro"
            self._db = sqlite3.connect(uri, uri=True, timeout=10, check_same_thread=False)
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        try:
            self._db = sqlite3.connect(self.path, timeout=30, check_same_thread=False)
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("PRAGMA synchronous=FULL")
            self._db.executescript(
                """
                CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
                CREATE TABLE IF NOT EXISTS rounds (
                    round INTEGER PRIMARY KEY, started REAL NOT NULL, ended REAL NOT NULL,
                    metrics TEXT NOT NULL);
                CREATE TABLE IF NOT EXISTS receipts (
                    peer TEXT NOT NULL, our_round INTEGER NOT NULL, grp INTEGER NOT NULL,
                    seen_round INTEGER NOT NULL, seen REAL NOT NULL,
                    PRIMARY KEY (peer, our_round, grp));
                """
            )
            version = self.get_meta("schema_version")
            if version is None:
                self.set_meta("schema_version", str(SCHEMA_VERSION))
            elif int(version) > SCHEMA_VERSION:
                raise StoreError(f"{self.path} was written by a newer SAPO Swarm (schema {version}); update the app")
        except sqlite3.DatabaseError as e:
            raise StoreError(f"run store {self.path} is unreadable ({e}); move it away to start a new run") from e

        self._cpu_mark = tree_cpu_seconds()

    def close(self) -> None:
        self._db.close()

    # --- meta -------------------------------------------------------------------------------
    def get_meta(self, key: str) -> str | None:
        row = self._db.execute("SELECT value FROM meta WHERE key = ?", (key,)).fetchone()
        return row[0] if row else None

    def set_meta(self, key: str, value: str) -> None:
        with self._db:
            self._db.execute("INSERT OR REPLACE INTO meta (key, value) VALUES (?, ?)", (key, value))

    # --- rounds -----------------------------------------------------------------------------
    def record_round(self, round: int, metrics: dict[str, float], started: float, ended: float | None = None) -> None:
        ended = time.time() if ended is None else ended
        if CPU_SECONDS not in metrics:  # CPU given since the previous row (or since the store opened)
            now = tree_cpu_seconds()
            metrics = {**metrics, CPU_SECONDS: max(0.0, now - self._cpu_mark)}
            self._cpu_mark = now
        with self._db:
            self._db.execute(
                "INSERT OR REPLACE INTO rounds (round, started, ended, metrics) VALUES (?, ?, ?, ?)",
                (round, started, ended, json.dumps(_clean(metrics), sort_keys=True)),
            )

    def has_round(self, round: int) -> bool:
        return self._db.execute("SELECT 1 FROM rounds WHERE round = ?", (round,)).fetchone() is not None

    def last_round(self) -> int:
        row = self._db.execute("SELECT MAX(round) FROM rounds").fetchone()
        return int(row[0]) if row and row[0] is not None else 0

    def count(self) -> int:
        return int(self._db.execute("SELECT COUNT(*) FROM rounds").fetchone()[0])

    def rounds(self, since: int = 0, limit: int | None = None) -> list[RoundRow]:
        q = "SELECT round, started, ended, metrics FROM rounds WHERE round > ? ORDER BY round"
        args: tuple = (since,)
        if limit is not None:
            q += " LIMIT ?"
            args = (since, limit)
        return [RoundRow(r, s, e, json.loads(m)) for r, s, e, m in self._db.execute(q, args)]

    def series(self, key: str) -> tuple[list[int], list[float]]:
        """(rounds, values) of one figure, skipping rounds without it."""
        xs, ys = [], []
        q = "SELECT round, json_extract(metrics, '$.\"' || ? || '\"') FROM rounds ORDER BY round"
        for r, v in self._db.execute(q, (key,)):
            if v is not None:
                xs.append(int(r))
                ys.append(float(v))
        return xs, ys

    def spans(
        self, since: float = 0.0, keys: tuple[str, ...] = (), until_round: int | None = None
    ) -> list[tuple[float, float, tuple[float, ...]]]:
        """(started, ended, figures) of the rounds that ended at or after `since` (and are not after
        `until_round`), in round order: `keys`' figures, 0.0 where a round lacks one (only those are
        read, by SQLite: no JSON decoding of whole rows in Python)."""
        cols = "".join(", json_extract(metrics, ?)" for _ in keys)
        q = f"SELECT started, ended{cols} FROM rounds WHERE ended >= ? AND round <= ? ORDER BY round"
        paths = tuple(f'$."{k}"' for k in keys)
        last = until_round if until_round is not None else 2**62
        return [
            (float(r[0]), float(r[1]), tuple(float(v or 0.0) for v in r[2:]))
            for r in self._db.execute(q, (*paths, since, last))
        ]

    def keys(self) -> list[str]:
        seen: set[str] = set()
        for (m,) in self._db.execute("SELECT metrics FROM rounds ORDER BY round DESC LIMIT 50"):
            seen.update(json.loads(m))
        return sorted(seen)

    # --- receipts ---------------------------------------------------------------------------
    def record_receipts(self, round: int, receipts: list[tuple[str, int, int]], seen: float | None = None) -> int:
        """Keep the receipts found in `round`'s gather: (receipting peer id, our round named, group
        index), seen at `seen` (default now). A triple seen again is kept once (its first sighting).
        Malformed entries are skipped: they come from peers. Returns how many were new."""
        seen = time.time() if seen is None else seen
        rows = []
        for item in receipts:
            try:
                peer, our_round, grp = item
                if not isinstance(peer, str) or not peer or len(peer) > 200:
                    continue
                rows.append((peer, int(our_round), int(grp), int(round), seen))
            except (TypeError, ValueError):
                continue
        with self._db:
            before = self._db.total_changes
            self._db.executemany(
                "INSERT OR IGNORE INTO receipts (peer, our_round, grp, seen_round, seen) VALUES (?, ?, ?, ?, ?)", rows
            )
            return self._db.total_changes - before

    def receipts(self, since: float = 0.0) -> list[tuple[str, int, int, int, float]]:
        """(peer, our round, group, round seen, time seen) of the receipts seen at or after `since`."""
        q = "SELECT peer, our_round, grp, seen_round, seen FROM receipts WHERE seen >= ? ORDER BY seen"
        try:
            rows = self._db.execute(q, (since,)).fetchall()
        except sqlite3.OperationalError:  # a store written before receipts existed, opened read-only
            return []
        return [(p, int(r), int(g), int(s), float(t)) for p, r, g, s, t in rows]


def export_csv(rows: Iterable[RoundRow], out) -> None:
    """Rounds as CSV, one column per figure (the GUI's and `sapo-experiment`'s export)."""
    import csv

    rows = list(rows)
    keys = sorted({k for r in rows for k in r.metrics})
    w = csv.writer(out)
    w.writerow(["round", "started", "ended", *keys])
    for r in rows:
        w.writerow([r.round, f"{r.started:.3f}", f"{r.ended:.3f}", *(r.metrics.get(k, "") for k in keys)])
