"""`sapo-bench gui`: the dashboard's redraw time with a long history, and the GUI's memory.

The measurement runs the app's own window, so it lives in app/guibench.py (its docstring says
what is measured, and how); this module names the options and goals and starts it as a process
of its own (`python -m app.guibench`), because the engine never imports Qt or app. Its output,
ending in the one summary line `gui: redraw ...`, goes straight to ours.
"""

from __future__ import annotations

import argparse
import subprocess
import sys

REDRAW_GOAL_MS = 16.0
RSS_GOAL_MB = 200.0


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--rounds", type=int, default=10_000, help="rounds of history in the run store")
    parser.add_argument("--redraws", type=int, default=60, help="redraws measured (each after one new round)")
    parser.add_argument("--width", type=int, default=1180, help="window width in pixels")
    parser.add_argument("--height", type=int, default=800, help="window height in pixels")


def run(args: argparse.Namespace) -> int:
    options = ["--rounds", str(args.rounds), "--redraws", str(args.redraws)]
    options += ["--width", str(args.width), "--height", str(args.height)]
    return subprocess.run([sys.executable, "-m", "app.guibench", *options], check=False).returncode
