"""The status panel's and the tray's controls follow the state: Run anyway while a rule holds,
Pause now not while paused, Start from the tray after an error, the tray icon per state."""

from __future__ import annotations

import pytest

from app.models import NodeStatus
from sapo_core.control import protocol as P

pytestmark = pytest.mark.gui


def _status(state: str, reason: str = "") -> NodeStatus:
    s = NodeStatus()
    s.apply(P.State(state=state, reason=reason, round=3))
    return s


def test_panel_offers_run_anyway_only_while_a_rule_holds(qtbot):
    from app.controls import RUN_ANYWAY_SECONDS, StatusPanel

    panel = StatusPanel()
    qtbot.addWidget(panel)
    panel.show()
    panel.refresh(_status(P.PAUSED, "on battery power"))
    assert panel.run_anyway_button.isVisible() and not panel.resume_button.isEnabled()
    assert not panel.pause_button.isEnabled()  # paused already
    with qtbot.waitSignal(panel.run_anyway_requested) as sig:
        panel.run_anyway_button.click()
    assert sig.args == [RUN_ANYWAY_SECONDS]
    panel.refresh(_status(P.PAUSED, "paused by you"))
    assert not panel.run_anyway_button.isVisible() and panel.resume_button.isEnabled()
    assert not panel.pause_button.isEnabled()
    panel.refresh(_status(P.RUNNING))
    assert panel.pause_button.isEnabled() and not panel.run_anyway_button.isVisible()


def test_tray_starts_after_an_error_and_its_icon_follows_the_state(qtbot):
    from app.tray import TrayIcon
    from app.window import app_icon

    tray = TrayIcon(app_icon())
    tray.refresh(_status(P.RUNNING))
    running = tray.icon.icon().pixmap(32, 32).toImage()
    assert not tray.start_action.isVisible() and tray.state_action.isEnabled()
    tray.refresh(_status(P.CRASHED, "model not found"))
    assert tray.start_action.isVisible() and "model not found" in tray.state_action.text()
    assert tray.icon.icon().pixmap(32, 32).toImage() != running
    with qtbot.waitSignal(tray.start_requested):
        tray.start_action.trigger()
    with qtbot.waitSignal(tray.snooze_requested) as sig:
        tray.snooze_menu.actions()[0].trigger()
    assert sig.args == [900.0]
    tray.hide()


def test_panel_shows_the_model_download_then_the_first_round(qtbot):
    """First start: the download's MB, per cent and time left on the status line and the bar
    (state still Starting, no round 0 or 1 said); once the node runs, a round's progress replaces it."""
    from app.controls import StatusPanel

    panel = StatusPanel()
    qtbot.addWidget(panel)
    panel.show()
    s = NodeStatus()
    info = {"model": "SmolLM2-360M-Instruct", "size_bytes": 386_404_992, "host": "huggingface.co"}
    for ev in (
        P.Hello(protocol=P.PROTOCOL_VERSION, pid=1),
        P.State(state=P.STARTING, reason="loading the model"),
        P.Progress(
            round=0,
            phase="download",
            done=120_000_000,
            total=386_404_992,
            info={**info, "bytes_per_s": 2_000_000, "eta_s": 133.2},
        ),
    ):
        s.apply(ev)
    panel.refresh(s)
    text = "Downloading SmolLM2-360M-Instruct: 120 of 386 MB (31 %), about 2 min left"
    assert panel.reason_label.text() == text
    assert panel.state_label.property("state") == P.STARTING and "Starting" in panel.state_label.text()
    assert "round" not in panel.reason_label.text().lower() and "round" not in panel.resources_label.text()
    bar = panel.progress
    assert (bar.minimum(), bar.maximum(), bar.value()) == (0, 1000, 311)
    assert bar.accessibleName() == "Model download progress" and bar.accessibleDescription() == text
    # all here: verified and loading (the bar full, not busy)
    s.apply(P.Progress(round=0, phase="download", done=386_404_992, total=386_404_992, info=info))
    panel.refresh(s)
    assert panel.reason_label.text() == "Downloaded SmolLM2-360M-Instruct (386 MB); checking and loading it"
    assert (bar.maximum(), bar.value()) == (1000, 1000)
    # the node is up and the first round samples: the round's figures, the download gone
    for ev in (
        P.NodeInfo(model_id="smollm2-360m-instruct", sampler="llamacpp", run_dir="/tmp/r", next_round=1),
        P.State(state=P.RUNNING, round=1),
        P.Progress(round=1, phase="sample", done=5, total=16),
    ):
        s.apply(ev)
    panel.refresh(s)
    assert panel.reason_label.text() == "round 1: sampling 5 of 16 tokens"
    assert (bar.minimum(), bar.maximum(), bar.value()) == (0, 16, 5)
    assert bar.accessibleName() == "Round progress"


def test_a_failed_download_says_so_and_the_bar_waits(qtbot):
    from app.controls import StatusPanel

    panel = StatusPanel()
    qtbot.addWidget(panel)
    s = NodeStatus()
    s.apply(P.State(state=P.STARTING, reason="loading the model"))
    s.apply(
        P.Progress(
            round=0,
            phase="download",
            done=0,
            total=0,
            info={"model": "Qwen3-0.6B", "failed": "ConnectError: connection refused"},
        )
    )
    panel.refresh(s)
    assert panel.reason_label.text() == "Could not download Qwen3-0.6B: ConnectError: connection refused"
    assert (panel.progress.minimum(), panel.progress.maximum()) == (0, 0)  # busy: the fallback model loads
