"""NodeSupervisor with real node processes: a killed node comes back after its backoff, still
paused if the volunteer had paused it, with the crash kept; a node that cannot run as configured
is not restarted; after too many crashes in a row it gives up and says so."""

from __future__ import annotations

import os
import signal
import sys

import pytest

from sapo_core.config import NodeConfig
from sapo_core.control import protocol as P
from sapo_core.control.supervisor import NodeSupervisor

from helpers import light_config

pytestmark = [
    pytest.mark.node_process,
    pytest.mark.skipif(sys.platform == "win32", reason="kills nodes with POSIX signals"),
]

START = 300


def tiny(tmp_path, **changes) -> NodeConfig:
    return light_config(tmp_path / "run", **changes)


def test_a_killed_node_is_restarted_with_the_volunteers_controls(env, tmp_path):
    sup = NodeSupervisor(env=env, backoff_first=0.5)
    sup.start(tiny(tmp_path))
    try:
        sup.wait_for(lambda e: isinstance(e, P.RoundDone), START)
        sup.set_throttle(0.5)
        sup.pause()
        sup.wait_state(P.PAUSED, timeout=60)
        first = sup.client.pid
        os.kill(first, signal.SIGKILL)
        crashed = sup.wait_state(P.CRASHED, timeout=60)
        assert "SIGKILL" in crashed.reason
        note = sup.wait_for(lambda e: isinstance(e, P.Log) and "restarting in" in e.message, 30)
        assert "crash 1 in a row" in note.message
        sup.wait_for(lambda e: isinstance(e, P.Hello), 60)
        info = sup.wait_for(lambda e: isinstance(e, P.NodeInfo), START)
        assert info.next_round >= 2  # from the checkpoint
        paused = sup.wait_state(P.PAUSED, timeout=60)
        assert paused.reason == "paused by you"  # the restart did not unpause it
        assert sup.client.pid != first and sup.restarts == 1
        assert [c.signal for c in sup.crashes] == ["SIGKILL"]
        sup.request_status()
        status = sup.wait_for(lambda e: isinstance(e, P.Status), 30)
        assert status.throttle == 0.5
        sup.resume()
        sup.wait_for(lambda e: isinstance(e, P.RoundDone) and e.round == info.next_round, START)
    finally:
        assert sup.stop(timeout=60) == P.EXIT_OK


def test_a_node_that_cannot_run_as_configured_is_not_restarted(env, tmp_path):
    sup = NodeSupervisor(env=env, backoff_first=0.1)
    sup.start(tiny(tmp_path, **{"model.name": "no-such-model"}))
    gave_up = sup.wait_for(
        lambda e: isinstance(e, P.State) and e.state == P.CRASHED and "not restarting" in e.reason, START
    )
    assert "no-such-model" in gave_up.reason
    assert sup.gave_up and sup.restarts == 0 and sup.last_crash.returncode == P.EXIT_CONFIG


def test_it_gives_up_after_too_many_crashes_in_a_row(env, tmp_path):
    sup = NodeSupervisor(env=env, backoff_first=0.1, max_restarts=1)
    sup.start(tiny(tmp_path))
    for _ in range(2):
        sup.wait_for(lambda e: isinstance(e, P.Heartbeat), START)
        os.kill(sup.client.pid, signal.SIGKILL)
        sup.wait_for(lambda e: isinstance(e, P.Exited), 60)
    final = sup.wait_state(P.CRASHED, timeout=30)
    while "gave up" not in final.reason:
        final = sup.wait_state(P.CRASHED, timeout=30)
    assert "gave up after 1 restart in a row" in final.reason
    assert sup.gave_up and sup.restarts == 1 and len(sup.crashes) == 2
