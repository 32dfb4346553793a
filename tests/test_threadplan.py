"""The thread choice, from tables of fake loads: the user's limit, others' use, a collapse cap."""

import pytest

from sapo_core.threadplan import choose_threads, collapsed, cpu_limit, others_busy_cores


@pytest.mark.parametrize(
    "cores, percent, leave, expected",
    [
        (2, 100, 1, 1),  # the desktop default on 2 cores: the user keeps one
        (2, 100, 0, 2),
        (8, 100, 1, 7),
        (8, 50, 0, 4),  # BOINC's "use at most 50 % of the CPUs"
        (8, 50, 1, 4),  # the stricter of the two
        (8, 90, 3, 5),
        (1, 100, 1, 1),  # never below one thread
        (4, 10, 0, 1),
        (6, 60, 0, 3),  # 3.6 cores: whole threads only, rounded down
    ],
)
def test_cpu_limit(cores, percent, leave, expected):
    n, why = cpu_limit(cores, percent, leave)
    assert n == expected
    assert f"at most {expected} thread" in why


@pytest.mark.parametrize(
    "system_percent, logical, own, expected",
    [
        (100.0, 2, 2.0, 0.0),  # all of it is ours
        (100.0, 2, 1.0, 1.0),  # one busy program beside our one thread
        (50.0, 2, 0.0, 1.0),
        (75.0, 4, 1.0, 2.0),
        (10.0, 2, 0.5, 0.0),  # readings taken a moment apart: never below 0
        (130.0, 2, 0.0, 2.0),  # clamped to the machine
    ],
)
def test_others_busy_cores(system_percent, logical, own, expected):
    assert others_busy_cores(system_percent, logical, own) == pytest.approx(expected)


@pytest.mark.parametrize(
    "cores, others, limit, cap, expected, says",
    [
        (2, 0.0, 2, None, 2, "free"),
        (2, 0.1, 2, None, 2, "free"),
        (2, 1.0, 2, None, 1, "sharing the CPU with other programs: 1 thread (they use 1.0 of 2 cores)"),
        (2, 2.0, 2, None, 1, "sharing the CPU with other programs: 1 thread"),
        (2, 0.7, 2, None, 1, "sharing"),  # 1.3 free: the second core is mostly someone else's
        (2, 0.3, 2, None, 2, "free"),  # 1.7 free: close enough to two
        (8, 3.0, 7, None, 5, "5 threads"),
        (8, 0.0, 4, None, 4, "your limit of 4"),
        (2, 0.0, 1, None, 1, "your limit of 1"),  # the default on 2 cores, quiet
        (2, 0.0, 2, 1, 1, "collapse"),
        (8, 5.0, 8, 6, 3, "they use 5.0"),  # the load is the tighter bound
    ],
)
def test_choose_threads(cores, others, limit, cap, expected, says):
    c = choose_threads(cores, others, limit, cap)
    assert c.threads == expected
    assert says in c.reason


@pytest.mark.parametrize(
    "tok_s, quiet, expected",
    [
        (5.9, 95.0, True),  # docs/calibration.md, 'Threads and throttle': 5.9 tok/s, quiet ~90
        (60.0, 95.0, False),  # a fair share (half) is not a collapse
        (34.0, 100.0, True),
        (36.0, 100.0, False),
        (5.0, 0.0, False),  # no quiet figure yet: cannot judge
        (0.0, 95.0, False),  # no training this round
    ],
)
def test_collapsed(tok_s, quiet, expected):
    assert collapsed(tok_s, quiet) is expected
