"""CPU time of a process tree, the machine's busy time, cores: psutil's figures as the node counts them."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import psutil
import pytest

from sapo_core.cpu import busy_seconds, physical_cores, tree_cpu_seconds, tree_usage, usable_cpus


def test_a_child_s_cpu_counts_in_its_parent_s_tree():
    before_tree, before_me = tree_cpu_seconds(), psutil.Process().cpu_times()
    child = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import time\nt = time.process_time()\nwhile time.process_time() - t < 0.6: pass\ntime.sleep(30)",
        ]
    )
    try:
        deadline = time.monotonic() + 20
        while psutil.Process(child.pid).cpu_times().user < 0.5 and time.monotonic() < deadline:
            time.sleep(0.05)
        mine = psutil.Process().cpu_times()
        own = (mine.user + mine.system) - (before_me.user + before_me.system)
        spent = tree_cpu_seconds() - before_tree
        assert spent >= own + 0.5  # the child's busy loop, on top of this process's own
        assert tree_cpu_seconds(child.pid) >= 0.5  # a pid works as well as a Process
        cpu, rss = tree_usage(psutil.Process(child.pid))
        assert cpu >= 0.5 and rss > 1_000_000  # a Python interpreter is resident
    finally:
        child.kill()
        child.wait()


def test_busy_seconds_grow_with_work_and_cores_are_counted():
    before = busy_seconds()
    t = time.process_time()
    while time.process_time() - t < 0.3:
        pass
    assert busy_seconds() - before >= 0.2
    assert 1 <= physical_cores() <= (psutil.cpu_count() or 1)


@pytest.mark.skipif(not hasattr(os, "sched_getaffinity"), reason="no affinity masks on this OS")
def test_cores_are_capped_at_the_cpus_this_process_may_use(monkeypatch):
    # A container or `taskset -c 0` leaves one CPU to a process on a machine psutil sees whole:
    # threads beyond it only take turns on that one CPU.
    monkeypatch.setattr(psutil, "cpu_count", lambda logical=True: 16 if logical else 8)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0})
    assert usable_cpus() == 1 and physical_cores() == 1
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(16)))
    assert usable_cpus() == 16 and physical_cores() == 8
