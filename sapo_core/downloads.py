"""A model download as the volunteer sees it: progress events, log lines, readable text.

On a first start the chosen model may not be on disk yet, and fetching a few hundred MB takes
minutes. Three parts, all standard library (the desktop app imports this module):

- `DownloadReport`, in the node: the byte callback `modelfiles.resolve_model_file` drives, turned
  into the round hooks' `progress("download", done, total, **info)` and log records: one line
  when the download starts ("downloading SmolLM2-360M-Instruct (386 MB) from huggingface.co …"),
  one when it is verified, one when it fails; `info` carries the model's title, its size, the
  host, the rate and the time left. The worker's `Controller.progress` limits the events to four
  a second and always passes the last one. A stop asked mid-download raises `Interrupted`
  from the callback (huggingface_hub deletes its partial file; the next start downloads again).
- `download_text(...)`: "Downloading SmolLM2-360M-Instruct: 120 of 386 MB (31 %), about 2 min
  left": the app's status line and the terminal's say the same.
- `DownloadLines`: the terminal's throttle: a line when the download starts, then one every
  `every_seconds` or every `every_fraction` of the file, whichever comes first, and the last one
  (a failure is the node's warning line, not another progress line).
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable
from typing import Any

from sapo_core.control.vocabulary import DOWNLOAD
from sapo_core.hooks import Interrupted

log = logging.getLogger(__name__)

PHASE = DOWNLOAD  # Progress.phase of a model download (the node is still starting: round 0)
RATE_WINDOW_SECONDS = 10.0  # the rate is measured over about this much recent time


def format_bytes(n: float) -> str:
    """386 MB, 1.53 GB, 12 kB: the unit the catalogue and the model picker use (powers of 1000)."""
    for unit, size in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= size:
            value = n / size
            return f"{value:.2f} {unit}" if unit == "GB" else f"{value:.0f} {unit}"
    return f"{int(n)} bytes"


def format_duration(seconds: float) -> str:
    """About how long: '40 s', '2 min', '1 h 5 min'."""
    s = max(0, round(seconds))
    if s < 60:
        return f"{s} s"
    if s < 3600:
        return f"{round(s / 60)} min"
    h, m = divmod(round(s / 60), 60)
    return f"{h} h {m} min" if m else f"{h} h"


def download_text(info: dict[str, Any], done: int, total: int, with_rate: bool = False) -> str:
    """One line for a `Progress(phase="download")`: what, how far (and how fast), how long still."""
    title = str(info.get("model") or "the model")
    if info.get("failed"):
        return f"Could not download {title}: {info['failed']}"
    if total > 0 and done >= total:
        return f"Downloaded {title} ({format_bytes(total)}); checking and loading it"
    if total <= 0:
        return f"Downloading {title}: {format_bytes(done)}"
    # both figures in the total's unit, so "120 of 386 MB" never reads "1 of 2 GB"
    unit, size = next(((u, s) for u, s in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)) if total >= s), ("bytes", 1))
    digits = 2 if unit == "GB" else 0
    text = (
        f"Downloading {title}: {done / size:.{digits}f} of {total / size:.{digits}f} {unit} "
        f"({int(100 * done / total)} %)"
    )  # floored: 100 % only once it is all here
    rate = info.get("bytes_per_s")
    if with_rate and isinstance(rate, (int, float)) and rate > 0:
        text += f" at {format_bytes(rate)}/s"
    eta = info.get("eta_s")
    if isinstance(eta, (int, float)) and eta >= 1:
        text += f", about {format_duration(eta)} left"
    return text


class DownloadReport:
    """The node's side of a download; see the module docstring. `progress` is the round hooks'
    method; `should_stop()` says a stop was asked (the download is abandoned)."""

    def __init__(
        self,
        progress: Callable[..., None],
        should_stop: Callable[[], bool] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._progress, self._should_stop, self._clock = progress, should_stop, clock
        self.info: dict[str, Any] = {}
        self._size = 0
        self._started = 0.0
        self._samples: list[tuple[float, int]] = []  # (time, bytes) over the last RATE_WINDOW_SECONDS
        self.done, self.total = 0, 0

    def started(self, title: str, size_bytes: int, host: str) -> None:
        self.info = {"model": title, "size_bytes": int(size_bytes), "host": host}
        self._size, self._started, self._samples = int(size_bytes), self._clock(), []
        log.info(f"downloading {title} ({format_bytes(size_bytes)}) from {host} …")

    def __call__(self, done: int, total: int | None) -> None:
        """The byte callback (modelfiles.Progress): bytes so far, and the file's size if known."""
        if self._should_stop is not None and self._should_stop():
            raise Interrupted("stopped while downloading the model")
        now = self._clock()
        self.done, self.total = int(done), int(total or self._size or 0)
        self._samples.append((now, self.done))
        while len(self._samples) > 2 and now - self._samples[1][0] >= RATE_WINDOW_SECONDS:
            self._samples.pop(0)
        info = dict(self.info)
        t0, d0 = self._samples[0]
        if now - t0 >= 1.0 and self.done > d0:
            rate = (self.done - d0) / (now - t0)
            info["bytes_per_s"] = round(rate)
            if self.total:
                info["eta_s"] = round(max(0, self.total - self.done) / rate, 1)
        self._progress(PHASE, self.done, self.total, **info)

    def finished(self) -> None:
        """The file is downloaded and verified."""
        log.info(
            f"downloaded and verified {self.info.get('model', 'the model')} in {self._clock() - self._started:.0f} s"
        )

    def failed(self, why: str) -> None:
        """The download failed (the caller falls back and says to what)."""
        title = self.info.get("model", "the model")
        log.warning(f"download of {title} failed after {self._clock() - self._started:.0f} s: {why}")
        # done = total = 0 is never held back by the rate limit (it reads as a phase's end)
        self._progress(PHASE, 0, 0, **{**self.info, "failed": why})


class DownloadLines:
    """When a terminal prints a download's progress: not a flood, and always its end."""

    def __init__(self, every_seconds: float = 5.0, every_fraction: float = 0.1) -> None:
        self.every_seconds, self.every_fraction = every_seconds, every_fraction
        self._last_t: float | None = None
        self._last_step = 0  # the last printed multiple of every_fraction
        self._ended = False

    def line(self, done: int, total: int, info: dict[str, Any], now: float | None = None) -> str | None:
        """The line to print for this progress event, or None to stay quiet."""
        if info.get("failed"):
            return None  # the node's warning line says it, with how long it tried
        now = time.monotonic() if now is None else now
        end = total > 0 and done >= total
        if end:
            if self._ended:
                return None
            self._ended = True
        else:
            self._ended = False
            step = math.floor(done / total / self.every_fraction + 1e-9) if total > 0 else 0
            if self._last_t is not None and now - self._last_t < self.every_seconds and step <= self._last_step:
                return None
            self._last_step = step
        self._last_t = now
        return download_text(info, done, total, with_rate=True)


class TerminalHooks:
    """Round hooks for a command run in a terminal (`sapo-node eval`, `export`, `try`): a model
    download's lines (`DownloadLines`, the node's own), prefixed with the command, on stderr, so a
    model fetched on first use is not minutes of silence; nothing else. (The download's log lines
    reach the same terminal through the CLI's log handler, logs.py.)"""

    stop_reason = None  # Ctrl+C stops the command, not these hooks

    def __init__(self, command: str, stream: Any = None) -> None:
        self.command, self.stream = command, stream
        self._lines = DownloadLines()

    def _out(self, text: str) -> None:
        import sys

        print(f"{self.command}: {text}", file=self.stream or sys.stderr, flush=True)

    def checkpoint(self) -> None:
        return None

    def progress(self, phase: str, done: int, total: int, **info: Any) -> None:
        if phase == PHASE:
            line = self._lines.line(done, total, info)
            if line:
                self._out(line)


def terminal_download(command: str, stream: Any = None) -> DownloadReport:
    """The byte callback for `modelfiles.resolve_model_file`, reporting like `TerminalHooks`."""
    hooks = TerminalHooks(command, stream)
    return DownloadReport(hooks.progress)


__all__ = [
    "PHASE",
    "DownloadReport",
    "DownloadLines",
    "download_text",
    "format_bytes",
    "format_duration",
    "TerminalHooks",
    "terminal_download",
]
