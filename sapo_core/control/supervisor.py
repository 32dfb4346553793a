"""`NodeSupervisor`: keep a node running for the volunteer; restart it after a crash.

A node that crashes (an exception, a native fault, killed, silent past its heartbeat
timeout) is restarted after a pause that doubles with each crash in a row
(`backoff_first` up to `backoff_max`); a run that lasted `stable_after` seconds resets the
count, and `max_restarts` crashes in a row make it give up. A node that cannot run as
configured (Error kind `config`, exit code 2) is not restarted: the user must change
something, and the reason says what. Every crash's report (exit code or signal, last
error, last lines of stderr) is kept in `crashes`, the newest as `last_crash`.

The supervisor remembers the volunteer's controls (throttle, threads, rules, a pause, a
snooze) and gives them to each new process, so a restart never silently unpauses a node.
It has the NodeClient's command methods and event inbox, and passes every event on; its own
are `Log` lines about restarts and a `State(crashed, ...)` when it gives up.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Callable

from sapo_core.config import ControlConfig, NodeConfig
from sapo_core.control import protocol as P
from sapo_core.control.client import CrashReport, EventInbox, NodeClient


class NodeSupervisor:
    def __init__(
        self,
        on_event: Callable[[P.Message], None] | None = None,
        *,
        client_factory: Callable[..., NodeClient] = NodeClient,
        backoff_first: float = 2.0,
        backoff_max: float = 300.0,
        stable_after: float = 600.0,
        max_restarts: int = 8,
        heartbeat_timeout: float | None = 60.0,
        env: dict[str, str] | None = None,
    ) -> None:
        self.on_event = on_event
        self.client_factory = client_factory
        self.backoff_first, self.backoff_max = backoff_first, backoff_max
        self.stable_after, self.max_restarts = stable_after, max_restarts
        self.heartbeat_timeout, self.env = heartbeat_timeout, env
        self.inbox = EventInbox()
        self.client: NodeClient | None = None
        self.crashes: list[CrashReport] = []
        self.restarts = 0  # processes started after a crash, in total
        self.consecutive = 0  # crashes since the last stable run
        self.restart_at: float | None = None  # wall-clock time of a pending restart
        self.gave_up = False
        self._lock = threading.RLock()
        self._timer: threading.Timer | None = None
        self._stopping = False
        self._cfg: NodeConfig | None = None
        self._rounds = 0
        self._rounds_done = 0
        self._paused = False
        self._snooze_until: float | None = None
        self._started_at = 0.0
        self._handled: set[int] = set()  # clients whose exit was dealt with

    @property
    def last_crash(self) -> CrashReport | None:
        return self.crashes[-1] if self.crashes else None

    # --- lifecycle -------------------------------------------------------------------------------
    def start(self, cfg: NodeConfig, rounds: int = 0, paused: bool = False) -> None:
        with self._lock:
            self._cfg, self._rounds, self._paused, self._stopping = cfg, rounds, paused, False
            self._spawn()

    def stop(self, timeout: float = 60.0, terminate_timeout: float = 5.0) -> int | None:
        with self._lock:
            self._stopping = True
            if self._timer is not None:
                self._timer.cancel()
                self._timer, self.restart_at = None, None
            client = self.client
        return client.stop(timeout, terminate_timeout) if client is not None and client.alive else None

    def _spawn(self) -> None:
        assert self._cfg is not None
        client = self.client_factory(env=self.env, heartbeat_timeout=self.heartbeat_timeout)
        client.on_event = lambda ev: self._on_event(client, ev)
        self.client, self._started_at, self.restart_at = client, time.monotonic(), None
        rounds = max(1, self._rounds - self._rounds_done) if self._rounds else 0
        client.start(self._cfg, rounds=rounds, paused=self._paused)
        if self._snooze_until is not None and self._snooze_until > time.time():
            client.snooze(self._snooze_until - time.time())

    def _on_event(self, client: NodeClient, ev: P.Message) -> None:
        if isinstance(ev, P.RoundDone):
            self._rounds_done += 1
        self._pass_on(ev)
        if isinstance(ev, P.Exited):
            self._after_exit(client, ev)

    def _pass_on(self, ev: P.Message) -> None:
        self.inbox.put(ev)
        if self.on_event is not None:
            self.on_event(ev)

    def _after_exit(self, client: NodeClient | None, ev: P.Exited) -> None:
        with self._lock:
            if ev.clean or self._stopping or client is not self.client or id(client) in self._handled:
                return
            self._handled.add(id(client))
            if client is not None and client.crash is not None:
                self.crashes.append(client.crash)
            err = client.last_error if client is not None else None
            if ev.returncode == P.EXIT_CONFIG or (err is not None and err.kind == P.CONFIG):
                self._give_up(f"{ev.reason}; not restarting: this needs a change of settings")
                return
            if time.monotonic() - self._started_at >= self.stable_after:
                self.consecutive = 0
            self.consecutive += 1
            if self.consecutive > self.max_restarts:
                plural = "s" * (self.max_restarts != 1)
                self._give_up(f"{ev.reason}; gave up after {self.max_restarts} restart{plural} in a row")
                return
            delay = min(self.backoff_max, self.backoff_first * 2 ** (self.consecutive - 1))
            self.restart_at = time.time() + delay
            self._pass_on(
                P.Log(
                    level="warning",
                    t=time.time(),
                    message=f"node crashed: {ev.reason}; restarting in {delay:.0f} s "
                    f"(crash {self.consecutive} in a row)",
                )
            )
            self._timer = threading.Timer(delay, self._restart)
            self._timer.daemon = True
            self._timer.start()

    def _restart(self) -> None:
        with self._lock:
            if self._stopping:
                return
            self._timer = None
            self.restarts += 1
            try:
                self._spawn()
            except Exception as e:  # the process would not start: a crash too (its Exited, if any, is ignored)
                self._pass_on(P.Log(level="error", message=f"restart failed: {e}", t=time.time()))
                self.crashes.append(CrashReport(when=time.time(), returncode=None, signal="", reason=str(e)))
                failed, self.client = self.client, None
                self._handled.add(id(failed))
                self._after_exit(None, P.Exited(returncode=None, reason=str(e)))

    def _give_up(self, reason: str) -> None:
        self.gave_up = True
        self._pass_on(P.State(state=P.CRASHED, reason=reason))

    # --- commands: remembered for the next process, then sent ---------------------------------------
    def _send(self, fn: Callable[[NodeClient], bool]) -> bool:
        client = self.client
        return fn(client) if client is not None and client.alive else False

    def pause(self, after_round: bool = False) -> bool:
        self._paused = True
        return self._send(lambda c: c.pause(after_round))

    def resume(self) -> bool:
        self._paused, self._snooze_until = False, None
        return self._send(lambda c: c.resume())

    def snooze(self, seconds: float) -> bool:
        self._paused, self._snooze_until = False, time.time() + seconds
        return self._send(lambda c: c.snooze(seconds))

    def set_throttle(self, share: float) -> bool:
        self._update_control(dataclasses.replace(self._control(), throttle=share))
        return self._send(lambda c: c.set_throttle(share))

    def set_threads(self, threads: int) -> bool:
        if self._cfg is not None:
            self._cfg = self._cfg.replace(**{"sampler.threads": threads})
        return self._send(lambda c: c.set_threads(threads))

    def set_rules(self, control: ControlConfig) -> bool:
        self._update_control(control)
        return self._send(lambda c: c.set_rules(control))

    def request_status(self) -> bool:
        return self._send(lambda c: c.request_status())

    def _control(self) -> ControlConfig:
        return self._cfg.control if self._cfg is not None else ControlConfig()

    def _update_control(self, control: ControlConfig) -> None:
        if self._cfg is not None:
            self._cfg = dataclasses.replace(self._cfg, control=control)

    # --- events ----------------------------------------------------------------------------------
    def next_event(self, timeout: float | None = None) -> P.Message | None:
        return self.inbox.next_event(timeout)

    def wait_for(self, match: Callable[[P.Message], bool], timeout: float) -> P.Message:
        return self.inbox.wait_for(match, timeout)

    def wait_state(self, *states: str, timeout: float) -> P.State:
        return self.inbox.wait_state(*states, timeout=timeout)


__all__ = ["NodeSupervisor"]
