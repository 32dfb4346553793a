"""Where log records go: one handler where a process meets the outside, one level switch.

Every module that reports anything logs with `log = logging.getLogger(__name__)` and adds no
handler of its own; library use (tests, notebooks) sees nothing unless it configures logging.
The process's entry point installs one handler on the root logger:

- the node worker (`control/worker.py`): `to_events(emit)`, each record becomes a protocol
  `Log` event, which the app shows in its Log tab and `sapo-node run` prints;
- the command-line tools (`sapo-node`, `sapo-bench`, `sapo-experiment`): `to_stderr(prefix)`,
  one line per record on stderr: `sapo-node eval: downloading ...`, `... warning: ...`.

The level switch is `SAPO_LOG_LEVEL` (debug, info, warning or error; info when unset), or
`--log-level` on the command-line tools, which sets that variable so that a node worker they
start inherits it (the app's worker inherits the app's environment).

Third parties report too, filtered harder so that the Log tab is not flooded: Python `warnings`
go through logging (`logging.captureWarnings`), hivemind's and transformers' loggers give up
their own stderr handlers and propagate to ours (`adopt_library_loggers`, called again where
those libraries are first imported), and their records pass at WARNING and above, or at the
switch's level when that is higher. (hivemind's `utils/logging.py` works the same way.) A
library warning a volunteer cannot act on, raised by a library's own call, is filtered here by its
exact text (`QUIET_LIBRARY_WARNINGS`, each with the call that raises it); ours are fixed instead.
"""

from __future__ import annotations

import logging
import os
import sys
import warnings
from collections.abc import Callable
from typing import Any, TextIO

ENV = "SAPO_LOG_LEVEL"
LEVELS = {"debug": logging.DEBUG, "info": logging.INFO, "warning": logging.WARNING, "error": logging.ERROR}
DEFAULT_LEVEL = logging.INFO
THIRD_PARTY_FLOOR = logging.WARNING  # hivemind logs every connection at INFO
OWN_LOGGERS = ("sapo_core", "app")  # records of these pass at the switch's level; others at the floor

log = logging.getLogger(__name__)

# (category, message regex, the library call that raises it): warnings raised inside a library's
# own call, which no change of ours and nothing a volunteer does would remove.
QUIET_LIBRARY_WARNINGS: tuple[tuple[type[Warning], str, str], ...] = (
    (
        FutureWarning,
        r"`is_gradient_checkpointing` is deprecated",
        # peft 0.21's PeftModel.__init__ (peft/peft_model.py, reached from get_peft_model in
        # policy.py) reads `model.is_gradient_checkpointing`, a property transformers 5 deprecated
        # for `is_activation_checkpointing` (transformers/modeling_utils.py): on every node start
        "peft PeftModel.__init__ -> transformers PreTrainedModel.is_gradient_checkpointing",
    ),
)

_handler: logging.Handler | None = None  # the one handler an entry point installed (None: library use)
_saved_levels: dict[str, int] = {}  # the levels install() changed, for uninstall()
_adopted: set[str] = set()


def parse_level(text: str) -> int:
    """'info' -> logging.INFO; ValueError naming the choices otherwise."""
    level = LEVELS.get(text.strip().lower())
    if level is None:
        raise ValueError(f"log level {text!r} is not one of {', '.join(LEVELS)}")
    return level


def level_name(level: int) -> str:
    """The protocol's word for a record's level: debug, info, warning or error (critical -> error)."""
    if level >= logging.ERROR:
        return "error"
    if level >= logging.WARNING:
        return "warning"
    return "info" if level >= logging.INFO else "debug"


def level_from_env() -> tuple[int, str]:
    """The switch's level, and a complaint when SAPO_LOG_LEVEL holds no level (then: info)."""
    text = os.environ.get(ENV, "")
    if not text:
        return DEFAULT_LEVEL, ""
    try:
        return parse_level(text), ""
    except ValueError as e:
        return DEFAULT_LEVEL, f"{ENV}: {e}; using info"


def add_level_argument(parser: Any) -> None:
    """`--log-level` for an argparse parser; `apply_level_argument(args)` sets the switch from it."""
    parser.add_argument(
        "--log-level",
        choices=list(LEVELS),
        default=None,
        help=f"how much the tool reports: debug, info (default), warning or error; the same as "
        f"{ENV}, which a node it starts inherits",
    )


def apply_level_argument(args: Any) -> None:
    level = getattr(args, "log_level", None)
    if level:
        os.environ[ENV] = level


def _is_own(name: str) -> bool:
    return any(name == own or name.startswith(own + ".") for own in OWN_LOGGERS)


class LevelFilter(logging.Filter):
    """Our records at the switch's level, third parties' at THIRD_PARTY_FLOOR or above it."""

    def __init__(self, level: int) -> None:
        super().__init__()
        self.level = level
        self.third_party = max(level, THIRD_PARTY_FLOOR)

    def filter(self, record: logging.LogRecord) -> bool:
        return record.levelno >= (self.level if _is_own(record.name) else self.third_party)


def message_of(record: logging.LogRecord) -> str:
    """The line a user reads: our own messages as written; a library's named after it
    ('hivemind: ...'); a Python warning as `warnings` formats it, on one line; a traceback after."""
    text = record.getMessage().rstrip()
    if record.name == "py.warnings":
        text = " ".join(part.strip() for part in text.splitlines()[:1])
    elif not _is_own(record.name):
        text = f"{record.name.split('.')[0]}: {text}"
    if record.exc_info:
        text += "\n" + logging.Formatter().formatException(record.exc_info)
    return text


class EventHandler(logging.Handler):
    """Records as protocol `Log` events, through `emit` (the worker's EventWriter: never blocks)."""

    def __init__(self, emit: Callable[[Any], None]) -> None:
        super().__init__()
        self._emit_event = emit

    def emit(self, record: logging.LogRecord) -> None:
        from sapo_core.control import protocol as P

        try:
            self._emit_event(P.Log(level=level_name(record.levelno), message=message_of(record), t=record.created))
        except Exception:
            self.handleError(record)


class LineHandler(logging.StreamHandler):
    """One line per record on a terminal: `prefix` + `warning: ` for warnings and errors + message.
    The prefix may be a function, asked at each record (sapo-experiment names the node)."""

    def __init__(self, prefix: str | Callable[[], str] = "", stream: TextIO | None = None) -> None:
        super().__init__(stream)
        self.prefix = prefix

    def format(self, record: logging.LogRecord) -> str:
        word = "" if record.levelno < logging.WARNING else f"{level_name(record.levelno)}: "
        prefix = self.prefix() if callable(self.prefix) else self.prefix
        return f"{prefix}{word}{message_of(record)}"

    def emit(self, record: logging.LogRecord) -> None:
        if self.stream is None:  # sys.stderr as it is now (pytest's capsys swaps it)
            self.setStream(sys.stderr)
        super().emit(record)


def install(handler: logging.Handler, level: int | None = None) -> logging.Handler:
    """Make `handler` the process's one handler (replacing one installed before), at the switch's
    level; route warnings and the libraries' loggers to it."""
    global _handler
    complaint = ""
    if level is None:
        level, complaint = level_from_env()
    uninstall()
    handler.addFilter(LevelFilter(level))
    root = logging.getLogger()
    _saved_levels.update({name: logging.getLogger(name or None).level for name in ("", *OWN_LOGGERS)})
    root.addHandler(handler)
    root.setLevel(max(level, THIRD_PARTY_FLOOR))
    for own in OWN_LOGGERS:
        logging.getLogger(own).setLevel(level)
    _handler = handler
    for category, message, _call in QUIET_LIBRARY_WARNINGS:
        warnings.filterwarnings("ignore", message=message, category=category)
    logging.captureWarnings(True)
    _adopted.clear()
    adopt_library_loggers()
    if complaint:
        log.warning(complaint)
    return handler


def uninstall() -> None:
    """Remove the installed handler and restore the levels (tests); warnings print as before.
    (hivemind and transformers keep propagating: their records reach whatever handles the root.)"""
    global _handler
    if _handler is not None:
        logging.getLogger().removeHandler(_handler)
        _handler = None
        logging.captureWarnings(False)
        for name, level in _saved_levels.items():
            logging.getLogger(name or None).setLevel(level)
        _saved_levels.clear()


def to_events(emit: Callable[[Any], None], level: int | None = None) -> logging.Handler:
    """The node worker's handler: records become `Log` events."""
    return install(EventHandler(emit), level)


def installed() -> bool:
    """Whether an entry point has installed the process's handler."""
    return _handler is not None


def to_stderr(
    prefix: str | Callable[[], str] = "", level: int | None = None, stream: TextIO | None = None
) -> logging.Handler:
    """A command-line tool's handler: records become lines on stderr (or `stream`)."""
    return install(LineHandler(prefix, stream), level)


def adopt_library_loggers(load: tuple[str, ...] = ()) -> None:
    """hivemind and transformers, if imported, log through our handler instead of their own.

    Both add a stderr handler to their package logger and stop propagation when first imported;
    called by `install` and again where the node first imports them (a no-op in library use).
    `load` names the libraries to import now (the worker knows it will use them)."""
    if _handler is None:
        return
    floor = max(logging.getLogger().level, THIRD_PARTY_FLOOR)
    for name, adopt in (("hivemind", _adopt_hivemind), ("transformers", _adopt_transformers)):
        if name in _adopted:
            continue
        try:
            if name in load:
                __import__(f"{name}.utils.logging")
            if f"{name}.utils.logging" not in sys.modules:
                continue
            adopt()
        except Exception as e:  # its lines then go to stderr as before: no reason to stop anything
            log.warning(f"{name}'s log lines stay on stderr: {type(e).__name__}: {e}")
        else:
            logging.getLogger(name).setLevel(floor)
        _adopted.add(name)


def _adopt_hivemind() -> None:
    from hivemind.utils.logging import use_hivemind_log_handler

    use_hivemind_log_handler("nowhere")  # drop its handler, propagate to the root logger


def _adopt_transformers() -> None:
    from transformers.utils import logging as hf_logging

    hf_logging.disable_default_handler()
    hf_logging.enable_propagation()


__all__ = [
    "ENV",
    "LEVELS",
    "EventHandler",
    "LevelFilter",
    "LineHandler",
    "add_level_argument",
    "adopt_library_loggers",
    "apply_level_argument",
    "install",
    "installed",
    "level_from_env",
    "level_name",
    "message_of",
    "parse_level",
    "to_events",
    "to_stderr",
    "uninstall",
]
