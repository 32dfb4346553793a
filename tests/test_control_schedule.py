"""Weekly schedule: parsing (with errors that say how to write it) and which times it allows."""

from __future__ import annotations

from datetime import datetime

import pytest

from sapo_core.config import ConfigError, ControlConfig
from sapo_core.control.schedule import ScheduleError, parse_schedule

# 2026-11-23 is a Monday
MON, TUE, FRI, SAT, SUN = "2026-11-23", "2026-11-24", "2026-11-27", "2026-11-28", "2026-11-29"


def at(day: str, hhmm: str) -> datetime:
    return datetime.fromisoformat(f"{day} {hhmm}")


@pytest.mark.parametrize("text, day, hhmm, allowed", [
    ("mon-fri 18:00-08:00; sat-sun 00:00-24:00", MON, "12:00", False),
    ("mon-fri 18:00-08:00; sat-sun 00:00-24:00", MON, "18:00", True),
    ("mon-fri 18:00-08:00; sat-sun 00:00-24:00", TUE, "07:59", True),  # Monday night runs into Tuesday
    ("mon-fri 18:00-08:00; sat-sun 00:00-24:00", TUE, "08:00", False),  # the end is exclusive
    ("mon-fri 18:00-08:00; sat-sun 00:00-24:00", SAT, "07:00", True),  # Friday night, then all weekend
    ("mon-fri 18:00-08:00; sat-sun 00:00-24:00", SUN, "23:59", True),
    ("sun 22:00-02:00", MON, "01:00", True),  # Sunday night wraps into the next week's Monday
    ("sun 22:00-02:00", MON, "02:00", False),
    ("fri-mon 10:00-11:00", SAT, "10:30", True),  # a range of days that wraps
    ("fri-mon 10:00-11:00", TUE, "10:30", False),
    ("mon,wed 09:00-12:00, 14:00-17:00", MON, "15:00", True),
    ("mon,wed 09:00-12:00, 14:00-17:00", MON, "13:00", False),
    ("weekdays 09:00-17:00", FRI, "09:00", True),
    ("weekends 09:00-17:00", FRI, "09:00", False),
    ("Daily 00:00-24:00", SUN, "12:34", True),
    ("Monday 10:00-11:00", MON, "10:15", True),
    ("", MON, "03:00", True),  # empty: any time
])
def test_allows(text, day, hhmm, allowed):
    assert parse_schedule(text).allows(at(day, hhmm)) is allowed


@pytest.mark.parametrize("text, says", [
    ("mon-fry 10:00-12:00", "unknown day 'fry'"),
    ("10:00-12:00", "days then times"),
    ("10:00-12:00 mon", "days come first"),
    ("mon 25:00-26:00", "'25:00' is not a time of day"),
    ("mon 24:00-02:00", "24:00 only as an end"),
    ("mon 10:00-10:00", "is empty"),
    ("mon 10-12", "'10' is not a time"),
    ("mon 10:00-11:00-12:00", "is not a range"),
    ("mon,,tue 10:00-11:00", "empty day"),
])
def test_errors_say_what_is_wrong(text, says):
    with pytest.raises(ScheduleError, match=says) as e:
        parse_schedule(text)
    assert "mon-fri 18:00-08:00" in str(e.value) or "00:00" in str(e.value)  # every message shows the way


def test_next_change():
    s = parse_schedule("mon-fri 18:00-08:00")
    assert s.next_change(at(MON, "12:00")) == at(MON, "18:00")
    assert s.next_change(at(MON, "19:30")) == at(TUE, "08:00")
    assert s.next_change(at(FRI, "20:00")) == at(SAT, "08:00")
    assert s.next_change(at(SAT, "09:00")) == at("2026-11-30", "18:00")
    assert parse_schedule("daily 00:00-24:00").next_change(at(MON, "12:00")) is None
    assert parse_schedule("").next_change(at(MON, "12:00")) is None


def test_config_rejects_a_bad_schedule_by_its_key():
    with pytest.raises(ConfigError, match=r"control.schedule: .*unknown day"):
        ControlConfig(schedule="mon-fry 10:00-12:00")
    assert ControlConfig(schedule="mon-fri 18:00-08:00").schedule
