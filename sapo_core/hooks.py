"""How long-running work inside a round yields to the volunteer.

Sampling and training call `hooks.checkpoint()` often (every decoded token batch, every
micro-batch). The worker's implementation blocks there while the node is paused, sleeps
there to hold a throttle's duty cycle, and raises `Interrupted` when the node must stop;
the default does nothing. `hooks.progress()` reports where a round is, for the GUI.
Log lines are not the hooks' business: modules log with `logging` (see logs.py).
"""

from __future__ import annotations

from typing import Any, Protocol


class Interrupted(Exception):
    """Raised from `checkpoint()` when the node must abandon the current round (stop)."""


class RoundHooks(Protocol):
    def checkpoint(self) -> None:
        """Called often from hot loops: may block (pause, throttle) or raise `Interrupted`."""

    def progress(self, phase: str, done: int, total: int, **info: Any) -> None:
        """Phase is one of: sample, score, share, gather, update, save; or download (the model, at
        start-up: done/total in bytes, info from downloads.DownloadReport)."""


class NullHooks:
    """Hooks that never pause and report nothing (library use, tests, benchmarks)."""

    def checkpoint(self) -> None:
        return None

    def progress(self, phase: str, done: int, total: int, **info: Any) -> None:
        return None
