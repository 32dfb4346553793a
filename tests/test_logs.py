"""logs.py: records become the worker's Log events and the CLI's lines; library warnings reach
them, filtered by level; the level switch (SAPO_LOG_LEVEL, --log-level) works.

The worker's handler is tested over a real pipe with the worker's own EventWriter and the
protocol's decoder; tests/test_control_worker.py sees the same events from a real node process
("threads set to 1", the download's lines)."""

from __future__ import annotations

import io
import logging
import os
import time
import warnings

import pytest

from sapo_core import logs
from sapo_core.control import protocol as P
from sapo_core.control.worker import EventWriter


@pytest.fixture(autouse=True)
def clean(monkeypatch):
    monkeypatch.delenv(logs.ENV, raising=False)
    yield
    logs.uninstall()


class Pipe:
    """The worker's event stream: an EventWriter on one end, the protocol's decoder on the other."""

    def __init__(self) -> None:
        read_fd, write_fd = os.pipe()
        self.writer = EventWriter(write_fd)
        self._read = os.fdopen(read_fd, "rb")

    def events(self) -> list[P.Message]:
        self.writer.close()
        return [P.decode(line) for line in self._read]


def test_a_record_becomes_a_log_event_with_its_level_text_and_time():
    pipe = Pipe()
    logs.to_events(pipe.writer.emit)
    logging.getLogger("sapo_core.node").info("model: %s", "tiny-random")
    logging.getLogger("sapo_core.swarm.dht").warning("swarm: LAN discovery is off")
    logging.getLogger("sapo_core.node").debug("not at the default level")
    (info, warning) = pipe.events()
    assert isinstance(info, P.Log) and (info.level, info.message) == ("info", "model: tiny-random")
    assert (warning.level, warning.message) == ("warning", "swarm: LAN discovery is off")
    assert abs(info.t - time.time()) < 60


def test_library_records_and_python_warnings_reach_the_log_at_warning_and_above():
    pipe = Pipe()
    logs.to_events(pipe.writer.emit)
    logging.getLogger("hivemind.p2p").info("connected to 12 peers")  # a library's chatter: filtered
    logging.getLogger("hivemind.p2p").warning("p2pd is slow")
    logging.getLogger("transformers.modeling_utils").error("weights missing")
    with warnings.catch_warnings():
        warnings.simplefilter("always")
        warnings.warn("torch_dtype is deprecated", FutureWarning, stacklevel=1)
    got = [(e.level, e.message) for e in pipe.events()]
    assert got[0] == ("warning", "hivemind: p2pd is slow")
    assert got[1] == ("error", "transformers: weights missing")
    assert got[2][0] == "warning" and "FutureWarning: torch_dtype is deprecated" in got[2][1]
    assert "\n" not in got[2][1] and len(got) == 3


def test_hivemind_and_transformers_give_up_their_own_handlers():
    """The installed libraries, not stand-ins: their package loggers propagate to ours."""
    from hivemind.utils.logging import get_logger as hivemind_logger
    from transformers.utils import logging as hf_logging

    hivemind_logger("hivemind.dht")  # as hivemind's modules do: installs its stderr handler
    hf_logging.get_logger("transformers.x")
    pipe = Pipe()
    logs.to_events(pipe.writer.emit)
    for name in ("hivemind", "transformers"):
        # their own stderr handler is gone (pytest attaches capture handlers of its own to loggers
        # that did not propagate when a test began: subclasses, left alone)
        logger = logging.getLogger(name)
        assert logger.propagate and [h for h in logger.handlers if type(h) is logging.StreamHandler] == []
    hivemind_logger("hivemind.dht").warning("a peer timed out")
    hf_logging.get_logger("transformers.generation").warning("generation flags are not valid")
    got = [e.message for e in pipe.events()]
    assert got == ["hivemind: a peer timed out", "transformers: generation flags are not valid"]


@pytest.mark.parametrize(
    "level, ours, theirs",
    [
        ("debug", ["debug", "info", "warning"], ["warning"]),
        ("info", ["info", "warning"], ["warning"]),
        ("warning", ["warning"], ["warning"]),
        ("error", [], []),
    ],
)
def test_the_level_switch(monkeypatch, level, ours, theirs):
    monkeypatch.setenv(logs.ENV, level.upper())
    pipe = Pipe()
    logs.to_events(pipe.writer.emit)
    for word in ("debug", "info", "warning"):
        getattr(logging.getLogger("sapo_core.node"), word)(f"ours {word}")
        getattr(logging.getLogger("hivemind"), word)(f"theirs {word}")
    expected = [
        line
        for w in ("debug", "info", "warning")
        for line in ([f"ours {w}"] if w in ours else []) + ([f"hivemind: theirs {w}"] if w in theirs else [])
    ]
    assert [e.message for e in pipe.events()] == expected


def test_a_level_that_is_none_says_so_and_keeps_info(monkeypatch):
    monkeypatch.setenv(logs.ENV, "loud")
    pipe = Pipe()
    logs.to_events(pipe.writer.emit)
    logging.getLogger("sapo_core.node").info("still here")
    got = [(e.level, e.message) for e in pipe.events()]
    assert got[0][0] == "warning" and "'loud' is not one of debug, info, warning, error" in got[0][1]
    assert got[1] == ("info", "still here")


def test_the_cli_prints_lines_prefixed_with_the_command_and_sets_the_level_for_its_node(capsys, data_dir):
    """`sapo-node swarms --log-level warning`: the level reaches the environment (a node started
    from here inherits it) and records print on stderr, prefixed with the command."""
    from sapo_core import cli

    assert cli.main(["swarms", "--log-level", "warning"]) == 0
    assert os.environ[logs.ENV] == "warning"
    logging.getLogger("sapo_core.node").info("not shown")
    logging.getLogger("sapo_core.node").warning("drift too high")
    assert capsys.readouterr().err.splitlines() == ["sapo-node swarms: warning: drift too high"]


def test_library_use_configures_nothing():
    """Without an entry point's handler, nothing is installed and the libraries are left alone."""
    assert not logs.installed()
    out = io.StringIO()
    handler = logs.to_stderr(prefix="x: ", stream=out)
    assert logs.installed() and handler in logging.getLogger().handlers
    logs.uninstall()
    assert not logs.installed() and handler not in logging.getLogger().handlers
    logging.getLogger("sapo_core.node").warning("nowhere")
    assert out.getvalue() == ""
