"""The run history from the run store, read off the GUI thread.

The node writes `rounds.sqlite` in its run directory (WAL mode); the app only reads it, so
the dashboard's curves survive a restart of the app or of the node. Reading thousands of
rows takes long enough to stall a frame, so `HistoryLoader` reads on a thread and hands the
rows to the GUI thread through a queued signal. `write_csv`: the dashboard's Export CSV.
"""

from __future__ import annotations

import sqlite3
import threading
from pathlib import Path

from PySide6.QtCore import QObject, Qt, Signal

from sapo_core.store import STORE_NAME, RunStore, StoreError, export_csv

Row = tuple[int, dict[str, float]]


def store_path(run_dir: str | Path) -> Path:
    return Path(run_dir).expanduser() / STORE_NAME


def read_rows(path: Path) -> list[Row]:
    """All rounds of a run store, oldest first; [] when there is no store yet."""
    if not path.is_file():
        return []
    store = RunStore(path, readonly=True)
    try:
        return [(r.round, r.metrics) for r in store.rounds()]
    finally:
        store.close()


def write_csv(path: Path | None, out_path: str | Path) -> int:
    """Every figure of every round of the run store at `path` as CSV; returns the rounds written."""
    if path is None or not path.is_file():
        raise FileNotFoundError("no run store yet: the first round has not ended")
    store = RunStore(path, readonly=True)
    try:
        rows = store.rounds()
    finally:
        store.close()
    with open(out_path, "w", newline="", encoding="utf-8") as out:
        export_csv(rows, out)
    return len(rows)


class HistoryLoader(QObject):
    loaded = Signal(object, str)
    """(rows, error): the rounds read from the store (list of (round, metrics)), or [] and why not."""

    _done = Signal(object, str)

    def __init__(self, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self._done.connect(self._on_done, Qt.ConnectionType.QueuedConnection)
        self.busy = False

    def load(self, path: Path) -> None:
        self.busy = True
        threading.Thread(target=self._read, args=(path,), name="sapo-read-history", daemon=True).start()

    def _read(self, path: Path) -> None:
        try:
            rows, error = read_rows(path), ""
        except (StoreError, OSError, ValueError, sqlite3.Error) as e:  # the history is optional: go on without
            rows, error = [], f"could not read the run history in {path}: {e}"
        self._done.emit(rows, error)

    def _on_done(self, rows: list[Row], error: str) -> None:
        self.busy = False
        self.loaded.emit(rows, error)


__all__ = ["HistoryLoader", "read_rows", "write_csv", "store_path", "Row"]
