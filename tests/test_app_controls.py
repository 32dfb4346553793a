"""The status panel's and the tray's controls follow the state: Run anyway while a rule holds,
Pause now not while paused, Start from the tray after an error, the tray icon per state."""

from __future__ import annotations

import pytest

from sapo_core.control import protocol as P

from app.models import NodeStatus

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
