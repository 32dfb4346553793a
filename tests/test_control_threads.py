"""The thread governor: steps down when others keep cores busy, back up once they stop (after
holding readings), steps down on a collapse in tokens/s, and leaves a fixed count alone."""

import subprocess
import sys
import time

import psutil
import pytest

from sapo_core.control.threads import CAP_ROUNDS, CpuMeter, ThreadGovernor
from sapo_core.cpu import tree_cpu_seconds


def gov(**kw) -> ThreadGovernor:
    return ThreadGovernor.for_config(
        cores=2, max_cpus_percent=100, leave_cores=0, fixed=kw.pop("fixed", 0), start=kw.pop("start", 2)
    )


def test_steps_down_after_two_busy_readings_and_up_after_five_quiet_ones():
    g = gov()
    assert g.observe(0.0) is None and g.current == 2
    assert g.observe(2.0) is None  # one busy reading is not enough
    change = g.observe(2.0)
    assert change is not None and change.threads == 1 and g.current == 1
    assert "sharing the CPU with other programs: 1 thread" in change.message
    ups = [g.observe(0.0) for _ in range(8)]
    assert [c.threads for c in ups if c is not None] == [2]
    assert ups.index(next(c for c in ups if c is not None)) >= 4  # not before five readings agree
    assert g.current == 2


def test_a_blip_does_not_change_the_count():
    g = gov()
    for reading in (0.0, 2.0, 0.0, 0.0, 2.0, 0.0):
        assert g.observe(reading) is None
    assert g.current == 2


def test_a_collapse_steps_down_and_holds_for_some_rounds():
    g = gov()
    g.observe(0.0)
    assert g.after_round(1, 95.0, 1.0) is None  # the quiet figure of 2 threads
    assert g.after_round(2, 80.0, 1.0) is None
    change = g.after_round(3, 5.9, 1.0)
    assert change is not None and change.threads == 1
    assert "sharing the CPU with other programs: 1 thread" in change.message and "5.9" not in change.message
    assert "6 %" in change.message
    for _ in range(10):  # the machine looks free, but the cap holds
        assert g.observe(0.0) is None
    g.after_round(3 + CAP_ROUNDS, 50.0, 1.0)
    assert g.cap is None
    assert any(g.observe(0.0) is not None for _ in range(6)) and g.current == 2


def test_a_throttled_round_is_judged_per_share_not_as_a_collapse():
    g = gov()
    g.after_round(1, 95.0, 1.0)
    assert g.after_round(2, 30.0, 0.25) is None  # 120 tok/s per share: fine


def test_a_fixed_count_is_never_adapted():
    g = gov(fixed=2)
    for _ in range(5):
        assert g.observe(2.0) is None
    g.after_round(1, 95.0, 1.0)
    assert g.after_round(2, 1.0, 1.0) is None and g.current == 2


def test_cpu_meter_counts_its_tree_as_the_node_and_the_rest_as_others():
    """Two meters read over the same interval: one on the spinner's own tree (its use is the
    node's), one on a sleeping process (the spinner is someone else's program). The difference
    of their readings is what the spinner used, however busy the rest of the machine is."""
    spin = "import time\nt=time.time()\nwhile time.time()-t<4: pass"
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(8)"])
    spinner = subprocess.Popen([sys.executable, "-c", spin])
    try:
        time.sleep(0.5)
        tree = psutil.Process(spinner.pid)
        own, other = CpuMeter(tree), CpuMeter(psutil.Process(sleeper.pid))
        c0, t0 = tree_cpu_seconds(tree), time.monotonic()
        time.sleep(2.0)
        spun = (tree_cpu_seconds(tree) - c0) / (time.monotonic() - t0)
        seen_as_others, seen_as_ours = other.read(), own.read()
        assert spun > 0.05  # it ran at all
        assert seen_as_others - seen_as_ours == pytest.approx(spun, abs=0.3)
    finally:
        spinner.wait()
        sleeper.kill()
        sleeper.wait()
