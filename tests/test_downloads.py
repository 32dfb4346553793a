"""A download as the volunteer sees it: the status text, the node's report (rate, time left, log
lines), and the terminal's throttle. Pure: a hand-driven clock, no network, no files."""

from __future__ import annotations

import logging

import pytest

from sapo_core.downloads import DownloadLines, DownloadReport, download_text, format_bytes, format_duration
from sapo_core.hooks import Interrupted
from sapo_core.logs import level_name

MB = 10**6
INFO = {"model": "SmolLM2-360M-Instruct", "size_bytes": 386 * MB, "host": "huggingface.co"}


@pytest.mark.parametrize(
    "n, text", [(0, "0 bytes"), (999, "999 bytes"), (12_345, "12 kB"), (386 * MB, "386 MB"), (1_530_000_000, "1.53 GB")]
)
def test_format_bytes(n, text):
    assert format_bytes(n) == text


@pytest.mark.parametrize(
    "s, text",
    [(0, "0 s"), (40.4, "40 s"), (89, "1 min"), (130, "2 min"), (3600, "1 h"), (3900, "1 h 5 min"), (-3, "0 s")],
)
def test_format_duration(s, text):
    assert format_duration(s) == text


@pytest.mark.parametrize(
    "done, total, info, text",
    [
        (
            120 * MB,
            386 * MB,
            {**INFO, "eta_s": 130},
            "Downloading SmolLM2-360M-Instruct: 120 of 386 MB (31 %), about 2 min left",
        ),
        (120 * MB, 386 * MB, INFO, "Downloading SmolLM2-360M-Instruct: 120 of 386 MB (31 %)"),  # no rate yet
        (
            385_900_000,
            386 * MB,
            INFO,
            "Downloading SmolLM2-360M-Instruct: 386 of 386 MB (99 %)",
        ),  # 100 % only at the end
        (386 * MB, 386 * MB, INFO, "Downloaded SmolLM2-360M-Instruct (386 MB); checking and loading it"),
        (
            500 * MB,
            1_530_000_000,
            {"model": "Qwen3-1.7B", "eta_s": 45},
            "Downloading Qwen3-1.7B: 0.50 of 1.53 GB (32 %), about 45 s left",
        ),
        (
            385 * MB,
            386 * MB,
            {**INFO, "eta_s": 0.4},
            "Downloading SmolLM2-360M-Instruct: 385 of 386 MB (99 %)",
        ),  # not "about 0 s left"
        (5 * MB, 0, INFO, "Downloading SmolLM2-360M-Instruct: 5 MB"),  # size unknown
        (
            0,
            0,
            {**INFO, "failed": "ConnectError: refused"},
            "Could not download SmolLM2-360M-Instruct: ConnectError: refused",
        ),
        (0, 10, {}, "Downloading the model: 0 of 10 bytes (0 %)"),
    ],
)
def test_download_text(done, total, info, text):
    assert download_text(info, done, total) == text


class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def _logs(caplog) -> list[tuple[str, str]]:
    return [(level_name(r.levelno), r.getMessage()) for r in caplog.records if r.name == "sapo_core.downloads"]


def test_report_logs_start_and_end_and_measures_rate_and_time_left(caplog):
    caplog.set_level(logging.INFO, logger="sapo_core")
    clock, events = Clock(), []
    report = DownloadReport(lambda phase, done, total, **info: events.append((phase, done, total, info)), clock=clock)
    report.started("SmolLM2-360M-Instruct", 386 * MB, "huggingface.co")
    assert _logs(caplog) == [("info", "downloading SmolLM2-360M-Instruct (386 MB) from huggingface.co …")]
    report(0, 386 * MB)
    assert events[-1] == ("download", 0, 386 * MB, INFO)  # no rate before a second has passed
    clock.t += 10
    report(40 * MB, 386 * MB)  # 4 MB/s
    phase, done, total, info = events[-1]
    assert (phase, done, total) == ("download", 40 * MB, 386 * MB)
    assert info["bytes_per_s"] == 4 * MB and info["eta_s"] == pytest.approx(346 / 4)
    # the rate follows the last ~10 s: a slower stretch shows at once, not averaged with the start away
    clock.t += 10
    report(60 * MB, None)  # total unknown in this call: the catalogue's size
    assert events[-1][2] == 386 * MB and events[-1][3]["bytes_per_s"] == 2 * MB
    clock.t += 43
    report(386 * MB, 386 * MB)
    report.finished()
    assert _logs(caplog)[-1] == ("info", "downloaded and verified SmolLM2-360M-Instruct in 63 s")


def test_report_of_a_failure_and_of_a_stop(caplog):
    caplog.set_level(logging.INFO, logger="sapo_core")
    clock, events = Clock(), []
    stop = []
    report = DownloadReport(
        lambda phase, done, total, **info: events.append((done, total, info)),
        should_stop=lambda: bool(stop),
        clock=clock,
    )
    report.started("Qwen3-0.6B", 639 * MB, "huggingface.co")
    report(10 * MB, 639 * MB)
    clock.t += 7
    report.failed("ReadTimeout: timed out")
    assert _logs(caplog)[-1] == ("warning", "download of Qwen3-0.6B failed after 7 s: ReadTimeout: timed out")
    assert events[-1] == (
        0,
        0,
        {"model": "Qwen3-0.6B", "size_bytes": 639 * MB, "host": "huggingface.co", "failed": "ReadTimeout: timed out"},
    )
    stop.append(True)
    with pytest.raises(Interrupted):
        report(20 * MB, 639 * MB)


def test_terminal_lines_every_few_seconds_or_ten_percent_and_always_the_end():
    lines = DownloadLines(every_seconds=5.0, every_fraction=0.1)
    total, printed = 386 * MB, []
    # a slow download: an event 4 times a second for 20 s, 1 % of the file a second
    t = 0.0
    for _ in range(80):
        t += 0.25
        if (text := lines.line(int(total * t / 100), total, INFO, now=t)) is not None:
            printed.append((t, text))
    # 80 events, 5 lines: the first, then every 5 s, or sooner when it reaches the next 10 %
    assert [t for t, _ in printed] == [0.25, 5.25, 10.0, 15.0, 20.0]
    # a fast one: 10 % a second; a line per 10 %, whatever the clock says
    lines, fast = DownloadLines(every_seconds=5.0, every_fraction=0.1), []
    for i in range(0, 41):
        t = i * 0.25
        if lines.line(int(total * min(1.0, t / 10)), total, INFO, now=t) is not None:
            fast.append(t)
    assert fast == [0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0, 10.0]
    # the end is said once, however many final events arrive
    assert lines.line(total, total, INFO, now=11.0) is None
    assert "(31 %) at 4 MB/s, about 2 min left" in DownloadLines().line(
        120 * MB, total, {**INFO, "eta_s": 130, "bytes_per_s": 4 * MB}, now=0.0
    )
    assert DownloadLines().line(0, 0, {**INFO, "failed": "offline"}, now=0.0) is None  # the warning log says it
