"""The worker's round hooks in-process: a stand-in round thread calls checkpoint() the way the
sampler does; commands come from the test thread as they would from the reader thread."""

from __future__ import annotations

import queue
import threading
import time

import pytest

from sapo_core.control import protocol as P
from sapo_core.control.controller import Controller
from sapo_core.control.throttle import DutyCycle
from sapo_core.hooks import Interrupted


class Round:
    """A thread that makes a controller and loops checkpoint() until stopped (the round's thread)."""

    def __init__(self, throttle: float = 1.0) -> None:
        self.events: queue.Queue[P.Message] = queue.Queue()
        self.steps = 0
        self.outcome: BaseException | None = None
        self.ready = threading.Event()
        self.ctl: Controller | None = None
        self._throttle = throttle
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()
        self.ready.wait(5)

    def _run(self) -> None:
        self.ctl = Controller(self.events.put, throttle=self._throttle)
        self.ctl.between_rounds(1)
        self.ready.set()
        try:
            while True:
                self.ctl.checkpoint()
                self.steps += 1
                time.sleep(0.001)
        except BaseException as e:
            self.outcome = e

    def wait_state(self, state: str, timeout: float = 5.0) -> P.State:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                ev = self.events.get(timeout=0.1)
            except queue.Empty:
                continue
            if isinstance(ev, P.State) and ev.state == state:
                return ev
        raise TimeoutError(f"no {state} state within {timeout} s")


@pytest.fixture
def round_():
    r = Round()
    yield r
    r.ctl.stop("test over")
    r.thread.join(5)


def test_pause_holds_the_round_and_resume_continues_it(round_):
    round_.wait_state(P.RUNNING)
    round_.ctl.pause_now()
    assert round_.wait_state(P.PAUSED).reason == "paused by you"
    held = round_.steps
    round_.ctl.status({})  # other threads still talk
    assert round_.steps == held  # the round thread is parked in checkpoint()
    round_.ctl.resume()
    assert round_.wait_state(P.RUNNING).reason == "resumed (was: paused by you)"
    assert round_.outcome is None


def test_stop_raises_interrupted_even_while_paused(round_):
    round_.ctl.pause_now()
    round_.wait_state(P.PAUSED)
    round_.ctl.stop("stopped by you")
    round_.thread.join(5)
    assert isinstance(round_.outcome, Interrupted)
    assert round_.ctl.state == P.STOPPING


def test_a_rule_holds_until_it_clears_and_the_user_pause_takes_precedence(round_):
    round_.ctl.set_rule_reason("on battery (40 %)")
    assert round_.wait_state(P.PAUSED).reason == "on battery (40 %)"
    round_.ctl.pause_now()
    assert round_.wait_state(P.PAUSED).reason == "paused by you"
    round_.ctl.resume()  # the user's pause is gone, the rule still holds
    assert round_.wait_state(P.PAUSED).reason == "on battery (40 %)"
    round_.ctl.set_rule_reason(None)
    assert round_.wait_state(P.RUNNING).reason == "resumed (was: on battery (40 %))"


def test_snooze_ends_by_itself(round_):
    round_.ctl.snooze(0.3)
    ev = round_.wait_state(P.SNOOZED)
    assert ev.reason.startswith("snoozed until ") and ev.until is not None
    assert round_.wait_state(P.RUNNING, timeout=5).reason.startswith("resumed (was: snoozed")


def test_pause_after_round_waits_for_the_round_end():
    ctl = Controller(lambda e: None)
    ctl.between_rounds(1)
    ctl.pause_after_round()
    assert ctl.state == P.PAUSING
    ctl.checkpoint()  # mid-round: not held
    done = threading.Event()
    t = threading.Thread(target=lambda: (ctl.between_rounds(2), done.set()), daemon=True)
    t.start()
    deadline = time.monotonic() + 5
    while ctl.state != P.PAUSED and time.monotonic() < deadline:
        time.sleep(0.01)
    assert ctl.state == P.PAUSED and ctl.reason == "paused by you after round 1"
    assert not done.is_set()
    ctl.resume()
    assert done.wait(5)


@pytest.mark.parametrize("cut", ["stop", "share"])
def test_throttle_sleep_is_cut_short_by_stop_and_by_a_higher_share(cut):
    owing = threading.Event()

    class WorkClock:  # the first reading starts the count, the next one says a second of work passed
        def __init__(self) -> None:
            self.t = 0.0

        def __call__(self) -> float:
            self.t += 1.0
            if self.t >= 2:
                owing.set()
            return self.t

    made: queue.Queue[Controller] = queue.Queue()
    outcome: list[object] = []

    def run() -> None:
        ctl = Controller(lambda e: None)  # made here: this is its round thread
        ctl.duty = DutyCycle(0.05, clock=WorkClock())  # owes 19 s of sleep per second of work
        made.put(ctl)
        try:
            ctl.checkpoint()
            outcome.append("returned")
        except Interrupted as e:
            outcome.append(e)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    ctl = made.get(timeout=5)
    assert owing.wait(5)
    ctl.stop("bye") if cut == "stop" else ctl.set_throttle(1.0)
    t.join(5)
    assert not t.is_alive()
    if cut == "stop":
        assert isinstance(outcome[0], Interrupted)
    else:
        assert outcome == ["returned"]


def test_a_network_phase_bills_the_round_threads_cpu_and_not_its_waiting():
    """Verifying peers' records in the gather is work; waiting on the network is not; checking
    peers' completions against our policy (the likelihood phase) is work throughout."""
    billed: list[float | None] = []

    class Recording(DutyCycle):
        def owed(self, work: float | None = None) -> float:
            billed.append(work)
            return 0.0

    ctl = Controller(lambda e: None)  # made here: this is its round thread
    ctl.duty = Recording(0.5)
    ctl.checkpoint()
    ctl.progress("gather", 0, 1)
    t0 = time.thread_time()
    while time.thread_time() - t0 < 0.2:  # 0.2 s of CPU: verifying a record
        pass
    time.sleep(0.3)  # and waiting on a peer
    ctl.checkpoint()
    ctl.progress("likelihood", 0, 1)
    ctl.checkpoint()
    assert billed[0] is None  # before the gather: the phase's wall time is work
    assert 0.19 <= billed[1] < 0.45  # the CPU, not the 0.5 s of wall clock
    assert billed[2] is None


def test_threads_are_applied_on_the_round_thread(round_):
    applied: list[tuple[int, int | None]] = []
    round_.ctl.apply_threads = lambda n: applied.append((n, threading.get_ident()))
    round_.ctl.set_threads(1)
    deadline = time.monotonic() + 5
    while not applied and time.monotonic() < deadline:
        time.sleep(0.01)
    assert applied == [(1, round_.thread.ident)]
    assert round_.ctl.status({}).threads == 1


def test_progress_is_rate_limited_but_phase_changes_and_ends_always_go_out():
    events: list[P.Message] = []
    ctl = Controller(events.append)
    for i in range(100):
        ctl.progress("sample", i, 100)
    ctl.progress("sample", 100, 100)
    ctl.progress("update", 0, 4, step=0, peer=object())
    sent = [e for e in events if isinstance(e, P.Progress)]
    assert sent[0].done == 0 and len(sent) < 10
    assert (sent[-2].phase, sent[-2].done) == ("sample", 100)
    assert sent[-1].phase == "update" and isinstance(sent[-1].info["peer"], str)  # JSON-safe
