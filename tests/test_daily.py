"""Contribution by day: a real run store holding rounds at chosen local times (a round across
midnight, a day with a pause, days without anything, a daylight-saving change), read back as
per-day figures, running intervals and `sapo-node stats`' table."""

from __future__ import annotations

import datetime as dt
import json
import time

import pytest

from sapo_core.cli import main
from sapo_core.commands.stats import gather_stats
from sapo_core.contributions import contribution_totals
from sapo_core.daily import by_day, contribution_by_day, day_bounds, pause_after, running_intervals
from sapo_core.store import STORE_NAME, RunStore


def _at(day: dt.date, hh: int, mm: int = 0, ss: int = 0) -> float:
    """Unix time of a local wall-clock time."""
    return dt.datetime.combine(day, dt.time(hh, mm, ss)).timestamp()


def _rounds(store: RunStore, first: int, start: float, n: int, secs: float = 600.0, wait: float = 10.0) -> int:
    """n rounds of `secs`, `wait` apart, from `start`; returns the next round number."""
    t = start
    for r in range(first, first + n):
        store.record_round(r, {"cpu/seconds": 2 * secs, "swarm/published": 2.0}, started=t, ended=t + secs)
        t += secs + wait
    return first + n


@pytest.fixture
def local_zone(monkeypatch):
    """Switch the process's local time zone for one test (time.tzset), and back afterwards."""

    def use(name: str) -> None:
        monkeypatch.setenv("TZ", name)
        time.tzset()

    yield use
    monkeypatch.undo()
    time.tzset()


def test_running_intervals_merge_rounds_and_split_at_pauses():
    spans = [(0, 100), (110, 210), (210, 300), (900, 1000), (1003, 1103), (1500, 1510)]
    assert pause_after(spans) == pytest.approx(200.0)  # two median rounds (100 s)
    assert running_intervals(spans, 200.0) == [(0, 300), (900, 1103), (1500, 1510)]
    assert running_intervals(spans, 600.0) == [(0, 1510)]  # gaps of 600 and 397 s: no pause
    assert running_intervals([(50, 40)], 60.0) == [(50, 50)]  # a clock stepped back: no negative time
    assert pause_after([(0, 5), (6, 10)]) == 60.0  # short rounds: the floor
    assert running_intervals([], 60.0) == [] and pause_after([]) == 60.0


def test_days_split_rounds_at_midnight_and_count_pauses_out(tmp_path, local_zone):
    local_zone("Europe/Berlin")
    today = dt.date(2026, 11, 20)
    now = _at(today, 12)
    d = [today - dt.timedelta(days=k) for k in range(14)]  # d[0] today, d[k] k days ago
    s = RunStore(tmp_path / STORE_NAME)
    r = 1
    # 5 days ago: 6 rounds of 10 min from 09:00, a pause of 2 h, 3 more
    r = _rounds(s, r, _at(d[5], 9), 6)
    r = _rounds(s, r, _at(d[5], 13), 3)
    # 3 days ago -> 2 days ago: one round from 23:55 to 00:05 (5 min on each side of midnight)
    r = _rounds(s, r, _at(d[3], 23, 55), 1)
    # today: two rounds before noon, and one older than the 14 days shown
    r = _rounds(s, r, _at(d[0], 10), 2)
    s.record_round(
        r,
        {"cpu/seconds": 99.0},
        started=_at(today - dt.timedelta(days=20), 9),
        ended=_at(today - dt.timedelta(days=20), 9, 10),
    )
    s.record_receipts(7, [("peerA", 2, 0), ("peerB", 2, 1)], seen=_at(d[5], 13, 30))
    s.record_receipts(8, [("peerA", 9, 0)], seen=_at(d[0], 10, 30))
    daily = contribution_by_day(s, now=now)
    days = {x["date"]: x for x in daily["days"]}
    assert len(daily["days"]) == 14 and daily["days"][-1]["date"] == "2026-11-20"
    assert daily["days"][0]["date"] == "2026-11-07"

    five = days[d[5].isoformat()]
    assert (five["seconds"], five["rounds"], five["receipts"]) == (9 * 600, 9, 2)
    assert five["cpu_hours"] == pytest.approx(9 * 1200 / 3600) and five["groups_published"] == 18
    three, two = days[d[3].isoformat()], days[d[2].isoformat()]
    assert three["seconds"] == pytest.approx(300) and three["rounds"] == 0  # counted where it ended
    assert two["seconds"] == pytest.approx(300) and two["rounds"] == 1
    assert days[today.isoformat()]["seconds"] == 1200 and days[today.isoformat()]["receipts"] == 1
    for k in (1, 4, 6, 13):  # days with nothing
        assert days[d[k].isoformat()] | {"date": "", "start": 0, "end": 0} == {
            "date": "",
            "start": 0,
            "end": 0,
            "seconds": 0.0,
            "cpu_hours": 0.0,
            "rounds": 0,
            "groups_published": 0.0,
            "receipts": 0,
        }

    # running intervals: the morning run, the afternoon run, the midnight round, today's run
    running = daily["running"]
    assert [(round(a - _at(d[5], 9)), round(b - _at(d[5], 9))) for a, b in running[:2]] == [
        (0, 6 * 610 - 10),
        (4 * 3600, 4 * 3600 + 3 * 610 - 10),
    ]
    assert len(running) == 4 and running[2] == [_at(d[3], 23, 55), _at(d[2], 0, 5)]
    assert running[3] == [_at(d[0], 10), _at(d[0], 10) + 1210]
    # the figures agree with the totals the card shows
    t = contribution_totals(s, now=now)
    assert t["seconds_today"] == days[today.isoformat()]["seconds"]
    assert t["seconds_week"] == pytest.approx(sum(x["seconds"] for x in daily["days"][-7:]))
    assert t["rounds_week"] == sum(x["rounds"] for x in daily["days"][-7:])


def test_daylight_saving_days_are_calendar_days(tmp_path, local_zone):
    local_zone("Europe/Berlin")
    spring, autumn = dt.date(2026, 3, 29), dt.date(2026, 10, 25)  # 23 h and 25 h days
    bounds = {d: (a, b) for d, a, b in day_bounds(_at(spring + dt.timedelta(days=1), 12), days=3)}
    assert bounds[spring][1] - bounds[spring][0] == 23 * 3600
    bounds = {d: (a, b) for d, a, b in day_bounds(_at(autumn, 23), days=2)}
    assert bounds[autumn][1] - bounds[autumn][0] == 25 * 3600
    # one long round from 23:00 before the spring change to 04:00 local: 1 h, then 3 h (02:00 -> 03:00 skipped)
    start, end = _at(spring - dt.timedelta(days=1), 23), _at(spring, 4)
    days = by_day([(start, end, 3600.0, 0.0)], [], now=_at(spring, 12), days=2)
    assert [d.seconds for d in days] == [3600, 3 * 3600] and [d.rounds for d in days] == [0, 1]
    s = RunStore(tmp_path / STORE_NAME)
    _rounds(s, 1, _at(autumn, 1, 30), 12)  # through the hour that happens twice
    stats = gather_stats(s, now=_at(autumn, 12))
    json.dumps(stats)  # the app and `--json` take it as it is
    assert stats["daily"]["days"][-1]["seconds"] == 12 * 600
    assert stats["daily"]["running"] == [[_at(autumn, 1, 30), _at(autumn, 1, 30) + 12 * 610 - 10]]


def test_stats_prints_a_row_per_day_from_the_first_busy_one(tmp_path, capsys, local_zone):
    local_zone("UTC")
    s = RunStore(tmp_path / STORE_NAME)
    today = dt.date.today()
    _rounds(s, 1, _at(today - dt.timedelta(days=2), 8), 6, secs=1800, wait=0)  # 3 h, two days ago
    s.record_receipts(6, [("peerA", 1, 0)], seen=_at(today - dt.timedelta(days=2), 12))
    s.close()
    assert main(["stats", "--run-dir", str(tmp_path)]) == 0
    out = capsys.readouterr().out.splitlines()
    head = out.index(next(line for line in out if line.startswith("by day (local time)")))
    assert out[head].split()[-4:] == ["running", "CPU-hours", "rounds", "receipts"]
    two_ago = (today - dt.timedelta(days=2)).strftime("%a %Y-%m-%d")
    assert out[head + 1].split() == [*two_ago.split(), "3.0", "h", "6.00", "6", "1"]
    assert out[head + 2].split()[-1] == "-" and len(out) == head + 4  # yesterday idle, then today
    assert main(["stats", "--run-dir", str(tmp_path), "--json"]) == 0
    body = json.loads(capsys.readouterr().out)
    assert [d["rounds"] for d in body["daily"]["days"]][-3:] == [6, 0, 0]
    assert len(body["daily"]["running"]) == 1


def test_an_empty_store_has_fourteen_empty_days(tmp_path):
    s = RunStore(tmp_path / STORE_NAME)
    daily = contribution_by_day(s)
    assert len(daily["days"]) == 14 and daily["running"] == [] and not any(d["seconds"] for d in daily["days"])
