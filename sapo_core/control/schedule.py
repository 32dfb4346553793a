"""The weekly schedule a volunteer may set: when the node is allowed to run.

Syntax (case-insensitive), entries separated by `;` or new lines:

    mon-fri 18:00-08:00; sat-sun 00:00-24:00
    daily 22:00-07:00
    mon,wed,fri 09:00-12:00, 14:00-17:00

An entry is days, then one or more `HH:MM-HH:MM` ranges separated by commas. Days are
`mon`..`sun` (or full names), ranges of them (`fri-mon` wraps), or `daily`, `weekdays`,
`weekends`. A range whose end is not after its start runs overnight: `mon 18:00-08:00`
is Monday 18:00 to Tuesday 08:00. `24:00` ends a day. An empty schedule allows any time.

Standard library only: config.py validates `control.schedule` with `parse_schedule`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime, timedelta

DAY_NAMES = ("mon", "tue", "wed", "thu", "fri", "sat", "sun")
_FULL = ("monday", "tuesday", "wednesday", "thursday", "friday", "saturday", "sunday")
_GROUPS = {"daily": tuple(range(7)), "everyday": tuple(range(7)), "weekdays": tuple(range(5)),
           "weekends": (5, 6)}
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
    raise ScheduleError(f"'{entry}': unknown day '{word.strip()}'; use {', '.join(DAY_NAMES)}, "
                        f"daily, weekdays or weekends ({_EXAMPLE})")


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
        raise ScheduleError(f"'{entry}': '{text.strip()}' is not a time of day; use 00:00..23:59 "
                            f"(24:00 only as an end)")
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


__all__ = ["Schedule", "ScheduleError", "parse_schedule", "DAY_NAMES"]
