"""Holding native compute: the real llama.cpp engine child is suspended and resumed, the p2p
daemon's kind of child is left alone, and the controller reports a pause while its round thread
is blocked on the suspended child (no checkpoint reached)."""

from __future__ import annotations

import queue
import subprocess
import sys
import threading
import time

import psutil
import pytest

from sapo_core.control import protocol as P
from sapo_core.control.controller import Controller
from sapo_core.control.nativehold import hold_sampler, sampler_processes, thread_cpu_seconds

posix_only = pytest.mark.skipif(sys.platform == "win32", reason="process status names differ on Windows")


def _status_becomes(pid: int, stopped: bool) -> bool:
    """Signals are delivered asynchronously: look until the status says so (or 10 s pass)."""
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        if (psutil.Process(pid).status() == psutil.STATUS_STOPPED) == stopped:
            return True
        time.sleep(0.05)
    return False


@posix_only
def test_only_sampler_children_are_suspended_and_resumed():
    from sapo_core.sampler.guard import WorkerProcess

    engine = WorkerProcess("sapo_core.sampler.llamacpp_engine", "llama.cpp")  # the real engine, idle
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])  # stands for p2pd
    try:
        assert [p.pid for p in sampler_processes()] == [engine.pid]
        hold_sampler(True)
        assert _status_becomes(engine.pid, stopped=True)
        assert psutil.Process(other.pid).status() != psutil.STATUS_STOPPED
        hold_sampler(False)
        assert _status_becomes(engine.pid, stopped=False)
        assert engine.call("status")["ok"]  # it serves again
    finally:
        other.kill()
        engine.close()


def test_thread_cpu_seconds_follows_one_thread():
    import threading as th

    me = th.get_native_id()
    before = thread_cpu_seconds(me)
    if before is None:
        pytest.skip("this OS does not give per-thread CPU times")
    t0 = time.thread_time()
    while time.thread_time() - t0 < 0.3:
        pass
    assert thread_cpu_seconds(me) - before >= 0.2
    assert thread_cpu_seconds(-1) is None


def test_a_round_blocked_in_a_native_call_is_reported_paused_and_resumed():
    """The round thread waits on an event (a call into a suspended sampler); its CPU time does not
    move. The controller suspends the 'sampler' and says paused without any checkpoint."""
    events: queue.Queue[P.Message] = queue.Queue()
    held: list[bool] = []
    native_call = threading.Event()
    made: queue.Queue[Controller] = queue.Queue()

    def round_thread() -> None:
        ctl = Controller(events.put)
        ctl.hold_native = held.append
        ctl.thread_cpu = lambda native_id: 1.0  # no CPU used: blocked
        ctl.between_rounds(1)
        made.put(ctl)
        native_call.wait(30)  # inside the sampler's call, which the hold has suspended
        ctl.checkpoint()

    t = threading.Thread(target=round_thread, daemon=True)
    t.start()
    ctl = made.get(timeout=5)

    def wait_state(state: str) -> P.State:
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            ev = events.get(timeout=deadline - time.monotonic())
            if isinstance(ev, P.State) and ev.state == state:
                return ev
        raise TimeoutError(state)

    ctl.pause_now()
    assert wait_state(P.PAUSING).reason == "paused by you"
    assert wait_state(P.PAUSED).reason == "paused by you"
    assert held == [True]
    ctl.resume()
    assert wait_state(P.RUNNING).reason == "resumed (was: paused by you)"
    assert held == [True, False]
    native_call.set()  # the call returns; the checkpoint finds no hold
    t.join(5)
    assert not t.is_alive()
