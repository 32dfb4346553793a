"""`WorkerBridge`: the node process seen from Qt.

It owns a `NodeSupervisor` (a `NodeClient` that restarts after crashes) or, with
`restart_on_crash=False`, a bare `NodeClient`. Their events arrive on the client's reader
thread; the bridge hands each one to the GUI thread through a queued signal and re-emits it
there as a typed signal, so no widget is ever touched from another thread. Starting and
stopping block (waiting for the process's hello, staged stop), so they run on short-lived
threads and report back as events too.

Commands (pause, resume, snooze, throttle, threads, rules, status) write one line to the
node's stdin: quick enough for the GUI thread.
"""

from __future__ import annotations

import threading
import time
from typing import Any

from PySide6.QtCore import QObject, Qt, Signal

from sapo_core.config import ControlConfig, NodeConfig
from sapo_core.control import protocol as P
from sapo_core.control.client import CrashReport, NodeClient
from sapo_core.control.supervisor import NodeSupervisor


class WorkerBridge(QObject):
    event = Signal(object)
    """Every event from the node, on the GUI thread (P.Message)."""
    hello = Signal(object)
    """P.Hello: a node process is up and speaks our protocol."""
    node_info = Signal(object)
    """P.NodeInfo: the model is loaded; who the node is in the swarm."""
    state_changed = Signal(object)
    """P.State: the node's state and its reason."""
    round_done = Signal(object)
    """P.RoundDone: a round ended; its figures."""
    progress = Signal(object)
    """P.Progress: the phase of the current round."""
    logged = Signal(object)
    """P.Log: a line from the node (or the supervisor)."""
    error = Signal(object)
    """P.Error: something went wrong; `kind` says whether the user must change a setting."""
    heartbeat = Signal(object)
    """P.Heartbeat: once a second while the process lives."""
    status = Signal(object)
    """P.Status: the answer to `request_status`."""
    exited = Signal(object)
    """P.Exited: the process has gone."""
    command_sent = Signal(str)
    """A command was written to the node, in words ("pause after this round")."""
    stop_finished = Signal()
    """`stop()` is done: the process has gone (or there was none)."""

    _relay = Signal(object)  # from the client's threads to the GUI thread (queued)

    def __init__(
        self,
        parent: QObject | None = None,
        *,
        env: dict[str, str] | None = None,
        restart_on_crash: bool = True,
        heartbeat_timeout: float | None = 60.0,
    ) -> None:
        super().__init__(parent)
        self.env = env
        self.restart_on_crash = restart_on_crash
        self.heartbeat_timeout = heartbeat_timeout
        self.node: NodeSupervisor | NodeClient | None = None
        self.config: NodeConfig | None = None
        self.last_hello: P.Hello | None = None
        self.last_info: P.NodeInfo | None = None
        self.last_state: P.State | None = None
        self.last_error: P.Error | None = None
        self._stopping = False
        self._relay.connect(self._on_relay, Qt.ConnectionType.QueuedConnection)

    # --- lifecycle -------------------------------------------------------------------------------
    @property
    def running(self) -> bool:
        """A node process is started and has not been stopped or given up on."""
        if self.node is None or self._stopping:
            return False
        if isinstance(self.node, NodeSupervisor):
            return not self.node.gave_up and (
                self.node.client is not None and self.node.client.alive or self.node.restart_at is not None
            )
        return self.node.alive

    def start(self, cfg: NodeConfig, paused: bool = False, rounds: int = 0) -> None:
        """Start a node with this config (returns at once; events follow)."""
        if self.running:
            raise RuntimeError("the node is already running; stop it first")
        self.config, self._stopping = cfg, False
        self.last_error = None
        if self.restart_on_crash:
            node: NodeSupervisor | NodeClient = NodeSupervisor(
                on_event=self._relay.emit, env=self.env, heartbeat_timeout=self.heartbeat_timeout
            )
        else:
            node = NodeClient(on_event=self._relay.emit, env=self.env, heartbeat_timeout=self.heartbeat_timeout)
        self.node = node
        threading.Thread(
            target=self._start_blocking, args=(node, cfg, paused, rounds), name="sapo-start-node", daemon=True
        ).start()

    def _start_blocking(self, node: NodeSupervisor | NodeClient, cfg: NodeConfig, paused: bool, rounds: int) -> None:
        try:
            node.start(cfg, rounds=rounds, paused=paused)
        except Exception as e:  # the process did not come up: say so like a node error
            self._relay.emit(P.Error(message=f"the node process could not start: {e}", kind=P.CRASH, fatal=True))
            self._relay.emit(P.State(state=P.CRASHED, reason=str(e)))

    def stop(self, timeout: float = 30.0) -> None:
        """Ask the node to stop (staged: ask, wait, terminate, kill) on a thread; `stop_finished` follows."""
        node = self.node
        self._stopping = True
        if node is None:
            self.stop_finished.emit()
            return

        def stop_blocking() -> None:
            try:
                node.stop(timeout=timeout, terminate_timeout=5.0)
            finally:
                self._relay.emit(_StopDone())

        threading.Thread(target=stop_blocking, name="sapo-stop-node", daemon=True).start()

    def stop_and_wait(self, timeout: float = 30.0) -> None:
        """Stop on the calling thread (the app's last act, and tests' teardown)."""
        self._stopping = True
        if self.node is not None:
            self.node.stop(timeout=timeout, terminate_timeout=5.0)

    # --- commands --------------------------------------------------------------------------------
    def _send(self, words: str, fn: Any, *args: Any) -> bool:
        if self.node is None:
            return False
        ok = bool(fn(*args))
        self.command_sent.emit(words if ok else f"{words} (not sent: the node is not running)")
        return ok

    def pause(self, after_round: bool = False) -> bool:
        return self._send(
            "pause after this round" if after_round else "pause now",
            self.node.pause if self.node else None,
            after_round,
        )

    def resume(self) -> bool:
        return self._send("resume", self.node.resume if self.node else None)

    def snooze(self, seconds: float) -> bool:
        return self._send(f"snooze {seconds / 60:.0f} min", self.node.snooze if self.node else None, seconds)

    def set_throttle(self, share: float) -> bool:
        return self._send(f"use {share:.0%} of the CPU", self.node.set_throttle if self.node else None, share)

    def set_threads(self, threads: int) -> bool:
        return self._send(f"threads: {threads or 'all cores'}", self.node.set_threads if self.node else None, threads)

    def set_rules(self, control: ControlConfig) -> bool:
        return self._send("new power rules", self.node.set_rules if self.node else None, control)

    def request_status(self) -> bool:
        if self.node is None:
            return False
        return bool(self.node.request_status())

    # --- what the user may want to read ----------------------------------------------------------
    @property
    def crash(self) -> CrashReport | None:
        if isinstance(self.node, NodeSupervisor):
            return self.node.last_crash
        return self.node.crash if self.node is not None else None

    @property
    def restart_at(self) -> float | None:
        return self.node.restart_at if isinstance(self.node, NodeSupervisor) else None

    def stderr_tail(self, lines: int = 50) -> list[str]:
        client = self.node.client if isinstance(self.node, NodeSupervisor) else self.node
        return list(client.stderr_tail)[-lines:] if client is not None else []

    # --- GUI thread --------------------------------------------------------------------------------
    def _on_relay(self, ev: P.Message) -> None:
        if isinstance(ev, _StopDone):
            self.stop_finished.emit()
            return
        if isinstance(ev, P.Hello):
            self.last_hello = ev
            self.hello.emit(ev)
        elif isinstance(ev, P.NodeInfo):
            self.last_info = ev
            self.node_info.emit(ev)
        elif isinstance(ev, P.State):
            self.last_state = ev
            self.state_changed.emit(ev)
        elif isinstance(ev, P.RoundDone):
            self.round_done.emit(ev)
        elif isinstance(ev, P.Progress):
            self.progress.emit(ev)
        elif isinstance(ev, P.Log):
            self.logged.emit(ev)
        elif isinstance(ev, P.Error):
            self.last_error = ev
            self.error.emit(ev)
        elif isinstance(ev, P.Heartbeat):
            self.heartbeat.emit(ev)
        elif isinstance(ev, P.Status):
            self.status.emit(ev)
        elif isinstance(ev, P.Exited):
            self.exited.emit(ev)
        self.event.emit(ev)


class _StopDone(P.Message):
    """Internal marker: the stop thread finished (never on the wire)."""

    def __init__(self) -> None:
        self.t = time.time()


__all__ = ["WorkerBridge"]
