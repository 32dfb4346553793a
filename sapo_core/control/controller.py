"""Inside the node process: the round hooks that pause, throttle and stop the round.

`Controller` is the `RoundHooks` the worker hands to `Node`. Commands arrive on the worker's
reader thread (`pause_now`, `resume`, `stop`, ...) and rules on its rules thread
(`set_rule_reason`); the round's thread meets them in `checkpoint()`, which sampling and
training call every decoded token batch, every micro-batch and (layerhooks.py) every
decoder layer. There it

- raises `Interrupted` once a stop is asked (the round is abandoned; it reruns on the next
  start, from the checkpoint the previous round wrote);
- blocks while a hold is on (paused by the user, snoozed, or a rule), emitting `paused` or
  `snoozed` with the reason; the process keeps its state and the swarm thread keeps running;
- sleeps what the duty cycle owes (throttle.py), in a wait that any command cuts short
  (time in the swarm's share and gather phases, spent waiting on peers, is not work);
- applies a new thread count (torch and llama.cpp are only safe to touch from this thread).

A hold also suspends the sampler's native process at once (`hold_native`), so a pause needs
no checkpoint to take effect while llama.cpp is in a long call.

State events are emitted on changes only. Holds in priority order: the user's pause, a
snooze, a rule. Standard library only besides the protocol: the heavy parts live in Node.
Log lines are not a hook: modules log with `logging`, and the worker's handler (logs.py) turns
the records into `Log` events.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sapo_core.control import protocol as P
from sapo_core.control.throttle import DutyCycle
from sapo_core.control.vocabulary import GATHER, SHARE
from sapo_core.hooks import Interrupted

log = logging.getLogger(__name__)

PROGRESS_INTERVAL = 0.25  # seconds between two progress events of one phase
NETWORK_PHASES = (SHARE, GATHER)  # mostly waiting on peers: only their CPU time is work (throttle.py)
HOLD_POLL = 1.0  # a holding thread wakes this often even without a command (snooze ends, threads)
NATIVE_POLL = 0.1  # seconds between two looks at the round thread's CPU time while the sampler is suspended
NATIVE_STILL_POLLS = 3  # that many looks without CPU use: it waits on the suspended sampler


@dataclass(frozen=True)
class Hold:
    state: str  # PAUSED or SNOOZED
    reason: str
    until: float | None = None  # wall clock, snoozes only


class Controller:
    def __init__(self, emit: Callable[[P.Message], None], throttle: float = 1.0, threads: int = 0) -> None:
        self._emit = emit
        self._cond = threading.Condition()
        self._round_thread = threading.get_ident()
        self._round_native_id = threading.get_native_id()
        self._round_cpu = time.thread_time()  # the round thread's CPU time at its last checkpoint
        self.duty = DutyCycle(throttle)
        self.threads = threads
        self._pending_threads: int | None = None
        self.apply_threads: Callable[[int], None] | None = None  # set by the worker once the node is up
        self.hold_native: Callable[[bool], None] | None = None  # suspend (True) / resume the sampler's process
        self.thread_cpu: Callable[[int], float | None] | None = None  # CPU seconds of a thread (nativehold.py)
        self._native_held = False
        self._parked = False  # the round thread waits in _hold_here
        self._watching = False  # a _watch_native_hold thread runs
        # requests
        self._paused_by_user = False
        self._user_reason = ""
        self._pause_after_round = False
        self._snooze_until: float | None = None  # monotonic
        self._snooze_wall: float | None = None
        self.rule_reason: str | None = None
        self.stop_reason: str | None = None
        # what the node is doing
        self.state, self.reason, self.round, self.phase = P.STARTING, "", 0, ""
        self._last_progress = (0.0, "")

    # --- requests: called from the command and rules threads ----------------------------------
    def pause_now(self, reason: str = "paused by you") -> None:
        with self._cond:
            self._paused_by_user, self._user_reason = True, reason
            self._changed()

    def pause_after_round(self) -> None:
        with self._cond:
            self._pause_after_round = True
            if self.state == P.RUNNING:
                self._publish(P.PAUSING, "pausing after this round")

    def resume(self) -> None:
        with self._cond:
            self._paused_by_user = self._pause_after_round = False
            self._snooze_until = self._snooze_wall = None
            self._changed()

    def snooze(self, seconds: float) -> None:
        with self._cond:
            self._paused_by_user = False
            self._snooze_until = time.monotonic() + max(0.0, seconds)
            self._snooze_wall = time.time() + max(0.0, seconds)
            self._changed()

    def set_rule_reason(self, reason: str | None) -> None:
        with self._cond:
            if reason != self.rule_reason:
                self.rule_reason = reason
                self._changed()

    def set_throttle(self, share: float) -> None:
        with self._cond:
            self.duty.set_share(share)
            self._cond.notify_all()  # a sleep owed at the old share is cut short

    def set_threads(self, threads: int) -> None:
        with self._cond:
            self._pending_threads = threads
            self._cond.notify_all()

    def stop(self, reason: str) -> None:
        with self._cond:
            if self.stop_reason is None:
                self.stop_reason = reason
                self._publish(P.STOPPING, reason)
            self._sync_native()  # a suspended sampler could not finish its call, nor close
            self._cond.notify_all()

    def tick(self) -> None:
        """Re-evaluate time-based holds (a snooze's end) while the round thread cannot: it may be
        blocked on a suspended sampler. The worker's heartbeat calls this every second."""
        with self._cond:
            self._changed()

    def status(self, rules: dict[str, Any]) -> P.Status:
        with self._cond:
            return P.Status(
                state=self.state,
                reason=self.reason,
                round=self.round,
                phase=self.phase,
                throttle=self.duty.share,
                threads=self.threads,
                rules=rules,
                paused_by_user=self._paused_by_user,
                snoozed_until=self._snooze_wall,
                rule_reason=self.rule_reason or "",
            )

    # --- RoundHooks: called from the round -----------------------------------------------------
    def checkpoint(self) -> None:
        if threading.get_ident() != self._round_thread:
            with self._cond:  # another thread of the node (a swarm callback): hold and stop only
                self._hold_here()
            return
        cpu = time.thread_time()  # the round thread's: what a network phase spent working
        busy, self._round_cpu = cpu - self._round_cpu, cpu
        with self._cond:
            self._hold_here()
            owed = self.duty.owed(busy if self.phase in NETWORK_PHASES else None)
        if owed > 0:
            began = time.monotonic()
            deadline = began + owed
            with self._cond:
                share = self.duty.share
                while (
                    self.stop_reason is None
                    and self._current_hold() is None
                    and self.duty.share <= share
                    and (left := deadline - time.monotonic()) > 0
                ):
                    self._cond.wait(left)
                # billed as long as it lasted, till this thread runs again (throttle.py)
                self.duty.rested(time.monotonic() - began if self.duty.share == share else None)
                self._hold_here()

    def progress(self, phase: str, done: int, total: int, **info: Any) -> None:
        now = time.monotonic()
        last_t, last_phase = self._last_progress
        self.phase = phase
        if phase == last_phase and done < total and now - last_t < PROGRESS_INTERVAL:
            return
        self._last_progress = (now, phase)
        clean = {k: v if isinstance(v, (int, float, str, bool)) or v is None else str(v) for k, v in info.items()}
        self._emit(P.Progress(round=self.round, phase=phase, done=int(done), total=int(total), info=clean))

    # --- the round loop's own calls -------------------------------------------------------------
    def between_rounds(self, next_round: int) -> bool:
        """Before each round: hold while asked, then True to run it, False to stop."""
        with self._cond:
            if self._pause_after_round:
                self._pause_after_round = False
                self._paused_by_user, self._user_reason = True, f"paused by you after round {next_round - 1}"
            self.round = next_round
            try:
                self._hold_here()
            except Interrupted:
                return False
            if self.stop_reason is not None:
                return False
            if self._pause_after_round:
                self._publish(P.PAUSING, "pausing after this round")
            elif self.state != P.RUNNING:
                self._publish(P.RUNNING, "")
            return True

    def set_state(self, state: str, reason: str = "") -> None:
        with self._cond:
            self._publish(state, reason)

    # --- internals (called with the lock held) ----------------------------------------------------
    def _current_hold(self) -> Hold | None:
        if self._paused_by_user:
            return Hold(P.PAUSED, self._user_reason)
        if self._snooze_until is not None:
            if time.monotonic() < self._snooze_until:
                return Hold(
                    P.SNOOZED,
                    f"snoozed until {datetime.fromtimestamp(self._snooze_wall or 0):%H:%M}",
                    self._snooze_wall,
                )
            self._snooze_until = self._snooze_wall = None
        if self.rule_reason:
            return Hold(P.PAUSED, self.rule_reason)
        return None

    def _hold_here(self) -> None:
        """Block while a hold is on; raise Interrupted on stop. Lock held."""
        self._apply_pending_threads()
        if self.stop_reason is not None:
            raise Interrupted(self.stop_reason)
        hold = self._current_hold()
        if hold is None:
            return
        was = hold
        self._parked = True
        try:
            while hold is not None and self.stop_reason is None:
                self._publish(hold.state, hold.reason, hold.until)
                self._cond.wait(HOLD_POLL)
                self._apply_pending_threads()
                was, hold = hold, self._current_hold()
        finally:
            self._parked = False
        self._sync_native()
        if self.stop_reason is not None:
            raise Interrupted(self.stop_reason)
        if self.state in P.HOLDING_STATES or self.state == P.PAUSING:
            self._publish(P.RUNNING, f"resumed (was: {was.reason})")
        self.duty.rested()  # time spent holding is not work

    def _changed(self) -> None:
        """A request changed: suspend or resume the sampler and say what the node now does."""
        self._sync_native()
        hold = self._current_hold()
        if hold is not None and self.state == P.RUNNING:
            self._publish(P.PAUSING, hold.reason)
        elif hold is None and self.state == P.PAUSING and not self._pause_after_round:
            self._publish(P.RUNNING, "")
        elif not self._parked and self.state in P.HOLDING_STATES:
            # held inside a native call (see _watch_native_hold): the round thread cannot say it
            if hold is None:
                self._publish(P.RUNNING, f"resumed (was: {self.reason})")
                self.duty.rested()
            else:
                self._publish(hold.state, hold.reason, hold.until)
        if (
            hold is not None
            and self._native_held
            and not self._parked
            and self.state == P.PAUSING
            and not self._watching
        ):
            self._watching = True
            threading.Thread(target=self._watch_native_hold, name="sapo-native-hold", daemon=True).start()
        self._cond.notify_all()

    def _watch_native_hold(self) -> None:
        """With the sampler suspended, the round thread may be blocked on it, not on its way to a
        checkpoint: once it has used no CPU for a moment, the node is held, and says so."""
        try:
            self._watch_round_thread()
        finally:
            with self._cond:
                self._watching = False

    def _watch_round_thread(self) -> None:
        if self.thread_cpu is None:
            return
        last, still, deadline = None, 0, time.monotonic() + 60
        while time.monotonic() < deadline:
            with self._cond:
                hold = self._current_hold()
                if hold is None or not self._native_held or self._parked or self.state != P.PAUSING:
                    return
                if still >= NATIVE_STILL_POLLS:
                    self._publish(hold.state, hold.reason, hold.until)
                    return
                self._cond.wait(NATIVE_POLL)
            cpu = self.thread_cpu(self._round_native_id)
            if cpu is None:
                return
            still = still + 1 if cpu == last else 0
            last = cpu

    def _sync_native(self) -> None:
        """Suspend the sampler's native process while a hold is on, resume it when the hold ends.

        The round thread may be inside one long native call (llama.cpp decoding a prompt takes
        seconds on a busy machine) and reach no checkpoint until it returns; suspending the child
        holds it at once. The DHT's daemon is another child and is never suspended."""
        want = self.stop_reason is None and self.state != P.STARTING and self._current_hold() is not None
        if want == self._native_held or self.hold_native is None:
            return
        try:
            self.hold_native(want)
        except Exception as e:  # the pause still happens at the next checkpoint
            log.warning(f"could not {'suspend' if want else 'resume'} the sampler process: {e}")
        self._native_held = want

    def _apply_pending_threads(self) -> None:
        if self._pending_threads is None or threading.get_ident() != self._round_thread or self._native_held:
            return  # (a suspended sampler cannot take the call: applied once the hold ends)
        n, self._pending_threads = self._pending_threads, None
        if self.apply_threads is not None:
            self.apply_threads(n)
        self.threads = n
        log.info(f"threads set to {n or 'all physical cores'}")

    def _publish(self, state: str, reason: str, until: float | None = None) -> None:
        if (state, reason) == (self.state, self.reason):
            return
        if self.state in (P.STOPPING, P.STOPPED, P.CRASHED) and state not in (P.STOPPED, P.CRASHED):
            return  # nothing un-stops a stopping node
        self.state, self.reason = state, reason
        self._emit(P.State(state=state, reason=reason, round=self.round, until=until))


__all__ = ["Controller", "Hold", "PROGRESS_INTERVAL"]
