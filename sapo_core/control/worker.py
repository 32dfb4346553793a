"""The node process: `python -m sapo_core.control.worker`, driven through the control protocol.

Started by `NodeClient` as a fresh interpreter (never forked: torch, llama.cpp and the DHT's
threads do not survive a fork). Commands arrive as JSON lines on stdin; events leave on the
descriptor that was stdout, which is moved aside at start so that anything else printing to
stdout (a library, llama.cpp's C code) lands in stderr and cannot corrupt the stream. stderr is
the client's to keep (its last lines explain a crash).

Threads: the main thread runs the rounds; a reader thread applies commands to the
`Controller`; a rules thread reads the machine every `control.check_seconds`; a heartbeat
thread reports every second; a writer thread sends events, so that emitting never blocks
the round; a threads thread (`control/threads.py`) fits the thread count to what other programs
leave free, unless `sampler.threads` fixes it. End of stdin means the client has gone: the node
stops as if asked.

OpenMP threads (torch's here, llama.cpp's in the sampler child, which inherits the
environment) wait passively (`OMP_WAIT_POLICY=PASSIVE`, set before torch loads): spinning at
every barrier while another program holds a core collapsed a training step
(docs/environment.md, 'OpenMP threads under contention'), and burns CPU time the throttle
is trying to give back.

Logging: every record of the process (ours, hivemind's, transformers', Python warnings) becomes
a `Log` event through one handler (logs.py); `SAPO_LOG_LEVEL` in the environment sets the level.

Exit codes: 0 stopped, 1 crashed, 2 cannot run as configured (a restart would not help).
"""

from __future__ import annotations

import faulthandler
import logging
import os
import queue
import signal
import sys
import threading
import time
import traceback
from typing import BinaryIO

from sapo_core import logs
from sapo_core.config import ConfigError, ControlConfig, NodeConfig, from_dict, to_dict
from sapo_core.control import protocol as P
from sapo_core.control.controller import Controller
from sapo_core.control.nativehold import hold_sampler, thread_cpu_seconds
from sapo_core.control.rules import Rules
from sapo_core.control.vocabulary import TRAIN_TOK_PER_S
from sapo_core.hooks import Interrupted

log = logging.getLogger("sapo_core.control.worker")  # not __name__: it runs as __main__

HEARTBEAT_SECONDS = 1.0
_DROPPABLE = (P.Progress, P.Heartbeat)  # shed first when the client does not keep up
_BACKLOG = 1000


class EventWriter:
    """Events go through a queue to one writer thread: emitting never blocks the round."""

    def __init__(self, fd: int) -> None:
        self._out = os.fdopen(fd, "wb", buffering=0)
        self._queue: queue.Queue[P.Message | None] = queue.Queue()
        self.broken = threading.Event()
        self._thread = threading.Thread(target=self._run, name="sapo-events", daemon=True)
        self._thread.start()

    def emit(self, msg: P.Message) -> None:
        if self._queue.qsize() > _BACKLOG and isinstance(msg, _DROPPABLE):
            return
        self._queue.put(msg)

    def _run(self) -> None:
        while (msg := self._queue.get()) is not None:
            try:
                self._out.write(P.encode(msg))
            except (BrokenPipeError, OSError, ValueError):
                self.broken.set()  # the client has gone; the reader's end of stdin will stop us

    def close(self, timeout: float = 5.0) -> None:
        """Send what is queued, then close the stream: the reader sees its end."""
        self._queue.put(None)
        self._thread.join(timeout)
        try:
            self._out.close()
        except OSError:
            pass


def _config_kind(e: BaseException) -> str:
    """Errors a restart cannot fix: the user must change the config, the run dir or the install."""
    names = {
        "ConfigError",
        "NodeError",
        "ModelLoadError",
        "ModelUnavailable",
        "CatalogError",
        "IdentityError",
        "StoreError",
        "HardwareOverrideError",
    }
    return P.CONFIG if type(e).__name__ in names else P.CRASH


class Worker:
    def __init__(self, writer: EventWriter) -> None:
        self.writer = writer
        self.ctl = Controller(writer.emit)
        self.ctl.hold_native, self.ctl.thread_cpu = hold_sampler, thread_cpu_seconds
        self.control = ControlConfig()
        self.start_cmd: P.Start | None = None
        self.started = threading.Event()
        self.done = threading.Event()
        self.rules: Rules | None = None
        self._rules_wake = threading.Event()
        self.governor = None  # a control.threads.ThreadGovernor once the node is up

    # --- commands (reader thread) ----------------------------------------------------------------
    def read_commands(self, stream: BinaryIO) -> None:
        for line in stream:
            if not line.strip():
                continue
            try:
                cmd = P.decode(line)
                if not P.is_command(cmd):
                    raise P.ProtocolError(f"{cmd.type} is an event, not a command")
                self.dispatch(cmd)
            except (P.ProtocolError, ConfigError, ValueError) as e:
                self.writer.emit(P.Error(message=f"command refused: {e}", kind=P.COMMAND, fatal=False))
        self.ctl.stop("the app that started this node went away")
        self.started.set()

    def dispatch(self, cmd: P.Message) -> None:
        ctl = self.ctl
        if isinstance(cmd, P.Start):
            if self.start_cmd is not None:
                raise ValueError("this node has already started; stop it and start a new process")
            self.start_cmd = cmd
            self.started.set()
        elif isinstance(cmd, P.Pause):
            ctl.pause_after_round() if cmd.after_round else ctl.pause_now()
        elif isinstance(cmd, P.Resume):
            ctl.resume()
        elif isinstance(cmd, P.Snooze):
            ctl.snooze(cmd.seconds)
        elif isinstance(cmd, P.SetThrottle):
            self.set_control(ControlConfig(**{**to_dict(self.control), "throttle": float(cmd.share)}))
        elif isinstance(cmd, P.SetThreads):
            if int(cmd.threads) < 0:
                raise ValueError(f"threads {cmd.threads} must be >= 0")
            gov = self.governor
            if gov is not None:  # above 0: the user's own count; 0: adapt again, from now
                gov.fixed = int(cmd.threads)
            ctl.set_threads(int(cmd.threads) or (gov.choice().threads if gov is not None else 0))
        elif isinstance(cmd, P.SetRules):
            self.set_control(from_dict({"control": cmd.control}).control)
        elif isinstance(cmd, P.GetStatus):
            rules = {**to_dict(self.control), "active": self.rules.active if self.rules else []}
            self.writer.emit(ctl.status(rules))
        elif isinstance(cmd, P.Stop):
            ctl.stop(cmd.reason)
            self.started.set()

    def set_control(self, control: ControlConfig) -> None:
        self.control = control
        self.ctl.set_throttle(control.throttle)
        self.rules = Rules(control)
        self._rules_wake.set()

    # --- background threads ------------------------------------------------------------------------
    def watch_rules(self) -> None:
        from sapo_core.control.system import probe_from_env

        probe = probe_from_env()
        failed = ""
        while not self.done.is_set():
            rules = self.rules
            reason = None
            if rules is not None:
                try:
                    reason = rules.check(probe.read(), time.monotonic())
                except Exception as e:  # a sensor that fails must not stop the node
                    if str(e) != failed:
                        failed = str(e)
                        log.warning(f"could not read the machine's state for the rules: {e}")
            self.ctl.set_rule_reason(reason)
            self._rules_wake.wait(self.control.check_seconds)
            self._rules_wake.clear()

    def watch_threads(self) -> None:
        """Every control.check_seconds: what do other programs use? Fewer threads while they keep
        cores busy, more once they stop (threadplan.py, control/threads.py)."""
        from sapo_core.control.threads import CpuMeter

        meter = CpuMeter()
        while not self.done.wait(self.control.check_seconds):
            gov = self.governor
            if gov is None:
                continue
            try:
                change = gov.observe(meter.read())
            except Exception as e:  # a sensor that fails must not stop the node
                log.warning(f"could not read the CPU load to fit the threads: {e}")
                continue
            if change is not None:
                log.info(change.message)
                self.ctl.set_threads(change.threads)

    def heartbeat(self) -> None:
        import psutil

        from sapo_core.cpu import tree_usage

        me = psutil.Process()
        while not self.done.wait(HEARTBEAT_SECONDS):
            self.ctl.tick()
            cpu, rss = tree_usage(me)  # the llama.cpp sampler runs in a child
            self.writer.emit(
                P.Heartbeat(
                    t=time.time(),
                    state=self.ctl.state,
                    round=self.ctl.round,
                    cpu_seconds=cpu,
                    rss_bytes=rss,
                    throttle=self.ctl.duty.share,
                )
            )

    # --- the rounds (main thread) ------------------------------------------------------------------
    def run(self) -> int:
        self.started.wait()
        if self.start_cmd is None or self.ctl.stop_reason is not None:
            self.ctl.set_state(P.STOPPED, self.ctl.stop_reason or "stopped before starting")
            return P.EXIT_OK
        try:
            cfg: NodeConfig = from_dict(self.start_cmd.config)
        except ConfigError as e:
            return self._fail(e, P.CONFIG)
        self.set_control(cfg.control)
        self.ctl.threads = cfg.sampler.threads
        if self.start_cmd.paused:
            self.ctl.pause_now()
        for target, name in ((self.watch_rules, "sapo-rules"), (self.heartbeat, "sapo-heartbeat")):
            threading.Thread(target=target, name=name, daemon=True).start()
        node = None
        try:
            from sapo_core.control.layerhooks import install_layer_checkpoints
            from sapo_core.node import Node

            # the libraries the node loads log through our handler from their first line on
            logs.adopt_library_loggers(load=("transformers", "hivemind") if cfg.swarm.enabled else ("transformers",))
            self.ctl.set_state(P.STARTING, "loading the model")
            node = Node(cfg, self.ctl)
            node.setup()
            if self.ctl.threads != cfg.sampler.threads:
                node.set_threads(self.ctl.threads)
            self.ctl.apply_threads = node.set_threads
            self._start_governor(cfg, node.threads)
            install_layer_checkpoints(node.policy.model, self.ctl.checkpoint)
            self.ctl.duty.rested()  # loading the model is not owed to the throttle
            self.writer.emit(self._node_info(node))
            why = self._run_rounds(node, cfg, self.start_cmd.rounds)
        except Interrupted:
            why = self.ctl.stop_reason or "stopped"
        except BaseException as e:
            if node is not None:
                self._close(node)
            return self._fail(e, _config_kind(e))
        self.ctl.set_state(P.STOPPING, why)
        self._close(node)
        self.ctl.set_state(P.STOPPED, why)
        return P.EXIT_OK

    def _run_rounds(self, node, cfg: NodeConfig, rounds: int) -> str:
        done = 0
        while True:
            if rounds and done >= rounds:
                return f"ran {done} round{'s' * (done != 1)} as asked"
            if cfg.round.max_rounds and node.next_round > cfg.round.max_rounds:
                return f"reached round.max_rounds = {cfg.round.max_rounds}"
            if not self.ctl.between_rounds(node.next_round):
                return self.ctl.stop_reason or "stopped"
            r = node.next_round
            last = bool(rounds and done + 1 >= rounds) or bool(cfg.round.max_rounds and r >= cfg.round.max_rounds)
            try:
                metrics = node.run_round(final=last)  # the last round of a set length ends with an evaluation
            except Interrupted:
                log.info(f"stopped during round {r}; it runs again on the next start")
                return self.ctl.stop_reason or "stopped"
            self.writer.emit(P.RoundDone(round=r, metrics=metrics))
            done += 1
            gov = self.governor
            if gov is not None:
                change = gov.after_round(r, float(metrics.get(TRAIN_TOK_PER_S, 0.0)), self.ctl.duty.share)
                if change is not None:
                    log.warning(change.message)
                    self.ctl.set_threads(change.threads)

    def _start_governor(self, cfg: NodeConfig, start: int) -> None:
        from sapo_core.control.threads import ThreadGovernor
        from sapo_core.cpu import physical_cores

        fixed = self.ctl.threads if self.ctl.threads else cfg.sampler.threads
        self.governor = ThreadGovernor.for_config(
            physical_cores(), cfg.control.max_cpus_percent, cfg.control.leave_cores, fixed, start
        )
        threading.Thread(target=self.watch_threads, name="sapo-threads", daemon=True).start()

    def _node_info(self, node) -> P.NodeInfo:
        src = node.source
        peer = getattr(src, "node_id", "") if src is not None else ""
        return P.NodeInfo(
            model_id=node.policy.model_id,
            sampler=node.sampler_name,
            run_dir=str(node.run_dir),
            next_round=node.next_round,
            peer_id="" if peer == "alone" else str(peer),
            node_name=str(getattr(src, "node_name", "") or ""),
            visible_maddrs=[str(a) for a in (getattr(src, "visible_maddrs", None) or [])],
            join_address=str(getattr(src, "join_address", "") or ""),
        )

    def _close(self, node) -> None:
        try:
            node.close()
        except Exception as e:  # closing must not hide why we are closing
            log.warning(f"while closing the node: {e}")

    def _fail(self, e: BaseException, kind: str) -> int:
        message = str(e) or type(e).__name__
        if kind == P.CRASH:
            message = f"{type(e).__name__}: {message}"
        self.writer.emit(P.Error(message=message, traceback=traceback.format_exc(), kind=kind, fatal=True))
        self.ctl.set_state(P.CRASHED, message)
        return P.EXIT_CONFIG if kind == P.CONFIG else P.EXIT_CRASH


def main() -> int:
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # before torch loads (see the docstring)
    events_fd = os.dup(sys.stdout.fileno())
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())  # stray prints, Python's or C's, go to stderr
    sys.stdout = sys.stderr
    faulthandler.enable()  # a native crash (llama.cpp, torch) leaves its stacks in stderr, for the crash report
    if hasattr(signal, "SIGINT"):
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the client's; it asks us to stop
    writer = EventWriter(events_fd)
    logs.to_events(writer.emit)  # every record, ours and the libraries', becomes a Log event
    try:
        from importlib.metadata import version

        package_version = version("sapo-swarm")
    except Exception:
        package_version = ""
    writer.emit(
        P.Hello(
            protocol=P.PROTOCOL_VERSION, pid=os.getpid(), python=sys.version.split()[0], package_version=package_version
        )
    )
    worker = Worker(writer)
    threading.Thread(target=worker.read_commands, args=(sys.stdin.buffer,), name="sapo-commands", daemon=True).start()
    try:
        code = worker.run()
    finally:
        worker.done.set()
        writer.close()
    sys.stderr.flush()
    os._exit(code)  # daemon threads (the DHT's, torch's) must not hold the exit


if __name__ == "__main__":
    main()
