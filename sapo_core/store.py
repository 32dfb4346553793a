"""The run store: one SQLite row per completed round, with its figures.

Figures are namespaced keys (`reward/mean`, `loss/policy`, `swarm/peers`, `time/sample`...)
kept as a JSON object per round, so a new figure needs no migration. The GUI reads the
same file (stdlib sqlite3 only: this module imports no torch). WAL mode lets the GUI read
while the node writes.
"""

from __future__ import annotations

import json
import math
import sqlite3
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable

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
                """
            )
            version = self.get_meta("schema_version")
            if version is None:
                self.set_meta("schema_version", str(SCHEMA_VERSION))
            elif int(version) > SCHEMA_VERSION:
                raise StoreError(f"{self.path} was written by a newer SAPO Swarm (schema {version}); update the app")
        except sqlite3.DatabaseError as e:
            raise StoreError(f"run store {self.path} is unreadable ({e}); move it away to start a new run") from e

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
        with self._db:
            self._db.execute("INSERT OR REPLACE INTO rounds (round, started, ended, metrics) VALUES (?, ?, ?, ?)",
                             (round, started, ended, json.dumps(_clean(metrics), sort_keys=True)))

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

    def keys(self) -> list[str]:
        seen: set[str] = set()
        for (m,) in self._db.execute("SELECT metrics FROM rounds ORDER BY round DESC LIMIT 50"):
            seen.update(json.loads(m))
        return sorted(seen)


def export_csv(rows: Iterable[RoundRow], out) -> None:
    """Rounds as CSV, one column per figure (the GUI's and `sapo-experiment`'s export)."""
    import csv

    rows = list(rows)
    keys = sorted({k for r in rows for k in r.metrics})
    w = csv.writer(out)
    w.writerow(["round", "started", "ended", *keys])
    for r in rows:
        w.writerow([r.round, f"{r.started:.3f}", f"{r.ended:.3f}", *(r.metrics.get(k, "") for k in keys)])
