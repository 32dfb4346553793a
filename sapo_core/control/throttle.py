"""The CPU-share throttle: a duty cycle, as BOINC's "use at most X % of CPU time".

The node works, then sleeps, so that work / (work + sleep) ≈ share; its CPU use is then
`share` times what it would use unthrottled, whatever else runs on the machine.

Work is wall-clock time between two checkpoints, not the CPU time of the round's thread:
the llama.cpp sampler computes in a child process while that thread waits for it, and on a
loaded machine a burst that is often descheduled must still be paid for in proportion (a
CPU-time count lets the node keep most of what it gets: it sleeps little after a slow
burst). Where an interval mostly waits on the network (the swarm's share and gather phases),
the caller says how much of it was work: the CPU time its thread used there, verifying peers'
records (`owed(work=...)`), so a gather that waits 10 s does not buy a 30 s sleep, and one that
spends 2 s checking signatures and decoding pays for them. Checking peers' completions against
our policy (a forward pass) is a phase of its own, billed as work: while it still counted as the
gather, a 50 % throttle let the node use 65 % of what it used unthrottled (`sapo-bench soak`
with peers that send model text, 2026-11-25).

The sleep is owed once at least a burst of work (`quantum`, longer at high shares) has accumulated, so the node
alternates short bursts and pauses (the volunteer's programs stay responsive), and a
checkpoint costs one clock read. Time spent paused is forgiven (`rested()`).

A sleep is billed as long as it really lasted (`rested(slept)`), up to the moment the thread
runs again: on a loaded machine a woken thread waits for a core after each sleep, and that
wait is neither work nor owed sleep. Not billing it made a throttle use visibly less than
asked (docs/calibration.md, 'Threads and throttle'); billed, the overshoot is a credit against
the next sleep (at most one quantum's worth, so nothing is banked for later bursts).
"""

from __future__ import annotations

import time
from collections.abc import Callable

DEFAULT_QUANTUM = 0.1  # seconds of work between two sleeps
MAX_SLEEP = 30.0  # a long stretch without checkpoints does not buy a minute-long stall


class DutyCycle:
    def __init__(
        self, share: float = 1.0, quantum: float = DEFAULT_QUANTUM, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.quantum, self.clock = quantum, clock
        self.share = 1.0
        self.work = 0.0
        self.debt = 0.0  # seconds of sleep owed for the work so far, minus sleep already taken
        self._mark = clock()
        self.set_share(share)

    def set_share(self, share: float) -> None:
        if not 0 < share <= 1:
            raise ValueError(f"throttle share {share} must be in (0, 1]")
        if self.share >= 1.0:
            self.rested()  # unthrottled time is never owed
        self.share = float(share)

    def owed(self, work: float | None = None) -> float:
        """Account the interval since the last call; seconds to sleep now. `work`: how much of the
        interval was work (at most all of it); None: all of it."""
        now = self.clock()
        interval, self._mark = now - self._mark, now
        if self.share >= 1.0:
            self.work = self.debt = 0.0
            return 0.0
        done = interval if work is None else min(max(0.0, work), interval)
        self.work += done
        self.debt += done * (1.0 - self.share) / self.share
        if self.work < self.burst():
            return 0.0
        return min(MAX_SLEEP, max(0.0, self.debt))

    def burst(self) -> float:
        """Work between two sleeps: a quantum, longer at high shares so that each sleep lasts at
        least a quantum too (a 75 % throttle works 0.3 s, sleeps 0.1 s): every sleep costs a wait
        for a core on waking, and many tiny sleeps made 75 % read as 64 % under load."""
        return self.quantum * max(1.0, self.share / (1.0 - self.share)) if self.share < 1.0 else self.quantum

    def rested(self, slept: float | None = None) -> None:
        """Count work from here. After a sleep, `slept` is how long it really lasted (billed against
        the debt; an overshoot is credit, up to one quantum's sleep); without it (a pause, a hold,
        unthrottled time) the debt is forgiven."""
        if slept is None or self.share >= 1.0:
            self.debt = 0.0
        else:
            credit = self.burst() * (1.0 - self.share) / self.share
            self.debt = max(-credit, self.debt - slept)
        self.work = 0.0
        self._mark = self.clock()


__all__ = ["DutyCycle", "DEFAULT_QUANTUM", "MAX_SLEEP"]
