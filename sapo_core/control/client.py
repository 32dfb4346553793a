"""`NodeClient`: start the node process, send it commands, receive its events, stop it in stages.

Used by `sapo-node run` and by the desktop app. Imports only the standard library, psutil and
the protocol: no torch, transformers, llama_cpp or hivemind (a test asserts so).

    client = NodeClient(on_event=print)           # or read client.next_event()
    client.start(cfg)                             # spawns, waits for hello, sends Start
    client.pause(); client.resume(); client.set_throttle(0.5)
    client.stop()                                 # ask -> wait -> terminate -> kill

Events arrive on a reader thread: `on_event` is called there (a Qt bridge re-emits them as
signals) and every event is also queued for `next_event` / `wait_for`. When the process
ends, the client adds `Exited`, preceded by `State(crashed, reason)` if the node did not say
it stopped; `crash` then holds the reason for the user: exit code or signal, the last error
event, the last lines of stderr. A node silent for `heartbeat_timeout` seconds counts as hung:
it is terminated, then killed.
"""

from __future__ import annotations

import collections
import os
import signal as _signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import psutil

from sapo_core.config import ControlConfig, NodeConfig, to_dict
from sapo_core.control import protocol as P

STDERR_LINES = 200


class NodeStartError(RuntimeError):
    """The node process did not come up; the message says why (with its stderr)."""


@dataclass
class CrashReport:
    """Why the node process ended without being asked to: kept for the user."""

    when: float
    returncode: int | None
    signal: str  # "SIGKILL", or "" when it exited on its own
    reason: str  # one readable line
    last_error: str = ""  # the node's last Error event, if any
    traceback: str = ""
    stderr_tail: list[str] = field(default_factory=list)


def _signal_name(returncode: int | None) -> str:
    if returncode is None or returncode >= 0 or sys.platform == "win32":
        return ""
    try:
        return _signal.Signals(-returncode).name
    except ValueError:
        return f"signal {-returncode}"


class EventInbox:
    """Events kept for a reader that waits on them (a CLI loop, a test); thread-safe.

    Bounded: a client that only uses callbacks (the GUI) never reads it, so past `maxlen`
    the oldest events are dropped rather than kept for days."""

    def __init__(self, maxlen: int = 10_000) -> None:
        self._events: collections.deque[P.Message] = collections.deque(maxlen=maxlen)
        self._cond = threading.Condition()

    def put(self, ev: P.Message) -> None:
        with self._cond:
            self._events.append(ev)
            self._cond.notify_all()

    def empty(self) -> bool:
        with self._cond:
            return not self._events

    def next_event(self, timeout: float | None = None) -> P.Message | None:
        with self._cond:
            if not self._cond.wait_for(lambda: bool(self._events), timeout):
                return None
            return self._events.popleft()

    def wait_for(self, match: Callable[[P.Message], bool], timeout: float) -> P.Message:
        """Consume events until one matches; TimeoutError names the last ones seen."""
        deadline = time.monotonic() + timeout
        seen: collections.deque[str] = collections.deque(maxlen=8)
        while (left := deadline - time.monotonic()) > 0:
            ev = self.next_event(min(left, 0.5))
            if ev is None:
                continue
            if match(ev):
                return ev
            if not isinstance(ev, (P.Heartbeat, P.Progress)):
                seen.append(repr(ev)[:160])
        raise TimeoutError(f"no matching event within {timeout:.0f} s; last events: {list(seen)}")

    def wait_state(self, *states: str, timeout: float) -> P.State:
        ev = self.wait_for(lambda e: isinstance(e, P.State) and e.state in states, timeout)
        assert isinstance(ev, P.State)
        return ev


# The watchdog looks every second; a gap this long between its looks means it was not running.
WATCHDOG_STALL_SECONDS = 10.0


class NodeClient:
    def __init__(
        self,
        on_event: Callable[[P.Message], None] | None = None,
        *,
        python: str | None = None,
        env: dict[str, str] | None = None,
        heartbeat_timeout: float | None = 60.0,
    ) -> None:
        self.on_event = on_event
        self.python = python or sys.executable
        self.env = env
        self.heartbeat_timeout = heartbeat_timeout
        self.proc: subprocess.Popen | None = None
        self.hello: P.Hello | None = None
        self.info: P.NodeInfo | None = None
        self.state: P.State | None = None
        self.last_error: P.Error | None = None
        self.crash: CrashReport | None = None
        self.exited: P.Exited | None = None
        self.stderr_tail: collections.deque[str] = collections.deque(maxlen=STDERR_LINES)
        self.fatal_line = ""  # "Fatal Python error: Segmentation fault", when the node's fault handler wrote one
        self.last_event_at = 0.0
        self.inbox = EventInbox()
        self._hello = threading.Event()
        self._gone = threading.Event()
        self._send_lock = threading.Lock()
        self._forced = ""  # why the client ended the process itself
        self._hello_error = ""
        self._threads: list[threading.Thread] = []

    # --- lifecycle -------------------------------------------------------------------------------
    def start(self, cfg: NodeConfig, rounds: int = 0, paused: bool = False, hello_timeout: float = 60.0) -> P.Hello:
        """Spawn the node, check its protocol, send Start. Events follow (state starting, node_info...)."""
        if self.proc is not None:
            raise RuntimeError("this client already started a node; make a new NodeClient")
        env = dict(os.environ if self.env is None else self.env)
        env.setdefault("PYTHONUNBUFFERED", "1")
        kwargs: dict = {}
        if sys.platform == "win32":
            kwargs["creationflags"] = subprocess.CREATE_NEW_PROCESS_GROUP  # type: ignore[attr-defined]
        else:
            kwargs["start_new_session"] = True  # the terminal's Ctrl-C is ours to handle, not the node's
        self.proc = subprocess.Popen(
            [self.python, "-m", "sapo_core.control.worker"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=env,
            **kwargs,
        )
        self.last_event_at = time.monotonic()
        for target, name in (
            (self._read_events, "node-events"),
            (self._read_stderr, "node-stderr"),
            (self._watch_heartbeat, "node-watchdog"),
        ):
            t = threading.Thread(target=target, name=name, daemon=True)
            t.start()
            self._threads.append(t)
        if not self._hello.wait(hello_timeout) or self.hello is None:
            self.kill()
            if self._hello_error:
                raise NodeStartError(f"the node process is not one this app can talk to: {self._hello_error}")
            tail = "\n".join(list(self.stderr_tail)[-20:])
            raise NodeStartError(
                f"the node process did not answer within {hello_timeout:.0f} s"
                + (f"; its last output:\n{tail}" if tail else "")
            )
        if self.hello.protocol != P.PROTOCOL_VERSION:
            self.kill()
            raise NodeStartError(
                f"the node speaks control protocol {self.hello.protocol}, this app "
                f"{P.PROTOCOL_VERSION}: they come from different installs; reinstall SAPO Swarm"
            )
        self.send(P.Start(config=to_dict(cfg), rounds=rounds, paused=paused))
        return self.hello

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self, timeout: float = 60.0, terminate_timeout: float = 5.0, reason: str = "stopped by you") -> int | None:
        """Ask the node to stop, wait; then terminate, wait; then kill. Returns the exit code."""
        if self.proc is None:
            return None
        self.send(P.Stop(reason=reason))
        if self._wait_gone(timeout):
            return self.proc.returncode
        self._forced = f"did not stop within {timeout:.0f} s: terminated"
        self._signal_tree(kill=False)
        if self._wait_gone(terminate_timeout):
            return self.proc.returncode
        self._forced = f"did not stop within {timeout:.0f} s nor on SIGTERM: killed"
        self._signal_tree(kill=True)
        self._wait_gone(terminate_timeout)
        return self.proc.returncode

    def kill(self) -> None:
        """End the process at once (the node resumes from its last checkpoint next time)."""
        if self.proc is None:
            return
        self._forced = self._forced or "killed by the app"
        self._signal_tree(kill=True)
        self._wait_gone(10.0)

    def close(self) -> None:
        if self.alive:
            self.stop()

    def __enter__(self) -> NodeClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- commands --------------------------------------------------------------------------------
    def send(self, cmd: P.Message) -> bool:
        """Write one command; False if the process is gone."""
        if self.proc is None or self.proc.stdin is None:
            return False
        line = P.encode(cmd)
        with self._send_lock:
            try:
                self.proc.stdin.write(line)
                self.proc.stdin.flush()
                return True
            except (BrokenPipeError, OSError, ValueError):
                return False

    def pause(self, after_round: bool = False) -> bool:
        return self.send(P.Pause(after_round=after_round))

    def resume(self) -> bool:
        return self.send(P.Resume())

    def snooze(self, seconds: float) -> bool:
        return self.send(P.Snooze(seconds=seconds))

    def set_throttle(self, share: float) -> bool:
        return self.send(P.SetThrottle(share=share))

    def set_threads(self, threads: int) -> bool:
        return self.send(P.SetThreads(threads=threads))

    def set_rules(self, control: ControlConfig) -> bool:
        return self.send(P.SetRules(control=to_dict(control)))

    def request_status(self) -> bool:
        return self.send(P.GetStatus())

    # --- events ----------------------------------------------------------------------------------
    def next_event(self, timeout: float | None = None) -> P.Message | None:
        return self.inbox.next_event(timeout)

    def events(self, timeout: float | None = None) -> Iterator[P.Message]:
        """Events until the process has gone (Exited is the last); `timeout` per event."""
        while True:
            ev = self.next_event(timeout)
            if ev is None:
                if self._gone.is_set() and self.inbox.empty():
                    return
                continue
            yield ev
            if isinstance(ev, P.Exited):
                return

    def wait_for(self, match: Callable[[P.Message], bool], timeout: float) -> P.Message:
        """Consume events until one matches; TimeoutError if none comes in time or the node exits."""

        def match_or_exit(ev: P.Message) -> bool:
            if match(ev):
                return True
            if isinstance(ev, P.Exited):
                raise TimeoutError(f"the node exited ({ev.reason}) before the awaited event")
            return False

        return self.inbox.wait_for(match_or_exit, timeout)

    def wait_state(self, *states: str, timeout: float) -> P.State:
        ev = self.wait_for(lambda e: isinstance(e, P.State) and e.state in states, timeout)
        assert isinstance(ev, P.State)
        return ev

    # --- threads -----------------------------------------------------------------------------------
    def _deliver(self, ev: P.Message) -> None:
        self.last_event_at = time.monotonic()
        if isinstance(ev, P.Hello):
            self.hello = ev
            self._hello.set()
        elif isinstance(ev, P.NodeInfo):
            self.info = ev
        elif isinstance(ev, P.State):
            self.state = ev
        elif isinstance(ev, P.Error):
            self.last_error = ev
        self.inbox.put(ev)
        if self.on_event is not None:
            try:
                self.on_event(ev)
            except Exception as e:  # a broken display must not stop event delivery
                print(f"sapo: event callback failed: {e!r}", file=sys.stderr)

    def _read_events(self) -> None:
        assert self.proc is not None and self.proc.stdout is not None
        for line in self.proc.stdout:
            try:
                ev = P.decode(line)
            except P.ProtocolError as e:
                if self.hello is None:  # the first line already fails: another version of the node
                    self._hello_error = str(e)
                    self._hello.set()
                ev = P.Log(level="error", message=f"unreadable message from the node: {e}", t=time.time())
            self._deliver(ev)
        self._hello.set()
        try:
            code = self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:  # it closed its events but lives on: end it
            self._forced = self._forced or "closed its event stream but did not exit: killed"
            self._signal_tree(kill=True)
            code = self.proc.wait()
        for t in self._threads:
            if t.name == "node-stderr":
                t.join(5)
        self._finish(code)

    def _finish(self, code: int | None) -> None:
        clean = self.state is not None and self.state.state == P.STOPPED and code == P.EXIT_OK
        sig = _signal_name(code)
        if clean:
            reason = self.state.reason if self.state else "stopped"
        else:
            reason = self._crash_reason(code, sig)
            self.crash = CrashReport(
                when=time.time(),
                returncode=code,
                signal=sig,
                reason=reason,
                last_error=self.last_error.message if self.last_error else "",
                traceback=self.last_error.traceback if self.last_error else "",
                stderr_tail=list(self.stderr_tail),
            )
            if self.state is None or self.state.state != P.CRASHED:
                self._deliver(P.State(state=P.CRASHED, reason=reason, round=self.state.round if self.state else 0))
        self.exited = P.Exited(returncode=code, signal=sig, clean=clean, reason=reason)
        self._gone.set()
        self._deliver(self.exited)

    def _crash_reason(self, code: int | None, sig: str) -> str:
        if self._forced:
            how = self._forced
        elif sig:
            how = f"ended by {sig}"
        else:
            how = f"exited with code {code}"
        if self.last_error is not None and self.last_error.fatal:
            return f"{self.last_error.message} ({how})"
        if self.state is not None and self.state.state == P.CRASHED and self.state.reason:
            return f"{self.state.reason} ({how})"
        if self.fatal_line:  # Python's fault handler named the fault; its thread dump follows
            return f"the node {how}: {self.fatal_line}"
        tail = next((ln for ln in reversed(self.stderr_tail) if ln.strip()), "")
        return f"the node {how}" + (f"; last output: {tail.strip()[:200]}" if tail and not sig else "")

    def _read_stderr(self) -> None:
        assert self.proc is not None and self.proc.stderr is not None
        for raw in self.proc.stderr:
            line = raw.decode("utf-8", "replace").rstrip("\n")
            if line.startswith("Fatal Python error:"):
                self.fatal_line = line.strip()
            self.stderr_tail.append(line)

    def _watch_heartbeat(self) -> None:
        if not self.heartbeat_timeout:
            return
        tick = time.monotonic()
        while not self._gone.wait(1.0):
            now = time.monotonic()
            if now - tick > WATCHDOG_STALL_SECONDS:
                # This loop itself did not run: the machine slept (Windows' monotonic clock counts
                # a suspend) or this process was stopped. The node slept too: it gets a whole
                # timeout from now to say it is alive, not a kill for the time nobody ran.
                self.last_event_at = max(self.last_event_at, now)
            tick = now
            silent = now - self.last_event_at
            if silent > self.heartbeat_timeout and self.alive:
                self._forced = f"no heartbeat for {silent:.0f} s: hung, terminated"
                self._signal_tree(kill=False)
                if not self._wait_gone(5.0):
                    self._forced = f"no heartbeat for {silent:.0f} s: hung, killed"
                    self._signal_tree(kill=True)
                return

    def _wait_gone(self, timeout: float) -> bool:
        """Wait until the process has exited and its events are read (Exited delivered)."""
        return self._gone.wait(timeout)

    def _signal_tree(self, kill: bool) -> None:
        """Terminate or kill the node and its children (the p2p daemon), children first."""
        if self.proc is None or self.proc.poll() is not None:
            return
        try:
            procs = psutil.Process(self.proc.pid).children(recursive=True) + [psutil.Process(self.proc.pid)]
        except psutil.Error:
            procs = []
        for p in procs:
            try:
                p.kill() if kill else p.terminate()
            except psutil.Error:
                continue


__all__ = ["NodeClient", "NodeStartError", "CrashReport", "EventInbox"]
