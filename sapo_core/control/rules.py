"""The volunteer's rules: whether the node may run now, and if not, the reason shown to them.

`Rules.check(reading, t)` takes one `SystemReading` (the OS boundary, system.py) and a
monotonic time, and returns None (run) or the reason to pause, e.g. "on battery (54 %)".
Rules that read a continuous value do not flap: temperature and memory have hysteresis,
and "only when idle" waits for `idle_minutes` without input (or, where the OS does not tell
input idle time, that long with other programs' CPU use below `idle_cpu_percent`) before
the node runs again, while any input pauses it at the next check. A rule that goes on
holding keeps the reason it paused with (the figures in it are those of that moment).

Order when several hold: battery, schedule, temperature, memory, idle. Every rule is
evaluated at every check so each one's memory (hysteresis, calm time) stays current.
"""

from __future__ import annotations

import re

from sapo_core.config import ControlConfig
from sapo_core.control.schedule import Schedule, parse_schedule
from sapo_core.control.system import SystemReading

TEMPERATURE_HYSTERESIS_C = 5.0  # resume only once this much below the limit
MEMORY_HYSTERESIS_FRACTION = 0.10  # resume only once free memory is this much above the limit
MEMORY_HYSTERESIS_MIN_BYTES = 256 * 2**20
GB = 1024**3


def _duration(seconds: float) -> str:
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 5400:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


def _stem(reason: str) -> str:
    """The words of a reason before its first figure: the same stem is the same situation."""
    return re.split(r"\d", reason, maxsplit=1)[0]


class Rules:
    def __init__(self, cfg: ControlConfig, schedule: Schedule | None = None) -> None:
        self.cfg = cfg
        self.schedule = schedule if schedule is not None else parse_schedule(cfg.schedule)
        self._hot = False
        self._low_memory = False
        self._cpu_busy = True  # unknown at start: wait for a calm period before running
        self._calm_since: float | None = None
        self._reasons: list[str | None] = [None] * 5

    @property
    def active(self) -> list[str]:
        """The rules switched on, by name (for the status)."""
        c = self.cfg
        names = [
            ("pause_on_battery", c.pause_on_battery),
            ("schedule", not self.schedule.always),
            ("max_temperature_c", c.max_temperature_c > 0),
            ("min_free_memory_gb", c.min_free_memory_gb > 0),
            ("only_when_idle", c.only_when_idle),
        ]
        return [n for n, on in names if on]

    def check(self, r: SystemReading, t: float) -> str | None:
        reasons = [self._battery(r), self._schedule(r), self._temperature(r), self._memory(r), self._idle(r, t)]
        # a rule that goes on holding keeps the words it paused with: a reading that moves (41 %, 40 %...)
        # must not turn into a stream of state changes
        reasons = [
            old if (new and old and _stem(old) == _stem(new)) else new for old, new in zip(self._reasons, reasons)
        ]
        self._reasons = reasons
        return next((x for x in reasons if x), None)

    # --- one method per rule --------------------------------------------------------------
    def _battery(self, r: SystemReading) -> str | None:
        if not self.cfg.pause_on_battery or not r.on_battery:
            return None
        return "on battery" + (f" ({r.battery_percent:.0f} %)" if r.battery_percent is not None else "")

    def _schedule(self, r: SystemReading) -> str | None:
        if self.schedule.allows(r.now):
            return None
        nxt = self.schedule.next_change(r.now)
        when = f"; runs again {nxt:%a %H:%M}" if nxt else ""
        return f"outside schedule ({self.schedule.text.strip()}{when})"

    def _temperature(self, r: SystemReading) -> str | None:
        limit = self.cfg.max_temperature_c
        if limit <= 0 or r.temperature_c is None:
            self._hot = False
            return None
        if r.temperature_c > limit:
            self._hot = True
        elif r.temperature_c <= limit - TEMPERATURE_HYSTERESIS_C:
            self._hot = False
        if not self._hot:
            return None
        return (
            f"CPU at {r.temperature_c:.0f} °C, limit {limit:.0f} °C "
            f"(resumes at {limit - TEMPERATURE_HYSTERESIS_C:.0f} °C)"
        )

    def _memory(self, r: SystemReading) -> str | None:
        limit = self.cfg.min_free_memory_gb * GB
        if limit <= 0 or r.free_memory_bytes is None:
            self._low_memory = False
            return None
        margin = max(MEMORY_HYSTERESIS_MIN_BYTES, MEMORY_HYSTERESIS_FRACTION * limit)
        if r.free_memory_bytes < limit:
            self._low_memory = True
        elif r.free_memory_bytes >= limit + margin:
            self._low_memory = False
        if not self._low_memory:
            return None
        return f"free memory {r.free_memory_bytes / GB:.1f} GB, below {self.cfg.min_free_memory_gb:g} GB"

    def _idle(self, r: SystemReading, t: float) -> str | None:
        if not self.cfg.only_when_idle:
            return None
        wait = self.cfg.idle_minutes * 60
        if r.idle_seconds is not None:  # the OS tells when the last input was
            if r.idle_seconds >= wait:
                return None
            return f"you are using the computer (runs after {_duration(wait)} without input)"
        # no input idle time here: other programs' CPU use decides, with the same grace period
        if r.other_cpu_percent is None:
            return None if not self._cpu_busy else "waiting to see whether the computer is in use"
        if r.other_cpu_percent > self.cfg.idle_cpu_percent:
            self._cpu_busy, self._calm_since = True, None
        elif self._calm_since is None:
            self._calm_since = t
        if self._cpu_busy and self._calm_since is not None and t - self._calm_since >= wait:
            self._cpu_busy = False
        if not self._cpu_busy:
            return None
        return (
            f"other programs are using the CPU ({r.other_cpu_percent:.0f} %; runs after {_duration(wait)} "
            f"below {self.cfg.idle_cpu_percent:.0f} %)"
        )


__all__ = ["Rules", "TEMPERATURE_HYSTERESIS_C", "MEMORY_HYSTERESIS_FRACTION"]
