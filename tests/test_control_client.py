"""NodeClient's lifecycle against real processes: staged stop of a stuck node (ask, terminate,
kill), a silent node caught by the heartbeat watchdog, a node that cannot run as configured, the
crash reason kept for the user, and a process that is not a node at all."""

from __future__ import annotations

import os
import signal
import sys

import pytest

from sapo_core.config import NodeConfig
from sapo_core.control import protocol as P
from sapo_core.control.client import NodeClient, NodeStartError

from helpers import light_config

pytestmark = [
    pytest.mark.node_process,
    pytest.mark.skipif(sys.platform == "win32", reason="SIGSTOP stands in for a hung node"),
]

START = 300


def tiny(tmp_path, **changes) -> NodeConfig:
    return light_config(tmp_path / "run", **changes)


def test_a_stuck_node_is_terminated_then_killed(env, tmp_path):
    client = NodeClient(env=env, heartbeat_timeout=None)
    client.start(tiny(tmp_path))
    client.wait_state(P.RUNNING, timeout=START)
    os.kill(client.pid, signal.SIGSTOP)  # hung: reads no command, handles no SIGTERM
    code = client.stop(timeout=2, terminate_timeout=2)
    assert code == -signal.SIGKILL
    assert client.crash is not None
    assert "did not stop within 2 s nor on SIGTERM: killed" in client.crash.reason
    crashed = client.wait_state(P.CRASHED, timeout=10)
    assert crashed.reason == client.crash.reason


def test_a_silent_node_is_caught_by_the_heartbeat_watchdog(env, tmp_path):
    client = NodeClient(env=env, heartbeat_timeout=3)
    client.start(tiny(tmp_path))
    client.wait_for(lambda e: isinstance(e, P.Heartbeat), START)
    os.kill(client.pid, signal.SIGSTOP)
    crashed = client.wait_state(P.CRASHED, timeout=60)
    assert "no heartbeat for" in crashed.reason and "hung" in crashed.reason
    assert not client.alive


def test_a_node_that_cannot_run_says_why_and_exits_with_the_config_code(env, tmp_path):
    client = NodeClient(env=env)
    client.start(tiny(tmp_path, **{"model.name": "no-such-model"}))
    err = client.wait_for(lambda e: isinstance(e, P.Error), START)
    assert err.kind == P.CONFIG and err.fatal and "no-such-model" in err.message and err.traceback
    exited = client.wait_for(lambda e: isinstance(e, P.Exited), 60)
    assert exited.returncode == P.EXIT_CONFIG and not exited.clean
    assert client.crash.last_error == err.message
    assert client.crash.reason.startswith(err.message) and "exited with code 2" in client.crash.reason


def test_a_native_crash_is_reported_with_its_signal_and_the_tail_of_stderr(env, tmp_path):
    client = NodeClient(env=env)
    client.start(tiny(tmp_path))
    client.wait_state(P.RUNNING, timeout=START)
    os.kill(client.pid, signal.SIGSEGV)  # what a fault in llama.cpp's C code does to the node
    exited = client.wait_for(lambda e: isinstance(e, P.Exited), 60)
    assert not exited.clean and exited.signal == "SIGSEGV"
    report = client.crash
    assert report.signal == "SIGSEGV"
    assert report.reason == "the node ended by SIGSEGV: Fatal Python error: Segmentation fault"
    assert any(line.startswith(("Thread 0x", "Current thread")) for line in report.stderr_tail)  # the stacks


def test_a_process_speaking_another_protocol_is_refused(env, tmp_path):
    """A stand-in for a node from another install (none exists here): its hello has version 99."""
    other = tmp_path / "python"
    other.write_text('#!/bin/sh\necho \'{"v": 99, "type": "hello", "protocol": 99, "pid": 1}\'\nsleep 30\n')
    other.chmod(0o755)
    client = NodeClient(env=env, python=str(other))
    with pytest.raises(NodeStartError, match="reinstall"):
        client.start(tiny(tmp_path), hello_timeout=20)
    assert not client.alive


def test_the_inbox_keeps_the_newest_events_when_nobody_reads_it():
    from sapo_core.control.client import EventInbox

    inbox = EventInbox(maxlen=3)
    for i in range(5):
        inbox.put(P.Log(level="info", message=str(i)))
    assert [inbox.next_event(0).message for _ in range(3)] == ["2", "3", "4"]
    assert inbox.next_event(0.01) is None
