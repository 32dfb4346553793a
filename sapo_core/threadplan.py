"""How many threads the node computes with, from what the CPU actually has free: pure functions.

A volunteer's computer is never idle. Beside one busy process on 2 cores, a round with 2 threads
took over ten times as long as with 1 (docs/environment.md, 'OpenMP threads under contention';
thresholds in docs/calibration.md, 'Threads and throttle'). Threads that wait for a core another
program holds stall every parallel region of the step, so the node picks its threads from:

- the user's limit: `control.max_cpus_percent` of the cores (BOINC's "use at most N % of the
  CPUs") and `control.leave_cores` cores left to the user (the desktop default leaves one);
  an explicit `sampler.threads` is taken as is and never adapted;
- what other programs use (cores' worth of CPU: the machine's busy time minus the node's
  own, process tree included), smoothed by the caller;
- a collapse: tokens/s far below this machine's own quiet figure means threads are waiting
  on each other; the caller steps one thread down and keeps it down for a while.

The throttle's share is not an input here: it is a duty cycle over whatever threads run
(control/throttle.py), so its promise, a share of what the unthrottled node would use, holds
at any thread count; cutting threads for it as well would apply it twice.

No I/O: the caller (control/threads.py, node.py) reads psutil and passes numbers in.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

FREE_SLACK = 0.35  # a core counts as free when others leave at least 65 % of it
COLLAPSE_RATIO = 0.35  # tokens/s below this share of the quiet figure: a collapse
SHARING_MESSAGE = "sharing the CPU with other programs: {n} thread{s}"


@dataclass(frozen=True)
class ThreadChoice:
    threads: int
    reason: str

    @property
    def message(self) -> str:
        """The log line the app shows: 'sharing the CPU with other programs: 1 thread (...)'."""
        return self.reason


def cpu_limit(cores: int, max_cpus_percent: float = 100.0, leave_cores: int = 0) -> tuple[int, str]:
    """Most threads the user allows: `max_cpus_percent` of the cores, minus `leave_cores`; at least 1."""
    cores = max(1, int(cores))
    by_percent = max(1, math.floor(cores * max_cpus_percent / 100.0 + 1e-9))
    by_leave = max(1, cores - max(0, int(leave_cores)))
    n = min(by_percent, by_leave)
    parts = []
    if by_percent < cores:
        parts.append(f"{max_cpus_percent:g} % of {cores} cores")
    if leave_cores > 0:
        parts.append(f"{leave_cores} core{'s' * (leave_cores != 1)} left to you")
    why = ", ".join(parts) if parts else f"all {cores} cores"
    return n, f"at most {n} thread{'s' * (n != 1)} ({why})"


def others_busy_cores(system_percent: float, logical_cpus: int, own_cores: float) -> float:
    """Cores' worth of CPU other programs use: the machine's busy share minus the node's own use.

    `system_percent` is psutil.cpu_percent() (0..100 over all logical CPUs); `own_cores` is
    the node's process tree CPU seconds per second over the same interval."""
    busy = max(0.0, min(100.0, system_percent)) / 100.0 * max(1, logical_cpus)
    return max(0.0, busy - max(0.0, own_cores))


def choose_threads(cores: int, others: float, limit: int, cap: int | None = None) -> ThreadChoice:
    """Threads for `cores` physical cores when other programs use `others` cores' worth, within
    the user's `limit` and a collapse `cap` (None: none)."""
    cores, limit = max(1, int(cores)), max(1, int(limit))
    free = max(0.0, cores - max(0.0, others))
    by_load = max(1, math.floor(free + FREE_SLACK))
    n = max(1, min(limit, by_load, cap if cap is not None else limit))
    s = "s" * (n != 1)
    if cap is not None and cap < min(limit, by_load):
        why = f"{SHARING_MESSAGE.format(n=n, s=s)} (stepped down after a collapse in tokens/s)"
    elif by_load < limit:
        why = f"{SHARING_MESSAGE.format(n=n, s=s)} (they use {others:.1f} of {cores} core{'s' * (cores != 1)})"
    else:
        why = f"{n} thread{s}: the CPU is free up to your limit of {limit}"
    return ThreadChoice(n, why)


def collapsed(tok_s: float, quiet_tok_s: float, ratio: float = COLLAPSE_RATIO) -> bool:
    """True when `tok_s` is far below this machine's quiet figure (both > 0 to judge at all)."""
    return tok_s > 0 and quiet_tok_s > 0 and tok_s < ratio * quiet_tok_s


__all__ = [
    "ThreadChoice",
    "cpu_limit",
    "others_busy_cores",
    "choose_threads",
    "collapsed",
    "COLLAPSE_RATIO",
    "FREE_SLACK",
    "SHARING_MESSAGE",
]
