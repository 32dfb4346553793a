"""Contribution by day: what this node gave on each of the last days, and when it ran.

For `sapo-node stats` (a per-day table) and the dashboard's "Your contribution by day" plot
(daily bars on a clock-time axis over a strip of the running intervals, whose gaps are the pauses).

- Days are calendar days of the local clock, midnight to midnight (23 or 25 hours across a
  daylight-saving change): each day's bounds come from the calendar, never from 86,400 s steps.
- `seconds`: the time inside rounds (started -> ended) that falls on that day. A round across
  midnight counts on both sides. The same measure as `contribution_totals`' seconds today and this
  week (pauses and the short waits between rounds excluded), so today's figure and the card agree.
- `cpu_hours`, `rounds`, `groups_published`: counted on the day the round ended, as the totals'
  "today" and "this week" count them (a round's CPU time is not known minute by minute).
- `receipts`: peers' receipts first seen that day.
- Running intervals: consecutive rounds merged; a gap between two rounds longer than
  `PAUSE_ROUNDS` median rounds (at least `MIN_PAUSE_S`) ends an interval: the node was paused,
  stopped, or the computer was off. Intervals are clipped to the days shown.
"""

from __future__ import annotations

import bisect
import datetime as dt
import statistics
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

from sapo_core.control.vocabulary import CPU_SECONDS, SWARM_PUBLISHED
from sapo_core.store import RunStore

DAYS = 14  # days shown, today included
PAUSE_ROUNDS = 2.0  # a gap longer than this many (median) rounds is a pause
MIN_PAUSE_S = 60.0  # ... and never shorter than this: waits between short rounds are no pause


@dataclass(frozen=True)
class Day:
    """One local calendar day's figures."""

    date: str  # ISO date, local time
    start: float  # local midnight (Unix time)
    end: float  # the next local midnight
    seconds: float
    cpu_hours: float
    rounds: int
    groups_published: float
    receipts: int


def day_bounds(now: float, days: int = DAYS) -> list[tuple[dt.date, float, float]]:
    """(date, start, end) of the last `days` local calendar days, oldest first, today last."""
    today = dt.datetime.fromtimestamp(now).date()
    dates = [today - dt.timedelta(days=k) for k in range(days - 1, -2, -1)]  # one more: tomorrow
    # a naive local datetime's timestamp() follows the local zone's rules, DST included
    starts = [dt.datetime.combine(d, dt.time()).timestamp() for d in dates]
    return [(dates[i], starts[i], starts[i + 1]) for i in range(days)]


def _overlap(a0: float, a1: float, b0: float, b1: float) -> float:
    return max(0.0, min(a1, b1) - max(a0, b0))


def pause_after(
    spans: Sequence[tuple[float, float]], pause_rounds: float = PAUSE_ROUNDS, min_pause_s: float = MIN_PAUSE_S
) -> float:
    """The gap (seconds) between two rounds beyond which the node counts as paused."""
    durations = [max(0.0, e - s) for s, e in spans]
    return max(min_pause_s, pause_rounds * statistics.median(durations)) if durations else min_pause_s


def running_intervals(spans: Sequence[tuple[float, float]], pause_s: float) -> list[tuple[float, float]]:
    """Rounds' (started, ended) merged into running intervals: a gap of more than `pause_s`
    between one round's end and the next one's start separates two intervals."""
    merged: list[list[float]] = []
    for s, e in sorted(spans):
        e = max(s, e)  # a clock stepped back mid-round: an instant, not a negative span
        if merged and s - merged[-1][1] <= pause_s:
            merged[-1][1] = max(merged[-1][1], e)
        else:
            merged.append([s, e])
    return [(s, e) for s, e in merged]


def by_day(
    rounds: Sequence[tuple[float, float, float, float]], receipts_seen: Sequence[float], now: float, days: int = DAYS
) -> list[Day]:
    """Per-day figures from rounds' (started, ended, cpu seconds, groups published) and the times
    receipts were first seen, for the last `days` days (days without anything give zeros)."""
    bounds = day_bounds(now, days)
    starts = [start for _, start, _ in bounds]
    first, last = starts[0], bounds[-1][2]
    seconds, cpu, count, published, receipts = ([0.0] * days for _ in range(5))

    def index(t: float) -> int | None:  # the day holding time t, None outside the days shown
        return bisect.bisect_right(starts, t) - 1 if first <= t < last else None

    for s, e, cpu_s, pub in rounds:
        i = index(e)
        if i is not None:
            cpu[i] += cpu_s
            count[i] += 1
            published[i] += pub
        # the round's time, split at each midnight it crosses
        for k in range(max(0, bisect.bisect_right(starts, s) - 1), days):
            if bounds[k][1] >= e:
                break
            seconds[k] += _overlap(s, e, bounds[k][1], bounds[k][2])
    for t in receipts_seen:
        i = index(t)
        if i is not None:
            receipts[i] += 1
    return [
        Day(
            date=d.isoformat(),
            start=start,
            end=end,
            seconds=seconds[i],
            cpu_hours=cpu[i] / 3600,
            rounds=int(count[i]),
            groups_published=published[i],
            receipts=int(receipts[i]),
        )
        for i, (d, start, end) in enumerate(bounds)
    ]


def contribution_by_day(store: RunStore, now: float | None = None, days: int = DAYS) -> dict[str, Any]:
    """The figures of `by_day` and the running intervals of the same days, JSON-serialisable:
    {"days": [Day as dict, oldest first], "running": [[start, end], ...], "pause_after_s": s, "now": t}."""
    now = time.time() if now is None else now
    bounds = day_bounds(now, days)
    first, last = bounds[0][1], bounds[-1][2]
    rows = [(s, e, f[0], f[1]) for s, e, f in store.spans(since=first, keys=(CPU_SECONDS, SWARM_PUBLISHED)) if s < last]
    spans = [(s, e) for s, e, _, _ in rows]
    pause_s = pause_after(spans)
    running = [[max(s, first), min(e, last)] for s, e in running_intervals(spans, pause_s)]
    return {
        "days": [asdict(d) for d in by_day(rows, [r[4] for r in store.receipts(since=first)], now, days)],
        "running": running,
        "pause_after_s": pause_s,
        "now": now,
    }


def day_table(daily: dict[str, Any]) -> list[str]:
    """`sapo-node stats`' per-day lines, from the first day with anything in it."""
    days = daily["days"]
    busy = [i for i, d in enumerate(days) if d["rounds"] or d["seconds"] or d["receipts"]]
    if not busy:
        return [f"by day: nothing in the last {len(days)} days"]
    out = [f"{'by day (local time)':<19} {'running':>8} {'CPU-hours':>9} {'rounds':>6} {'receipts':>8}"]
    for d in days[busy[0] :]:
        date = dt.date.fromisoformat(d["date"]).strftime("%a %Y-%m-%d")
        if d["rounds"] or d["seconds"] or d["receipts"]:
            out.append(
                f"{date:<19} {d['seconds'] / 3600:>6.1f} h {d['cpu_hours']:>9.2f} {d['rounds']:>6} {d['receipts']:>8}"
            )
        else:
            out.append(f"{date:<19} {'-':>8}")
    return out


__all__ = [
    "DAYS",
    "Day",
    "by_day",
    "contribution_by_day",
    "day_bounds",
    "day_table",
    "pause_after",
    "running_intervals",
]
