"""Weekly schedule: parsing (with errors that say how to write it), which times it allows, and the
app's weekly grid: text -> grid -> text -> grid round trips, hand-checked shortest wordings, and
random grids that come back unchanged through the text."""

from __future__ import annotations

import random
from datetime import datetime, timedelta

import pytest

from sapo_core.config import ConfigError, ControlConfig
from sapo_core.control.schedule import DAY_NAMES, ScheduleError, fits_grid, grid_text, parse_schedule, schedule_grid

# 2026-11-23 is a Monday
MON, TUE, FRI, SAT, SUN = "2026-11-23", "2026-11-24", "2026-11-27", "2026-11-28", "2026-11-29"


def at(day: str, hhmm: str) -> datetime:
    return datetime.fromisoformat(f"{day} {hhmm}")


@pytest.mark.parametrize(
    "text, day, hhmm, allowed",
    [
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
    ],
)
def test_allows(text, day, hhmm, allowed):
    assert parse_schedule(text).allows(at(day, hhmm)) is allowed


@pytest.mark.parametrize(
    "text, says",
    [
        ("mon-fry 10:00-12:00", "unknown day 'fry'"),
        ("10:00-12:00", "days then times"),
        ("10:00-12:00 mon", "days come first"),
        ("mon 25:00-26:00", "'25:00' is not a time of day"),
        ("mon 24:00-02:00", "24:00 only as an end"),
        ("mon 10:00-10:00", "is empty"),
        ("mon 10-12", "'10' is not a time"),
        ("mon 10:00-11:00-12:00", "is not a range"),
        ("mon,,tue 10:00-11:00", "empty day"),
    ],
)
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


# --- the weekly grid ------------------------------------------------------------------------------


def grid_of(text: str, slots: int = 24):
    return schedule_grid(parse_schedule(text), slots)


def cells(grid) -> set[tuple[int, int]]:
    return {(d, k) for d, row in enumerate(grid) for k, on in enumerate(row) if on}


def test_grid_cells_are_the_slots_the_schedule_allows():
    g = grid_of("mon-fri 18:00-08:00; sat-sun 00:00-24:00")
    assert len(g) == 7 and all(len(row) == 24 for row in g)
    evenings_and_mornings = {(d, h) for d in range(1, 5) for h in (*range(8), *range(18, 24))}
    assert cells(g) == (
        {(0, h) for h in range(18, 24)}
        | evenings_and_mornings
        | {(5, h) for h in range(24)}
        | {(6, h) for h in range(24)}
    )
    assert grid_of("sun 22:00-02:00") == grid_of("sun 22:00-24:00; mon 00:00-02:00")  # wraps into Monday
    assert cells(grid_of("")) == {(d, h) for d in range(7) for h in range(24)}  # empty: any time
    assert cells(grid_of("wed 09:30-10:00", 48)) == {(2, 19)}
    # every slot agrees with Schedule.allows at its first minute
    s = parse_schedule("mon,thu 06:00-09:00, 21:00-01:00; sat 12:00-24:00")
    monday = datetime(2026, 11, 23)
    g = schedule_grid(s, 48)
    for d in range(7):
        for k in range(48):
            assert g[d][k] == s.allows(monday + timedelta(days=d, minutes=30 * k)), (d, k)


def test_a_time_off_the_grid_shows_the_slots_it_touches_and_says_so():
    s = parse_schedule("tue 09:15-10:20")
    assert not fits_grid(s, 24) and fits_grid(parse_schedule("tue 09:00-11:00"), 24)
    assert cells(schedule_grid(s, 24)) == {(1, 9), (1, 10)}
    assert fits_grid(parse_schedule("tue 09:30-10:00"), 48) and not fits_grid(parse_schedule("tue 09:30-10:00"), 24)


@pytest.mark.parametrize(
    "text, shortest",
    [
        ("mon-fri 18:00-08:00; sat-sun 00:00-24:00", "mon-fri 18:00-08:00; sat-sun 00:00-24:00"),
        ("weekdays 18:00-24:00; tue-sat 00:00-08:00", "mon-fri 18:00-08:00"),  # evenings joined to the next morning
        ("Daily 22:00-07:00", "daily 22:00-07:00"),
        ("sun 22:00-24:00; mon 00:00-02:00", "sun 22:00-02:00"),  # overnight across the week's end
        ("sat,sun,mon 10:00-11:00", "sat-mon 10:00-11:00"),  # a run of days that wraps
        ("mon,wed,fri 09:00-12:00, 14:00-17:00", "mon,wed,fri 09:00-12:00, 14:00-17:00"),
        ("weekdays 09:00-17:00", "mon-fri 09:00-17:00"),
        ("monday 00:00-24:00", "mon 00:00-24:00"),
        ("mon 18:00-24:00; tue 00:00-18:00", "mon 18:00-24:00; tue 00:00-18:00"),  # 24 h cannot be one range
        ("mon-fri 00:00-08:00, 18:00-24:00", "mon-fri 00:00-08:00, 18:00-24:00"),  # shorter than overnight ranges
        ("daily 00:00-24:00", ""),  # all week = any time
        ("mon-sat 00:00-24:00", "mon-sat 00:00-24:00"),
        ("thu 23:00-24:00", "thu 23:00-24:00"),
    ],
)
def test_grid_text_is_the_shortest_readable_wording(text, shortest):
    g = grid_of(text)
    assert grid_text(g) == shortest
    assert grid_of(shortest) == g


def test_half_hour_grids_write_half_hours():
    assert grid_text(grid_of("mon-fri 08:30-17:30", 48)) == "mon-fri 08:30-17:30"
    assert grid_text(grid_of("sat 23:30-00:30", 48)) == "sat 23:30-00:30"


def test_a_grid_that_allows_nothing_is_refused_with_a_way_out():
    with pytest.raises(ScheduleError, match="never run.*empty to run at any time"):
        grid_text(tuple((False,) * 24 for _ in range(7)))
    with pytest.raises(ValueError, match="7 rows"):
        grid_text(((True,) * 24,) * 6)
    with pytest.raises(ValueError, match="divide"):
        schedule_grid(parse_schedule(""), 25)


def _random_text(rng: random.Random) -> str:
    """A schedule as a person might type it: day names, groups, wrapping day ranges, overnight, 24:00."""
    entries = []
    for _ in range(rng.randint(1, 4)):
        kind = rng.random()
        if kind < 0.15:
            days = rng.choice(["daily", "weekdays", "weekends"])
        elif kind < 0.5:
            a, b = rng.randrange(7), rng.randrange(7)
            days = f"{DAY_NAMES[a]}-{DAY_NAMES[b]}"
        else:
            days = ",".join(rng.sample(DAY_NAMES, rng.randint(1, 3)))
        ranges = []
        for _ in range(rng.randint(1, 2)):
            start = rng.randrange(24)
            end = rng.choice([24, rng.randrange(25)])
            if end == start:
                end = (start + 1) % 24 or 24
            ranges.append(f"{start:02d}:00-{end:02d}:00")
        entries.append(f"{days} {', '.join(ranges)}")
    return "; ".join(entries)


def test_typed_texts_round_trip_through_the_grid():
    rng = random.Random(13)
    for _ in range(400):
        text = _random_text(rng)
        g = grid_of(text)
        if not cells(g):
            continue
        again = grid_text(g)
        assert grid_of(again) == g, (text, again)
        assert grid_text(grid_of(again)) == again, (text, again)  # the wording is a fixed point


@pytest.mark.parametrize("slots", [24, 48])
def test_random_grids_round_trip_through_the_text(slots):
    rng = random.Random(slots)
    for i in range(300):
        if i % 3 == 0:  # scattered slots, at any density
            p = rng.random()
            g = tuple(tuple(rng.random() < p for _ in range(slots)) for _ in range(7))
        else:  # blocks, as painted by dragging: some span midnight, some the week's end
            week = [i % 3 == 2] * (7 * slots)
            for _ in range(rng.randint(1, 4)):
                start, length = rng.randrange(7 * slots), rng.randint(1, 3 * slots)
                for k in range(start, start + length):
                    week[k % (7 * slots)] = not week[k % (7 * slots)] if i % 6 == 5 else True
            g = tuple(tuple(week[d * slots : (d + 1) * slots]) for d in range(7))
        if not cells(g):
            continue
        text = grid_text(g)
        assert schedule_grid(parse_schedule(text), slots) == g, text
        assert fits_grid(parse_schedule(text), slots)
