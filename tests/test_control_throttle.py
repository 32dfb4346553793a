"""The duty cycle: after a quantum of work it owes work × (1 - share) / share of sleep; of an
interval the caller says mostly waited (the swarm's network phases), only the work it names counts."""

from __future__ import annotations

import pytest

from sapo_core.control.throttle import MAX_SLEEP, DutyCycle


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


@pytest.mark.parametrize(
    "share, work, owed",
    [
        (0.5, 0.2, 0.2),  # half: sleep as long as it worked
        (0.25, 0.2, 0.6),  # a quarter: three times as long
        (0.75, 0.31, 0.31 / 3),  # at 75 % the burst is 0.3 s, so that the sleep is a quantum
        (0.75, 0.2, 0.0),
        (1.0, 5.0, 0.0),  # no throttle
        (0.5, 0.05, 0.0),  # under a quantum: not yet
        (0.05, 10.0, MAX_SLEEP),  # capped
    ],
)
def test_owed(share, work, owed):
    clock = Clock()
    d = DutyCycle(share, quantum=0.1, clock=clock)
    clock.t += work
    assert d.owed() == pytest.approx(owed)


def test_rest_resets_the_work_count():
    clock = Clock()
    d = DutyCycle(0.5, quantum=0.1, clock=clock)
    clock.t += 0.3
    assert d.owed() == pytest.approx(0.3)
    d.rested()
    assert d.owed() == 0.0
    clock.t += 0.1
    assert d.owed() == pytest.approx(0.1)


def test_waiting_on_the_network_is_not_work():
    clock = Clock()
    d = DutyCycle(0.5, quantum=0.1, clock=clock)
    clock.t += 10.0
    assert d.owed(work=0.0) == 0.0  # a 10 s gather that only waited
    clock.t += 0.4
    assert d.owed() == pytest.approx(0.4)  # only the computing after it


def test_the_work_inside_a_network_phase_is_billed_and_never_more_than_its_interval():
    clock = Clock()
    d = DutyCycle(0.5, quantum=0.1, clock=clock)
    clock.t += 10.0
    assert d.owed(work=2.0) == pytest.approx(2.0)  # 10 s of gather, 2 s of it verifying records
    d.rested(2.0)
    clock.t += 0.5
    assert d.owed(work=3.0) == pytest.approx(0.5)  # a CPU time beyond the interval is not believed
    d.rested(0.5)
    clock.t += 0.5
    assert d.owed(work=-1.0) == 0.0  # nor one below zero


def test_time_spent_unthrottled_is_never_owed():
    clock = Clock()
    d = DutyCycle(1.0, quantum=0.1, clock=clock)
    clock.t += 30.0  # loading the model, or running at full speed
    d.set_share(0.25)
    assert d.owed() == 0.0
    clock.t += 0.2
    assert d.owed() == pytest.approx(0.6)


def test_share_over_a_long_run_matches_the_target():
    """Alternate work steps and the sleeps owed: the busy fraction of the time is the share."""
    for share in (0.25, 0.5, 0.75):
        clock = Clock()
        d = DutyCycle(share, quantum=0.1, clock=clock)
        busy = slept = 0.0
        for _ in range(1000):
            clock.t += 0.013  # one checkpoint interval
            busy += 0.013
            owed = d.owed()
            if owed:
                clock.t += owed
                slept += owed
                d.rested()
        assert busy / (busy + slept) == pytest.approx(share, abs=0.02)


def test_share_must_be_in_range():
    with pytest.raises(ValueError):
        DutyCycle(0.0)
    with pytest.raises(ValueError):
        DutyCycle(1.5)


def test_a_sleep_that_overran_is_credited_against_the_next():
    """On a loaded machine a woken thread waits for a core: a 0.033 s sleep lasts 0.053 s. Billed
    as it lasted, the next sleep is shorter, and the share over a run holds; forgiven, as before,
    a 75 % throttle ran at ~65 %."""
    for share in (0.25, 0.5, 0.75):
        clock = Clock()
        d = DutyCycle(share, quantum=0.1, clock=clock)
        busy = slept = 0.0
        for _ in range(2000):
            clock.t += 0.013
            busy += 0.013
            owed = d.owed()
            if owed:
                lasted = owed + 0.02  # the wake-up waits 20 ms for a core
                clock.t += lasted
                slept += lasted
                d.rested(lasted)
        assert busy / (busy + slept) == pytest.approx(share, abs=0.02)


def test_credit_is_bounded_and_a_pause_forgives_the_debt():
    clock = Clock()
    d = DutyCycle(0.5, quantum=0.1, clock=clock)
    clock.t += 0.2
    assert d.owed() == pytest.approx(0.2)
    d.rested(5.0)  # a sleep that lasted far longer (a suspended laptop): credit of one quantum only
    clock.t += 0.3
    assert d.owed() == pytest.approx(0.3 - 0.1)
    d.rested()  # a pause: nothing owed afterwards
    clock.t += 0.15
    assert d.owed() == pytest.approx(0.15)
