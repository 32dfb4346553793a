"""The weekly schedule a volunteer may set: when the node is allowed to run.

Syntax (case-insensitive), entries separated by `;` or new lines:

    mon-fri 18:00-08:00; sat-sun 00:00-24:00
    daily 22:00-07:00
    mon,wed,fri 09:00-12:00, 14:00-17:00

An entry is days, then one or more `HH:MM-HH:MM` ranges separated by commas. Days are
`mon`..`sun` (or full names), ranges of them (`fri-mon` wraps), or `daily`, `weekdays`,
`weekends`. A range whose end is not after its start runs overnight: `mon 18:00-08:00`
is Monday 18:00 to Tuesday 08:00. `24:00` ends a day. An empty schedule allows any time.

The app's weekly grid (app/schedule_grid.py) edits the same text: `schedule_grid` turns a schedule into
7 rows (Monday first) of equal slots, `grid_text` turns such a grid back into the shortest
readable text (days with the same hours merged into `mon-fri`, evenings running into the next
morning written overnight), and `parse_schedule(grid_text(g))` gives the grid `g` again.

Standard library only: config.py validates `control.schedule` with `parse_schedule`.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

DAY_NAMES = ("mon", "tue", "wed", "thu", "fri", "sat", "sun")
_FULL = ("monday", "tuesday", "wednesday", "thursday", "friday", "saturday", "sunday")
_GROUPS = {"daily": tuple(range(7)), "everyday": tuple(range(7)), "weekdays": tuple(range(5)), "weekends": (5, 6)}
WEEK_MINUTES = 7 * 24 * 60
_TIME = re.compile(r"^(\d{1,2}):(\d{2})$")
_EXAMPLE = "e.g. 'mon-fri 18:00-08:00; sat-sun 00:00-24:00'"


class ScheduleError(ValueError):
    """The schedule text is wrong; the message quotes the part and says how to write it."""


@dataclass(frozen=True)
class Schedule:
    text: str
    spans: tuple[tuple[int, int], ...]  # (start, end) minutes from Monday 00:00; end may exceed a week

    @property
    def always(self) -> bool:
        return not self.spans

    def allows(self, when: datetime) -> bool:
        if self.always:
            return True
        m = _minute_of_week(when)
        return any(s <= m < e or s <= m + WEEK_MINUTES < e for s, e in self.spans)

    def next_change(self, when: datetime) -> datetime | None:
        """When `allows` next flips (to the minute), or None if it never does."""
        if self.always:
            return None
        now = self.allows(when)
        base = when.replace(second=0, microsecond=0)
        m0 = _minute_of_week(base)
        edges = sorted({x % WEEK_MINUTES for s, e in self.spans for x in (s, e)})
        for week in (0, 1):
            for edge in edges:
                delta = edge + week * WEEK_MINUTES - m0
                if delta <= 0:
                    continue
                t = base + timedelta(minutes=delta)
                if self.allows(t) != now:
                    return t
        return None


def _minute_of_week(when: datetime) -> float:
    return when.weekday() * 1440 + when.hour * 60 + when.minute + when.second / 60


def _day(word: str, entry: str) -> int:
    w = word.strip().lower()
    if w in DAY_NAMES:
        return DAY_NAMES.index(w)
    if w in _FULL:
        return _FULL.index(w)
    raise ScheduleError(
        f"'{entry}': unknown day '{word.strip()}'; use {', '.join(DAY_NAMES)}, daily, weekdays or weekends ({_EXAMPLE})"
    )


def _days(spec: str, entry: str) -> list[int]:
    out: list[int] = []
    for part in spec.split(","):
        part = part.strip().lower()
        if not part:
            raise ScheduleError(f"'{entry}': empty day in '{spec}' ({_EXAMPLE})")
        if part in _GROUPS:
            out.extend(_GROUPS[part])
        elif "-" in part:
            a, b = part.split("-", 1)
            first, last = _day(a, entry), _day(b, entry)
            out.extend((first + k) % 7 for k in range((last - first) % 7 + 1))
        else:
            out.append(_day(part, entry))
    return sorted(set(out))


def _minutes(text: str, entry: str, end: bool) -> int:
    m = _TIME.match(text.strip())
    if not m:
        raise ScheduleError(f"'{entry}': '{text.strip()}' is not a time; write HH:MM, e.g. 08:00 ({_EXAMPLE})")
    h, mi = int(m.group(1)), int(m.group(2))
    if mi > 59 or h > 24 or (h == 24 and (mi or not end)):
        raise ScheduleError(
            f"'{entry}': '{text.strip()}' is not a time of day; use 00:00..23:59 (24:00 only as an end)"
        )
    return h * 60 + mi


def _ranges(spec: str, entry: str) -> list[tuple[int, int]]:
    out = []
    for part in spec.split(","):
        if part.count("-") != 1:
            raise ScheduleError(f"'{entry}': '{part.strip()}' is not a range; write HH:MM-HH:MM ({_EXAMPLE})")
        a, b = part.split("-")
        start, end = _minutes(a, entry, end=False), _minutes(b, entry, end=True)
        if end == start:
            raise ScheduleError(f"'{entry}': '{part.strip()}' is empty; use 00:00-24:00 for the whole day")
        out.append((start, end if end > start else end + 1440))  # overnight into the next day
    return out


def parse_schedule(text: str) -> Schedule:
    spans: list[tuple[int, int]] = []
    for raw in re.split(r"[;\n]", text or ""):
        entry = raw.strip()
        if not entry:
            continue
        parts = entry.split(None, 1)
        if len(parts) != 2:
            raise ScheduleError(f"'{entry}': write days then times, {_EXAMPLE}")
        days_spec, ranges_spec = parts
        if _TIME.match(days_spec.split("-")[0].strip()):
            raise ScheduleError(f"'{entry}': the days come first, {_EXAMPLE}")
        for d in _days(days_spec, entry):
            for start, end in _ranges(ranges_spec, entry):
                spans.append((d * 1440 + start, d * 1440 + end))
    return Schedule(text=text or "", spans=tuple(sorted(spans)))


SlotGrid = tuple[tuple[bool, ...], ...]
"""(7, slots_per_day): row 0 is Monday, slot k of a row starts at k * (1440 / slots_per_day) minutes."""


def _slot_minutes(slots_per_day: int) -> int:
    if slots_per_day <= 0 or 1440 % slots_per_day:
        raise ValueError(f"slots_per_day must divide a day's 1440 minutes, not {slots_per_day}")
    return 1440 // slots_per_day


def schedule_grid(schedule: Schedule, slots_per_day: int = 24) -> SlotGrid:
    """The week's slots the schedule allows: a slot counts when any minute of it is allowed.

    Exact when every time in the text falls on a slot edge (`fits_grid`); otherwise a slot the
    schedule covers only in part shows as allowed."""
    step = _slot_minutes(slots_per_day)
    n = 7 * slots_per_day
    week = [schedule.always] * n
    for start, end in schedule.spans:  # an end past Sunday 24:00 wraps into Monday
        for k in range(start // step, -(-end // step)):
            week[k % n] = True
    return tuple(tuple(week[d * slots_per_day : (d + 1) * slots_per_day]) for d in range(7))


def fits_grid(schedule: Schedule, slots_per_day: int = 24) -> bool:
    """Every start and end falls on a slot edge, so `schedule_grid` shows exactly what the text says."""
    step = _slot_minutes(slots_per_day)
    return all(start % step == 0 and end % step == 0 for start, end in schedule.spans)


def _runs(row: tuple[bool, ...]) -> list[tuple[int, int]]:
    """The row's maximal runs of allowed slots as (first, end) with end exclusive."""
    runs, start = [], None
    for k, on in enumerate(row + (False,)):
        if on and start is None:
            start = k
        elif not on and start is not None:
            runs.append((start, k))
            start = None
    return runs


def _day_spec(days: list[int]) -> str:
    """`daily`, or the days as runs Monday first: `mon-fri`, `mon,wed`, `sat-mon` (a run may wrap)."""
    if len(days) == 7:
        return "daily"
    chosen = set(days)
    pieces = []
    for first in sorted(d for d in chosen if (d - 1) % 7 not in chosen):
        last = first
        while (last + 1) % 7 in chosen:
            last = (last + 1) % 7
        pieces.append(DAY_NAMES[first] if first == last else f"{DAY_NAMES[first]}-{DAY_NAMES[last]}")
    return ",".join(pieces)


def grid_text(grid: Sequence[Sequence[bool]]) -> str:
    """The shortest readable schedule text that allows exactly the grid's slots.

    All slots allowed is "" (any time). No slot allowed has no text the parser reads as "never"
    (an empty schedule means always), so it raises ScheduleError saying what to do instead."""
    rows = [tuple(bool(x) for x in row) for row in grid]
    if len(rows) != 7 or len({len(r) for r in rows}) != 1:
        raise ValueError("a schedule grid has 7 rows (Monday first) of equal length")
    n = len(rows[0])
    step = _slot_minutes(n)
    if all(all(r) for r in rows):
        return ""
    if not any(any(r) for r in rows):
        raise ScheduleError(
            "nothing is allowed, so the node would never run: allow some hours, "
            "or leave the schedule empty to run at any time"
        )
    runs = [_runs(r) for r in rows]
    # Two wordings, the shorter wins (overnight on a tie): evenings run into the next morning
    # ("mon-fri 18:00-08:00"), or each day says its own hours ("mon-fri 00:00-08:00, 18:00-24:00"
    # when Monday's early hours would otherwise need an entry of their own).
    texts = [_render(_day_ranges(runs, n, overnight=on), step) for on in (True, False)]
    return min(texts, key=len)


def _day_ranges(runs: list[list[tuple[int, int]]], n: int, overnight: bool) -> list[list[tuple[int, int]]]:
    """Each day's ranges in slots; a range whose end is before its start runs into the next day."""
    lead = [r[0][1] if r and r[0][0] == 0 else 0 for r in runs]  # where the day's first run ends, if it starts at 00:00
    trail = [r[-1][0] if r and r[-1][1] == n else None for r in runs]  # where a run reaching 24:00 starts
    # An evening run becomes one overnight range `a-b` when the next morning's run ends before a
    # (the parser reads an end not after the start as the next day's); that morning then needs no entry.
    night = [overnight and trail[d] is not None and 0 < lead[(d + 1) % 7] < trail[d] for d in range(7)]
    days: list[list[tuple[int, int]]] = []
    for d in range(7):
        ranges = []
        for first, end in runs[d]:
            if first == 0 and night[(d - 1) % 7]:
                continue
            ranges.append((first, lead[(d + 1) % 7]) if end == n and night[d] else (first, end))
        days.append(ranges)
    # An evening written `a-24:00` may run on into a morning its own day's entry allows anyway:
    # when another day says the same with an overnight end, say it alike so the two merge
    # (fri 18:00-08:00 before an all-day sat joins mon-thu 18:00-08:00).
    for d in range(7):
        if not days[d] or days[d][-1][1] != n or days[d][-1][0] == 0:
            continue
        a, room = days[d][-1][0], lead[(d + 1) % 7]
        for other in days:
            if (
                other
                and other[:-1] == days[d][:-1]
                and other[-1][0] == a
                and 0 < other[-1][1] < a
                and other[-1][1] <= room
            ):
                days[d][-1] = other[-1]
                break
    return days


def _render(days: list[list[tuple[int, int]]], step: int) -> str:
    """Days with the same ranges share one entry, entries in week order from Monday."""

    def clock(slot: int) -> str:
        return f"{slot * step // 60:02d}:{slot * step % 60:02d}"

    groups: dict[tuple[tuple[int, int], ...], list[int]] = {}
    for d, ranges in enumerate(days):
        if ranges:
            groups.setdefault(tuple(ranges), []).append(d)
    entries = []
    for ranges, members in groups.items():
        spec = _day_spec(members)
        first_day = 0 if spec == "daily" else DAY_NAMES.index(spec.split(",")[0].split("-")[0])
        entries.append((first_day, f"{spec} {', '.join(f'{clock(a)}-{clock(b)}' for a, b in ranges)}"))
    return "; ".join(text for _, text in sorted(entries))


__all__ = [
    "Schedule",
    "ScheduleError",
    "SlotGrid",
    "parse_schedule",
    "schedule_grid",
    "fits_grid",
    "grid_text",
    "DAY_NAMES",
]
