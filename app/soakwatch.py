"""The app's window beside a soaking node: its memory and redraw time as the rounds pile up.

`python -m app.soakwatch RUN_STORE` builds the desktop app's main window offscreen
(no node of its own) and follows a node's run store: each round the node finishes goes to the
window as the app's own round event does (`MainWindow._on_round_done`: status, history, swarm
table), then the dashboard redraws (what the event's scheduled refresh does), timed in CPU of
the GUI thread and wall clock. After each batch of new rounds it prints one JSON line:
`{"round": R, "rounds": N, "rss_mb": ..., "redraw_cpu_ms": ..., "redraw_wall_ms": ...}`.

`sapo-bench soak` runs it (`--app`, the default) and reports the window's RSS and redraw p95
after warm-up and at the end (issue 24, "the whole machine"). It stops when its stdin closes
(the soak ended or died) or on SIGTERM. It lives in app/ because it runs the app's window:
the soak (sapo_core/bench/soak.py) starts it as a process and reads its lines, never imports it.
"""

from __future__ import annotations

import json
import os
import select
import sys
import tempfile
import time
from pathlib import Path

import psutil
from PySide6.QtWidgets import QApplication

from app.bridge import WorkerBridge
from app.settings import UiSettings
from app.window import MainWindow
from sapo_core.control import protocol as P
from sapo_core.store import RunStore

POLL_S = 0.5


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m app.soakwatch RUN_STORE", file=sys.stderr)
        return 2
    store_path = Path(args[0])
    os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
    me = psutil.Process()
    qt = QApplication.instance() or QApplication(sys.argv[:1])
    with tempfile.TemporaryDirectory(prefix="sapo-soakwatch-") as tmp:
        os.environ["SAPO_DATA_DIR"] = tmp  # its own settings (none: defaults), never the user's
        window = MainWindow(WorkerBridge(), UiSettings(Path(tmp) / "ui.ini"), use_tray=False)
        window.resize(1180, 800)
        window.tabs.setCurrentIndex(0)
        window.show()
        qt.processEvents()
        last, seen = 0, 0
        while True:
            ready, _, _ = select.select([sys.stdin], [], [], POLL_S)
            if ready and not sys.stdin.readline():
                break  # the soak closed our stdin: it is over
            if not store_path.is_file():
                continue
            store = RunStore(store_path, readonly=True)
            try:
                rows = store.rounds(since=last)
            finally:
                store.close()
            if not rows:
                continue
            for row in rows:
                window._on_round_done(P.RoundDone(round=row.round, metrics=row.metrics))
            last, seen = rows[-1].round, seen + len(rows)
            t0, c0 = time.perf_counter(), time.thread_time()
            window.dashboard.refresh()
            qt.processEvents()
            wall, cpu = (time.perf_counter() - t0) * 1000, (time.thread_time() - c0) * 1000
            line = {"round": last, "rounds": seen, "rss_mb": round(me.memory_info().rss / 2**20, 1)}
            line |= {"redraw_cpu_ms": round(cpu, 2), "redraw_wall_ms": round(wall, 2)}
            print(json.dumps(line), flush=True)
        window.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
