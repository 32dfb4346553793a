"""The OS boundary: the real probe reads this machine; the fake file replaces readings and only them."""

from __future__ import annotations

import json
from datetime import datetime

from sapo_core.control.system import FAKE_ENV, FakeFileProbe, SystemProbe, SystemReading, probe_from_env


def test_real_probe_reads_this_machine():
    probe = SystemProbe()
    first = probe.read()
    second = probe.read()
    assert isinstance(first, SystemReading)
    assert abs((datetime.now() - second.now).total_seconds()) < 60
    assert second.free_memory_bytes is not None and second.free_memory_bytes > 0
    assert first.on_battery in (None, True, False)
    assert second.idle_seconds is None or second.idle_seconds >= 0
    assert second.temperature_c is None or -50 < second.temperature_c < 150
    # CPU use of others needs two readings some time apart; when known it is a percentage
    assert second.other_cpu_percent is None or 0 <= second.other_cpu_percent <= 100


def test_fake_file_replaces_only_what_it_names(tmp_path, monkeypatch):
    path = tmp_path / "machine.json"
    path.write_text(
        json.dumps({"on_battery": True, "idle_seconds": None, "now": "2026-11-25T12:00:00", "not_a_reading": 1})
    )
    monkeypatch.setenv(FAKE_ENV, str(path))
    probe = probe_from_env()
    assert isinstance(probe, FakeFileProbe)
    r = probe.read()
    assert r.on_battery is True and r.idle_seconds is None and r.now == datetime(2026, 11, 25, 12)
    assert r.free_memory_bytes and r.free_memory_bytes > 0  # real
    path.write_text("{half a file")  # being rewritten: the real reading stands in
    assert probe.read().now != datetime(2026, 11, 25, 12)


def test_without_the_variable_the_probe_is_real(monkeypatch):
    monkeypatch.delenv(FAKE_ENV, raising=False)
    assert isinstance(probe_from_env(), SystemProbe)
