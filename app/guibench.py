"""`sapo-bench gui`'s measurement, run in a process of its own: the dashboard's redraw time with a
long history, and the GUI's memory.

Writes a run store of N made-up rounds (app/demo.py; 10,000 by default), loads it the way
the app does (run store -> RoundHistory), builds the whole main window offscreen (no node
is started) and then, R times: adds one round and redraws every plot of the dashboard
(`DashboardView.refresh`, then the event loop runs the scene's update and its one paint).
A long curve that would move by less than half a pixel keeps what it shows, and a plot none of
whose curves changed is not painted: at 10,000 rounds most rounds move most curves by less.
Two comparisons: the same redraw with every curve given its data again (each plot painted every
round: the worst case, a round that moves every curve), and with every round handed to the curves
(no binning for the screen: what pyqtgraph draws without downsampling). Memory is the GUI
process's RSS after all that.

Each redraw is timed twice: wall clock, and the CPU time of the GUI thread (Qt paints on it).
On a busy machine the wall clock mostly measures waiting for a core, so the goal (<= 16 ms, a
frame at 60 Hz) is judged on the CPU time and the load average is printed beside it. RSS goal
<= 200 MB. Percentiles interpolate between ranks (`sapo_core.bench.control.percentile`, as the soak's).

It lives in app/ because it runs the app's window: `sapo-bench gui` (sapo_core/bench/gui.py)
starts `python -m app.guibench` with its own options and never imports it (the engine never
imports Qt).
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import tempfile
import time
from pathlib import Path

from sapo_core.bench.control import percentile
from sapo_core.bench.gui import REDRAW_GOAL_MS, RSS_GOAL_MB, configure


def _redraws(app, window, n: int, first_round: int) -> tuple[list[float], list[float]]:
    """(wall ms, GUI-thread CPU ms) of n redraws, each after one new round."""
    from app.demo import demo_metrics

    rng = random.Random(first_round)
    wall, cpu = [], []
    for i in range(n):
        window.history.add(first_round + i, demo_metrics(first_round + i, rng))
        t0, c0 = time.perf_counter(), time.thread_time()
        window.dashboard.refresh()
        app.processEvents()  # the scene's changes, auto-range, and the one paint they schedule
        wall.append((time.perf_counter() - t0) * 1000)
        cpu.append((time.thread_time() - c0) * 1000)
    return wall, cpu


def _line(name: str, wall: list[float], cpu: list[float]) -> str:
    p = percentile
    return (
        f"  {name:<44} CPU p50 {p(cpu, 0.5):6.1f} ms  p95 {p(cpu, 0.95):6.1f} ms   "
        f"wall p50 {p(wall, 0.5):6.1f} ms  p95 {p(wall, 0.95):6.1f} ms   ({len(cpu)} redraws)"
    )


def _measure(args: argparse.Namespace) -> dict:
    """A window over a made-up history of `args.rounds` rounds: how long loading it took, and the
    redraws after a new round (ours; every curve given its data; every round handed to the curves)."""
    import psutil
    from PySide6.QtWidgets import QApplication

    from app.bridge import WorkerBridge
    from app.demo import write_demo_store
    from app.history import read_rows
    from app.settings import UiSettings
    from app.window import MainWindow

    me = psutil.Process()
    app = QApplication.instance() or QApplication(sys.argv[:1])
    with tempfile.TemporaryDirectory(prefix="sapo-bench-gui-") as tmp:
        os.environ["SAPO_DATA_DIR"] = tmp  # the window reads node.toml and ui.ini there: none, defaults
        t0 = time.perf_counter()
        store = write_demo_store(Path(tmp), args.rounds)
        t_write = time.perf_counter() - t0
        window = MainWindow(WorkerBridge(), UiSettings(Path(tmp) / "ui.ini"), use_tray=False)
        window.resize(args.width, args.height)
        window.tabs.setCurrentIndex(0)
        window.show()
        app.processEvents()
        t0 = time.perf_counter()
        rows = read_rows(store)
        t_read = time.perf_counter() - t0
        t0 = time.perf_counter()
        window.history.add_many(rows)
        for r, m in rows:
            window.swarm.add_round(r, m)
        t_add = time.perf_counter() - t0
        del rows
        t0 = time.perf_counter()
        window.dashboard.refresh()
        app.processEvents()
        t_first = (time.perf_counter() - t0) * 1000
        ours = _redraws(app, window, args.redraws, args.rounds + 1)
        rss_mb = me.memory_info().rss / 2**20
        window.dashboard.skip_unmoved = False
        every = _redraws(app, window, args.redraws, args.rounds + 1 + args.redraws)
        window.dashboard.set_own_bins(False)
        app.processEvents()
        plain = _redraws(app, window, max(10, args.redraws // 3), args.rounds + 1 + 2 * args.redraws)
        n, n_curves = window.history.rounds, len(window.dashboard.curves)
        window.close()
        window.deleteLater()
        app.processEvents()
    return {
        "write_s": t_write,
        "read_s": t_read,
        "add_s": t_add,
        "first_ms": t_first,
        "ours": ours,
        "every": every,
        "plain": plain,
        "rss_mb": rss_mb,
        "rounds": n,
        "curves": n_curves,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m app.guibench", description=__doc__.splitlines()[0])
    configure(parser)
    args = parser.parse_args(argv)
    os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
    from app.qtcheck import binding_problem

    problem = binding_problem()
    if problem:
        print(f"sapo-bench gui: {problem}", file=sys.stderr)
        return 1
    f = _measure(args)
    ours, every, plain, n, rss_mb = f["ours"], f["every"], f["plain"], f["rounds"], f["rss_mb"]

    p = percentile
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(
        f"history: {args.rounds:,} rounds written in {f['write_s']:.2f} s, read from the run store in "
        f"{f['read_s']:.2f} s, into the dashboard's arrays in {f['add_s']:.2f} s; first draw {f['first_ms']:.0f} ms "
        "(wall)"
    )
    print(
        f"redraw after a new round, {n:,} rounds at the end, {args.width}x{args.height}, {f['curves']} curves, "
        f"load average {load:.1f} on {os.cpu_count()} CPUs:"
    )
    print(_line("ours (binned for the screen, 1 bin per pixel)", *ours))
    print(_line("ours, every curve given its data again", *every))
    print(_line("every round handed to the curves", *plain))
    print(f"GUI process RSS with the window and {n:,} rounds loaded: {rss_mb:.0f} MB")
    cpu50, cpu95 = p(ours[1], 0.5), p(ours[1], 0.95)
    print(
        f"gui: redraw {args.rounds:,} rounds CPU p50 {cpu50:.1f} ms p95 {cpu95:.1f} ms "
        f"(goal <= {REDRAW_GOAL_MS:.0f}: "
        f"{'met' if cpu95 <= REDRAW_GOAL_MS else 'MISSED'}; wall p50 {p(ours[0], 0.5):.1f} ms at load "
        f"{load:.1f}; every curve redrawn CPU p95 {p(every[1], 0.95):.1f} ms; "
        f"every round to the curves CPU p50 {p(plain[1], 0.5):.1f} ms); RSS {rss_mb:.0f} MB "
        f"(goal <= {RSS_GOAL_MB:.0f}: {'met' if rss_mb <= RSS_GOAL_MB else 'MISSED'})",
        flush=True,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
