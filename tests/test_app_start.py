"""The app's start on a display whose Qt libraries are missing: Qt would abort the process with the
reason on stderr only, unseen when the app starts from a menu; the app finds it first and says it
in a desktop notification (or a dialog) with the command that fixes it."""

from __future__ import annotations

import os
import time

import app.main as app_main
import sapo_core.commands.doctor as doctor


def test_a_window_that_cannot_open_is_said_in_a_notification_with_the_fix(tmp_path, monkeypatch, capsys):
    # notify-send stands in for the desktop's notification daemon (none runs here): it records
    # what it was asked to show. Which libraries are missing is what ldd finds; that detection
    # runs for real in tests/test_doctor.py against an Xvfb display, here its answer is given.
    bin_dir, said = tmp_path / "bin", tmp_path / "said.txt"
    bin_dir.mkdir()
    tool = bin_dir / "notify-send"
    tool.write_text(f"#!/bin/sh\nprintf '%s\\n' \"$@\" > {said}\n")
    tool.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("DISPLAY", ":99")
    monkeypatch.delenv("WAYLAND_DISPLAY", raising=False)
    monkeypatch.delenv("QT_QPA_PLATFORM", raising=False)
    monkeypatch.setattr(
        doctor, "missing_platform_libraries", lambda platform: ["libxcb-icccm.so.4", "libxcb-cursor.so.0"]
    )
    assert app_main.main([]) == 1
    for _ in range(50):
        if said.exists() and said.read_text():
            break
        time.sleep(0.1)
    shown = said.read_text()
    assert "--urgency=critical" in shown and "cannot open its window" in shown
    assert "sudo apt install libxcb-icccm4 libxcb-cursor0" in shown and "sapo-node run" in shown
    assert "cannot open its window" in capsys.readouterr().err  # and on stderr, for a terminal


def test_nothing_missing_says_nothing(monkeypatch):
    monkeypatch.setenv("DISPLAY", ":99")
    monkeypatch.delenv("QT_QPA_PLATFORM", raising=False)
    monkeypatch.delenv("WAYLAND_DISPLAY", raising=False)
    monkeypatch.setattr(doctor, "missing_platform_libraries", lambda platform: [])
    assert app_main.display_problem() == ""
    monkeypatch.setenv("QT_QPA_PLATFORM", "offscreen")  # no display to open a window on: nothing to check
    monkeypatch.setattr(doctor, "missing_platform_libraries", lambda platform: ["libxcb-icccm.so.4"])
    assert app_main.display_problem() == ""
