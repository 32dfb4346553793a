"""`sapo-node stats`: what this node gave (CPU-hours, rounds, completions, groups published, time
running today and this week) and what came back (peers' receipts naming our groups, held-out
quality), and the same by day for the last two weeks with the running intervals (sapo_core/daily.py).
Reads the run store only: instant, and safe while the node runs."""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

from sapo_core import paths
from sapo_core.contributions import (
    contribution_totals,
    from_peers_words,
    held_out_summary,
    receipt_totals,
    start_of_week,
)
from sapo_core.daily import contribution_by_day, day_table
from sapo_core.store import STORE_NAME, RunStore, StoreError


def configure(p: argparse.ArgumentParser) -> None:
    p.add_argument("--run-dir", help="the run to read (default: the data directory's default run)")
    p.add_argument("--json", action="store_true", help="print the figures as JSON")


def gather_stats(store: RunStore, now: float | None = None) -> dict[str, Any]:
    """The figures `stats` prints, as one dict (the app's contribution card reads the same)."""
    now = time.time() if now is None else now
    held = held_out_summary(store)
    return {
        "contribution": contribution_totals(store, now=now),
        "receipts_week": receipt_totals(store, since=start_of_week(now)),
        "receipts_total": receipt_totals(store),
        "held_out": None if held is None else {**held.__dict__, "sentence": held.sentence()},
        "daily": contribution_by_day(store, now=now),
    }


def _hours(seconds: float) -> str:
    h, m = divmod(int(round(seconds / 60)), 60)
    return f"{h} h {m:02d} min" if h else f"{m} min"


def lines(s: dict[str, Any]) -> list[str]:
    c, rw, rt = s["contribution"], s["receipts_week"], s["receipts_total"]
    out = [
        f"rounds: {c['rounds']:.0f} ({c['rounds_today']:.0f} today, {c['rounds_week']:.0f} this week)",
        f"CPU given: {c['cpu_hours']:.2f} CPU-hours ({c['cpu_hours_today']:.2f} today, "
        f"{c['cpu_hours_week']:.2f} this week)",
        f"time running: {_hours(c['seconds_today'])} today, {_hours(c['seconds_week'])} this week",
        f"completions sampled: {c['completions']:.0f} ({c['tokens']:.0f} tokens)",
        f"groups trained: {c['groups_own']:.0f} own, {c['groups_peers']:.0f} from peers; "
        f"groups published: {c['groups_published']:.0f}",
        f"from peers: {from_peers_words(c)}",
    ]
    if rt["receipts"]:
        out.append(
            f"your groups were trained on {rw['receipts']} times by {rw['peers']} peers this week "
            f"({rt['receipts']} times by {rt['peers']} peers in all)"
        )
    else:
        out.append("no peer has reported training on your groups yet")
    out.append(s["held_out"]["sentence"] if s["held_out"] else "held-out: no evaluation yet")
    return [*out, "", *day_table(s["daily"])]


def main(args: argparse.Namespace) -> int:
    run_dir = Path(args.run_dir).expanduser() if args.run_dir else paths.default_run_dir()
    try:
        store = RunStore(run_dir / STORE_NAME, readonly=True)
    except StoreError as e:
        print(f"sapo-node stats: {e} (is --run-dir right? has the node finished a round?)", file=sys.stderr)
        return 2
    try:
        s = gather_stats(store)
    finally:
        store.close()
    if args.json:
        print(json.dumps(s, indent=2))
    else:
        print("\n".join(lines(s)))
    return 0
