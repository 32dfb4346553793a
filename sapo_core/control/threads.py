"""Inside the node process: keep the thread count fitted to what the CPU has free, while running.

`ThreadGovernor` holds the state around the pure choice of `sapo_core.threadplan`: readings
of what other programs use, each an average over `control.check_seconds` (`CpuMeter`: psutil's
machine-wide busy time minus the node's own process tree, the llama.cpp sampler child included),
a change only once the new count has held for a few readings (a compile that lasts a second must
not make the node flap), and the quiet tokens/s of each thread count seen in this run: a round far below it is a
collapse, and the count steps one down for `CAP_ROUNDS` rounds before it may grow again.

The worker runs `observe` on its own thread every few seconds and `after_round` after each
round; a returned count is handed to the Controller, which applies it at the round thread's
next checkpoint. An explicit `sampler.threads` (or a `set_threads` command above 0) fixes the
count: the governor then only reports.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import psutil

from sapo_core.cpu import busy_seconds, physical_cores, tree_cpu_seconds
from sapo_core.threadplan import ThreadChoice, choose_threads, collapsed, cpu_limit, others_busy_cores

DOWN_READINGS = 2  # readings a smaller count must hold before the node steps down
UP_READINGS = 5  # ... and a larger one before it steps up again (slower: growing back is the risk)
CAP_ROUNDS = 10  # rounds a collapse keeps the count stepped down


class CpuMeter:
    """Cores' worth of CPU other programs use since the previous reading (its own snapshot of the
    machine's CPU times: psutil.cpu_percent(None) is one interval shared by every caller)."""

    def __init__(self, proc: psutil.Process | None = None, clock=time.monotonic) -> None:
        self.proc = proc or psutil.Process()
        self.clock = clock
        self.logical = psutil.cpu_count(logical=True) or 1
        self._t, self._own, self._busy = clock(), tree_cpu_seconds(self.proc), busy_seconds()

    def read(self) -> float:
        now, own, busy = self.clock(), tree_cpu_seconds(self.proc), busy_seconds()
        dt = max(1e-3, now - self._t)
        own_cores, busy_cores = (own - self._own) / dt, (busy - self._busy) / dt
        self._t, self._own, self._busy = now, own, busy
        return others_busy_cores(100.0 * busy_cores / self.logical, self.logical, own_cores)


def others_now(interval: float = 0.5) -> float:
    """One reading over `interval` seconds (at start-up, before the node computes anything)."""
    meter = CpuMeter()
    time.sleep(interval)
    return meter.read()


def starting_threads(fixed: int, max_cpus_percent: float, leave_cores: int) -> ThreadChoice:
    """The node's thread count at start-up: `fixed` (sampler.threads) when set; else what the CPU
    has free now, within the user's limit (the governor adapts it while running)."""
    if fixed:
        return ThreadChoice(fixed, f"{fixed} thread{'s' * (fixed != 1)} (sampler.threads)")
    cores = physical_cores()
    limit, why = cpu_limit(cores, max_cpus_percent, leave_cores)
    choice = choose_threads(cores, others_now(0.5), limit)
    return ThreadChoice(choice.threads, f"{choice.reason}; {why}")


@dataclass
class ThreadGovernor:
    cores: int
    limit: int
    fixed: int = 0  # > 0: the user's own count, never adapted
    current: int = 1
    others: float | None = None  # cores' worth used by other programs, last reading
    cap: int | None = None
    cap_until_round: int = 0
    quiet: dict[int, float] = field(default_factory=dict)  # threads -> best training tok/s seen
    _candidate: int | None = None
    _seen: int = 0

    @classmethod
    def for_config(
        cls, cores: int, max_cpus_percent: float, leave_cores: int, fixed: int, start: int
    ) -> ThreadGovernor:
        limit, _ = cpu_limit(cores, max_cpus_percent, leave_cores)
        return cls(cores=cores, limit=limit, fixed=fixed, current=start)

    def choice(self) -> ThreadChoice:
        if self.fixed:
            return ThreadChoice(self.fixed, f"{self.fixed} thread{'s' * (self.fixed != 1)} (sampler.threads)")
        return choose_threads(self.cores, self.others or 0.0, self.limit, self.cap)

    def observe(self, others: float) -> ThreadChoice | None:
        """A new reading of others' use; the choice when the count should change now, else None."""
        self.others = others
        if self.fixed:
            return None
        c = self.choice()
        if c.threads == self.current:
            self._candidate, self._seen = None, 0
            return None
        if c.threads != self._candidate:
            self._candidate, self._seen = c.threads, 0
        self._seen += 1
        if self._seen < (DOWN_READINGS if c.threads < self.current else UP_READINGS):
            return None
        self._candidate, self._seen = None, 0
        self.current = c.threads
        return c

    def after_round(self, round_no: int, train_tok_s: float, share: float) -> ThreadChoice | None:
        """Judge a finished round's training speed (per unit of throttle share) against the quiet
        figure of the same thread count; on a collapse, step one thread down."""
        if self.cap is not None and round_no >= self.cap_until_round:
            self.cap = None  # may grow again: observe() decides when
        if self.fixed or train_tok_s <= 0 or share <= 0:
            return None
        rate = train_tok_s / share
        quiet = self.quiet.get(self.current, 0.0)
        if collapsed(rate, quiet) and self.current > 1:
            self.cap, self.cap_until_round = self.current - 1, round_no + CAP_ROUNDS
            self.current = self.cap
            c = self.choice()
            self.current = c.threads
            return ThreadChoice(
                c.threads,
                f"{c.reason}: training ran at {rate:.0f} tok/s, "
                f"{100 * rate / quiet:.0f} % of its {quiet:.0f} tok/s here",
            )
        self.quiet[self.current] = max(quiet, rate)
        return None


__all__ = ["ThreadGovernor", "CpuMeter", "others_now", "starting_threads", "CAP_ROUNDS"]
