"""The volunteer's rules: each one pauses with its reason and lets the node run again, in-process
with readings built by hand, and in a real node process with the OS boundary faked by file."""

from __future__ import annotations

import json
import os
from dataclasses import replace
from datetime import datetime
from pathlib import Path

import pytest

from sapo_core.config import ControlConfig, NodeConfig
from sapo_core.control import protocol as P
from sapo_core.control.client import NodeClient
from sapo_core.control.rules import GB, Rules
from sapo_core.control.system import FAKE_ENV, SystemReading

from helpers import light_config

WEDNESDAY_NOON = datetime(2026, 11, 25, 12, 0)
CALM = SystemReading(
    now=WEDNESDAY_NOON,
    on_battery=False,
    battery_percent=90.0,
    idle_seconds=3600.0,
    other_cpu_percent=2.0,
    temperature_c=50.0,
    free_memory_bytes=16 * GB,
)


def test_no_rules_never_pause():
    rules = Rules(ControlConfig())
    hot = replace(CALM, on_battery=True, idle_seconds=0.0, temperature_c=99.0, free_memory_bytes=1)
    assert rules.check(hot, 0.0) is None
    assert rules.active == []


def test_battery():
    rules = Rules(ControlConfig(pause_on_battery=True))
    assert rules.check(replace(CALM, on_battery=True, battery_percent=54.4), 0) == "on battery (54 %)"
    assert rules.check(CALM, 1) is None
    assert rules.check(replace(CALM, on_battery=None, battery_percent=None), 2) is None  # no battery here


def test_schedule_names_itself_and_the_next_start():
    rules = Rules(ControlConfig(schedule="mon-fri 18:00-08:00"))
    reason = rules.check(CALM, 0)
    assert reason == "outside schedule (mon-fri 18:00-08:00; runs again Wed 18:00)"
    assert rules.check(replace(CALM, now=datetime(2026, 11, 25, 19, 0)), 1) is None


def test_temperature_has_hysteresis():
    rules = Rules(ControlConfig(max_temperature_c=80))
    assert rules.check(replace(CALM, temperature_c=79.0), 0) is None
    assert rules.check(replace(CALM, temperature_c=85.0), 1).startswith("CPU at 85 °C, limit 80 °C")
    assert rules.check(replace(CALM, temperature_c=78.0), 2) is not None  # below the limit, not yet cool
    assert rules.check(replace(CALM, temperature_c=75.0), 3) is None
    assert rules.check(replace(CALM, temperature_c=None), 4) is None  # no sensors: the rule cannot act


def test_memory_has_hysteresis():
    rules = Rules(ControlConfig(min_free_memory_gb=4))
    assert rules.check(replace(CALM, free_memory_bytes=int(3.5 * GB)), 0) == "free memory 3.5 GB, below 4 GB"
    assert rules.check(replace(CALM, free_memory_bytes=int(4.1 * GB)), 1) is not None
    assert rules.check(replace(CALM, free_memory_bytes=int(4.5 * GB)), 2) is None


def test_idle_by_input_time():
    rules = Rules(ControlConfig(only_when_idle=True, idle_minutes=5))
    assert (
        rules.check(replace(CALM, idle_seconds=10.0), 0)
        == "you are using the computer (runs after 5 min without input)"
    )
    assert rules.check(replace(CALM, idle_seconds=299.0), 1) is not None
    assert rules.check(replace(CALM, idle_seconds=300.0), 2) is None
    assert rules.check(replace(CALM, idle_seconds=1.0), 3) is not None  # any input pauses at once


def test_idle_by_cpu_use_waits_for_a_calm_period_and_does_not_flap():
    rules = Rules(ControlConfig(only_when_idle=True, idle_minutes=1, idle_cpu_percent=25))
    no_input = replace(CALM, idle_seconds=None)
    assert rules.check(replace(no_input, other_cpu_percent=None), 0) == "waiting to see whether the computer is in use"
    assert "other programs are using the CPU (80 %" in rules.check(replace(no_input, other_cpu_percent=80.0), 1)
    assert rules.check(replace(no_input, other_cpu_percent=5.0), 2) is not None  # calm from t=2
    assert rules.check(replace(no_input, other_cpu_percent=5.0), 61) is not None
    assert rules.check(replace(no_input, other_cpu_percent=5.0), 62) is None  # 60 s calm
    assert rules.check(replace(no_input, other_cpu_percent=10.0), 63) is None  # below the limit: still runs
    assert rules.check(replace(no_input, other_cpu_percent=90.0), 64) is not None  # busy again: pause at once
    assert rules.check(replace(no_input, other_cpu_percent=5.0), 100) is not None  # the wait starts over


def test_a_holding_rule_keeps_its_words_while_the_reading_moves():
    rules = Rules(ControlConfig(pause_on_battery=True, max_temperature_c=80))
    first = rules.check(replace(CALM, on_battery=True, battery_percent=41.0), 0)
    assert rules.check(replace(CALM, on_battery=True, battery_percent=40.0), 1) == first == "on battery (41 %)"
    hot = rules.check(replace(CALM, temperature_c=90.0), 2)  # another situation: new words
    assert hot.startswith("CPU at 90 °C")
    assert rules.check(replace(CALM, temperature_c=88.0), 3) == hot


def test_first_reason_wins_in_a_fixed_order():
    rules = Rules(ControlConfig(pause_on_battery=True, max_temperature_c=60, only_when_idle=True))
    both = replace(CALM, on_battery=True, temperature_c=70.0, idle_seconds=0.0)
    assert rules.check(both, 0).startswith("on battery")
    assert rules.check(replace(both, on_battery=False), 1).startswith("CPU at 70")
    assert rules.active == ["pause_on_battery", "max_temperature_c", "only_when_idle"]


# --- a real node process, the OS faked at its boundary only -------------------------------------


def _tiny(run_dir: Path, **changes) -> NodeConfig:
    return light_config(run_dir, **{"train.kl_beta": 0.01, "train.steps_per_round": 1, "sampler.threads": 1, **changes})


@pytest.mark.node_process
def test_each_rule_pauses_a_real_node_with_its_reason_and_lets_it_resume(tmp_path, tmp_path_factory):
    """Battery, schedule, temperature, memory, input idle time, and the CPU-use fallback: each faked
    through SAPO_FAKE_SYSTEM, the node process reads it through its real rules thread."""
    machine = tmp_path / "machine.json"

    def fake(**readings) -> None:
        tmp = machine.with_suffix(".tmp")
        tmp.write_text(
            json.dumps(
                {
                    "on_battery": False,
                    "idle_seconds": 3600,
                    "temperature_c": 50,
                    "free_memory_bytes": 16 * GB,
                    "now": "2026-11-25T12:00:00",
                    **readings,
                }
            )
        )
        os.replace(tmp, machine)

    fake()
    env = {
        **os.environ,
        "SAPO_DATA_DIR": str(tmp_path / "data"),
        "SAPO_CACHE_DIR": str(tmp_path_factory.getbasetemp() / "sapo-cache"),
        FAKE_ENV: str(machine),
    }
    control = ControlConfig(pause_on_battery=True, check_seconds=0.1)
    client = NodeClient(env=env)
    client.start(_tiny(tmp_path / "run", **{"control.pause_on_battery": True, "control.check_seconds": 0.1}))
    try:
        client.wait_state(P.RUNNING, timeout=300)
        cases = [
            (control, {"on_battery": True, "battery_percent": 40}, "on battery (40 %)", {}),
            (
                replace(control, pause_on_battery=False, schedule="mon-fri 18:00-08:00"),
                {},
                "outside schedule (mon-fri 18:00-08:00; runs again Wed 18:00)",
                {"now": "2026-11-25T18:30:00"},
            ),
            (
                replace(control, pause_on_battery=False, max_temperature_c=80),
                {"temperature_c": 91},
                "CPU at 91 °C",
                {"temperature_c": 60},
            ),
            (
                replace(control, pause_on_battery=False, min_free_memory_gb=4),
                {"free_memory_bytes": GB},
                "free memory 1.0 GB, below 4 GB",
                {},
            ),
            (
                replace(control, pause_on_battery=False, only_when_idle=True, idle_minutes=0.02),
                {"idle_seconds": 0.5},
                "you are using the computer",
                {},
            ),
            (
                replace(control, pause_on_battery=False, only_when_idle=True, idle_minutes=0.02),
                {"idle_seconds": None, "other_cpu_percent": 90},
                "other programs are using the CPU (90 %",
                {"idle_seconds": None, "other_cpu_percent": 3},
            ),
        ]
        for rules, pausing, reason, calm in cases:
            client.set_rules(rules)
            fake(**pausing)
            paused = client.wait_for(lambda e: isinstance(e, P.State) and e.state == P.PAUSED, timeout=60)
            assert paused.reason.startswith(reason), paused
            fake(**calm)
            resumed = client.wait_state(P.RUNNING, timeout=60)
            assert resumed.reason == f"resumed (was: {paused.reason})"
        client.wait_for(lambda e: isinstance(e, P.RoundDone), timeout=120)  # and it still trains
    finally:
        assert client.stop(timeout=60) == P.EXIT_OK
