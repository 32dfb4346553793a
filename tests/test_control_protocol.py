"""The control protocol: every message survives a round trip, bad lines are refused with a
reason, and the modules a GUI imports load none of the heavy libraries."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from sapo_core.control import protocol as P

SAMPLES = [
    P.Start(config={"seed": 3, "round": {"local_groups": 2}}, rounds=4, paused=True),
    P.Pause(),
    P.Pause(after_round=True),
    P.Resume(),
    P.Snooze(seconds=90.0),
    P.SetThrottle(share=0.25),
    P.SetThreads(threads=1),
    P.SetRules(control={"pause_on_battery": True}),
    P.GetStatus(),
    P.Stop(reason="bye"),
    P.Hello(protocol=P.PROTOCOL_VERSION, pid=42, python="3.11.7", package_version="0.1.0"),
    P.NodeInfo(
        model_id="tiny-random",
        sampler="transformers",
        run_dir="/r",
        next_round=3,
        peer_id="QmX",
        node_name="brave-otter",
        visible_maddrs=["/ip4/127.0.0.1/tcp/1/p2p/QmX"],
        join_address="/ip4/x",
    ),
    P.State(state=P.SNOOZED, reason="snoozed until 14:05", round=7, until=1.7e9),
    P.RoundDone(round=7, metrics={"reward/mean": 0.25, "loss/policy": -0.01}),
    P.Progress(round=7, phase="sample", done=10, total=64, info={"step": 1}),
    P.Log(level="info", message="héllo ✓", t=1.0),
    P.Error(message="boom", traceback="Traceback...", kind=P.CONFIG, fatal=True),
    P.Heartbeat(t=1.0, state=P.RUNNING, round=2, cpu_seconds=3.5, rss_bytes=10, throttle=0.5),
    P.Status(
        state=P.PAUSED,
        reason="on battery",
        round=2,
        phase="update",
        throttle=1.0,
        threads=2,
        rules={"active": ["pause_on_battery"]},
        paused_by_user=False,
        snoozed_until=None,
        rule_reason="on battery",
    ),
    P.Exited(returncode=-9, signal="SIGKILL", clean=False, reason="ended by SIGKILL"),
]


@pytest.mark.parametrize("msg", SAMPLES, ids=lambda m: m.type)
def test_round_trip(msg):
    line = P.encode(msg)
    assert line.endswith(b"\n") and line.count(b"\n") == 1
    assert P.decode(line) == msg
    assert P.is_command(msg) != P.is_event(msg)


def test_every_message_type_is_sampled():
    assert {type(m) for m in SAMPLES} == set(P.COMMANDS) | set(P.EVENTS)


def test_non_finite_figures_become_null_and_the_line_is_strict_json():
    line = P.encode(P.RoundDone(round=1, metrics={"a": float("nan"), "b": float("inf"), "c": 1.5}))

    def no_constants(name):
        raise AssertionError(f"non-standard JSON constant {name}")

    body = json.loads(line, parse_constant=no_constants)
    assert body["metrics"] == {"a": None, "b": None, "c": 1.5}


@pytest.mark.parametrize(
    "line, says",
    [
        (b'{"v": 99, "type": "resume"}', "reinstall"),
        (b'{"type": "resume"}', "protocol version"),
        (b'{"v": 1, "type": "explode"}', "unknown message type"),
        (b'{"v": 1, "type": "snooze"}', "snooze"),  # a required field is missing
        (b"not json", "not JSON"),
        (b"[1, 2]", "not a JSON object"),
        (b"\xff\xfe", "not UTF-8"),
    ],
)
def test_bad_lines_are_refused_with_a_reason(line, says):
    with pytest.raises(P.ProtocolError, match=says):
        P.decode(line)


def test_fields_from_a_newer_minor_version_are_ignored():
    msg = P.decode(b'{"v": 1, "type": "snooze", "seconds": 5, "color": "blue"}')
    assert msg == P.Snooze(seconds=5)


def test_oversized_lines_are_refused():
    with pytest.raises(P.ProtocolError, match="exceeds"):
        P.decode(b'{"v": 1}' + b" " * P.MAX_LINE_BYTES)


def test_protocol_and_client_import_nothing_heavy():
    code = (
        "import sys; import sapo_core.control.protocol, sapo_core.control.client, "
        "sapo_core.control.supervisor; "
        "print(','.join(m for m in ('torch', 'transformers', 'llama_cpp', 'hivemind', 'PySide6') "
        "if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""
