"""The control protocol between a node process and its clients: commands in, events out.

Plain dataclasses, one JSON object per line (UTF-8, `\\n`-terminated), never pickle. Every
line carries the protocol version `v` and the message `type`; a reader rejects another
version with a message saying what to do. The worker reads commands on its stdin and
writes events on its own descriptor (what was its stdout; stray prints go to stderr).

This module imports only the standard library: the desktop app imports it, and must never
pull in torch, transformers, llama_cpp or hivemind (a test asserts so).

Commands: Start, Pause (now or after this round), Resume, Snooze, SetThrottle, SetThreads,
SetRules, GetStatus, Stop. Events: Hello, NodeInfo, State, RoundDone, Progress, Log, Error,
Heartbeat, Status; and Exited, which the client adds when the process has gone. The words inside
the messages (a Progress's phase, a RoundDone's figure keys) are declared in vocabulary.py.
"""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass, field
from typing import Any, ClassVar

PROTOCOL_VERSION = 1
MAX_LINE_BYTES = 4 * 1024 * 1024  # a line longer than this is a bug or an attack: refuse it

# --- node states (State.state) --------------------------------------------------------------
STARTING = "starting"  # process up, loading the model
RUNNING = "running"
PAUSING = "pausing"  # asked to pause; waiting for the next checkpoint or the end of the round
PAUSED = "paused"  # idle, holding its state (reason says why: you, a rule)
SNOOZED = "snoozed"  # paused until a time, then resumes by itself
STOPPING = "stopping"
STOPPED = "stopped"  # exited cleanly
CRASHED = "crashed"  # exited on an error, or was killed; reason says why
STATES = (STARTING, RUNNING, PAUSING, PAUSED, SNOOZED, STOPPING, STOPPED, CRASHED)
HOLDING_STATES = (PAUSED, SNOOZED)

# --- Error.kind ------------------------------------------------------------------------------
CRASH = "crash"  # the node failed while running: worth a restart
CONFIG = "config"  # the node cannot run as configured: the user must change something
COMMAND = "command"  # one command was refused; the node goes on

# exit codes of the worker process
EXIT_OK, EXIT_CRASH, EXIT_CONFIG = 0, 1, 2


class ProtocolError(ValueError):
    """A line that is not a message of this protocol version."""


_REGISTRY: dict[str, type[Message]] = {}


def _message(name: str):
    def register(cls: type) -> type:
        cls.type = name
        _REGISTRY[name] = cls
        return cls

    return register


@dataclass
class Message:
    type: ClassVar[str] = ""


# === commands (client -> node) =================================================================


@_message("start")
@dataclass
class Start(Message):
    """Load the model and run rounds. `config` is a NodeConfig as a dict (config.to_dict)."""

    config: dict[str, Any]
    rounds: int = 0  # rounds to run in this session (0 = until stopped or round.max_rounds)
    paused: bool = False  # load, then hold before the first round ("paused by you")


@_message("pause")
@dataclass
class Pause(Message):
    after_round: bool = False  # False: within ~2 s, mid-round; True: when the current round ends


@_message("resume")
@dataclass
class Resume(Message):
    """Undo a pause or snooze by the user (rules that pause the node still hold it)."""


@_message("snooze")
@dataclass
class Snooze(Message):
    seconds: float


@_message("set_throttle")
@dataclass
class SetThrottle(Message):
    share: float  # 0.05..1: share of CPU time (duty cycle)


@_message("set_threads")
@dataclass
class SetThreads(Message):
    threads: int  # 0 = all physical cores


@_message("set_rules")
@dataclass
class SetRules(Message):
    """A whole ControlConfig as a dict (config.to_dict(cfg.control)); replaces throttle and rules."""

    control: dict[str, Any]


@_message("get_status")
@dataclass
class GetStatus(Message):
    """Ask for a Status event."""


@_message("stop")
@dataclass
class Stop(Message):
    """Finish: abandon the round in progress (it reruns on the next start), close, exit."""

    reason: str = "stopped by you"


COMMANDS = (Start, Pause, Resume, Snooze, SetThrottle, SetThreads, SetRules, GetStatus, Stop)

# === events (node -> client) ====================================================================


@_message("hello")
@dataclass
class Hello(Message):
    protocol: int
    pid: int
    python: str = ""
    package_version: str = ""


@_message("node_info")
@dataclass
class NodeInfo(Message):
    """Who this node is, once the model is loaded."""

    model_id: str
    sampler: str
    run_dir: str
    next_round: int
    peer_id: str = ""  # empty when training alone
    node_name: str = ""
    visible_maddrs: list[str] = field(default_factory=list)
    join_address: str = ""  # what another volunteer passes as initial peer


@_message("state")
@dataclass
class State(Message):
    state: str
    reason: str = ""  # "paused by you", "on battery", "outside schedule (...)", a crash's message
    round: int = 0  # the round in progress or next
    until: float | None = None  # wall-clock time a snooze ends (time.time())


@_message("round_done")
@dataclass
class RoundDone(Message):
    round: int
    metrics: dict[str, float]  # namespaced figures from Node.run_round (non-finite ones dropped)


@_message("progress")
@dataclass
class Progress(Message):
    round: int
    phase: str  # a phase of the round (vocabulary.py: PHASES), or DOWNLOAD: the model, before round 1 (round 0)
    done: int
    total: int
    info: dict[str, Any] = field(default_factory=dict)


@_message("log")
@dataclass
class Log(Message):
    level: str  # debug, info, warning, error
    message: str
    t: float = 0.0


@_message("error")
@dataclass
class Error(Message):
    message: str  # one readable line for the user
    traceback: str = ""  # for the log / a bug report
    kind: str = CRASH  # crash, config, command
    fatal: bool = True  # the node exits after a fatal error


@_message("heartbeat")
@dataclass
class Heartbeat(Message):
    t: float
    state: str
    round: int
    cpu_seconds: float  # user + system CPU time so far of the node process and its children (the sampler)
    rss_bytes: int  # resident memory of the same
    throttle: float = 1.0


@_message("status")
@dataclass
class Status(Message):
    state: str
    reason: str
    round: int
    phase: str
    throttle: float
    threads: int
    rules: dict[str, Any]
    paused_by_user: bool
    snoozed_until: float | None
    rule_reason: str  # the rule holding the node, or ""


@_message("exited")
@dataclass
class Exited(Message):
    """Written by the client, not the node: the process has gone."""

    returncode: int | None
    signal: str = ""  # e.g. SIGKILL when a signal ended it
    clean: bool = False  # it said `stopped` before exiting
    reason: str = ""


EVENTS = (Hello, NodeInfo, State, RoundDone, Progress, Log, Error, Heartbeat, Status, Exited)


# === encoding ===================================================================================


def _finite(value: Any) -> Any:
    """JSON has no NaN or infinity: they become null (figures) so every reader can parse the line."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {str(k): _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    return value


def encode(msg: Message) -> bytes:
    """One line: {"v": 1, "type": "...", ...fields}\\n."""
    body = {"v": PROTOCOL_VERSION, "type": msg.type}
    body.update(_finite(dataclasses.asdict(msg)))
    line = json.dumps(body, ensure_ascii=False, allow_nan=False, separators=(",", ":")).encode("utf-8") + b"\n"
    if len(line) > MAX_LINE_BYTES:
        raise ProtocolError(f"{msg.type} message of {len(line)} bytes exceeds {MAX_LINE_BYTES}")
    return line


def decode(line: bytes | str) -> Message:
    if isinstance(line, bytes):
        if len(line) > MAX_LINE_BYTES:
            raise ProtocolError(f"line of {len(line)} bytes exceeds {MAX_LINE_BYTES}")
        try:
            line = line.decode("utf-8")
        except UnicodeDecodeError as e:
            raise ProtocolError(f"not UTF-8: {e}") from None
    try:
        body = json.loads(line)
    except json.JSONDecodeError as e:
        raise ProtocolError(f"not JSON ({e}): {line[:80]!r}") from None
    if not isinstance(body, dict):
        raise ProtocolError(f"not a JSON object: {line[:80]!r}")
    version = body.pop("v", None)
    if version != PROTOCOL_VERSION:
        raise ProtocolError(
            f"protocol version {version!r}, this side speaks {PROTOCOL_VERSION}: the app and the "
            f"node come from different installs; reinstall SAPO Swarm"
        )
    name = body.pop("type", None)
    cls = _REGISTRY.get(name) if isinstance(name, str) else None
    if cls is None:
        raise ProtocolError(f"unknown message type {name!r}")
    known = {f.name for f in dataclasses.fields(cls)}
    try:
        # fields this side does not know are dropped: a minor addition must not break an older reader
        return cls(**{k: v for k, v in body.items() if k in known})
    except TypeError as e:
        raise ProtocolError(f"{name}: {e}") from None


def is_command(msg: Message) -> bool:
    return isinstance(msg, COMMANDS)


def is_event(msg: Message) -> bool:
    return isinstance(msg, EVENTS)


__all__ = [
    "PROTOCOL_VERSION",
    "ProtocolError",
    "Message",
    "encode",
    "decode",
    "is_command",
    "is_event",
    "Start",
    "Pause",
    "Resume",
    "Snooze",
    "SetThrottle",
    "SetThreads",
    "SetRules",
    "GetStatus",
    "Stop",
    "Hello",
    "NodeInfo",
    "State",
    "RoundDone",
    "Progress",
    "Log",
    "Error",
    "Heartbeat",
    "Status",
    "Exited",
    "STARTING",
    "RUNNING",
    "PAUSING",
    "PAUSED",
    "SNOOZED",
    "STOPPING",
    "STOPPED",
    "CRASHED",
    "STATES",
    "HOLDING_STATES",
    "CRASH",
    "CONFIG",
    "COMMAND",
    "EXIT_OK",
    "EXIT_CRASH",
    "EXIT_CONFIG",
]
