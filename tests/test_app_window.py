"""The main window against a real node process (the light test model: tiny-random weights, the
transformers sampler, one group of two 8-token completions per round, swarm off), offscreen.

One node serves the tests of this module in order: a round ends and the plot gains its point;
the buttons send their commands and the state label follows the node; throttle, threads and
rules reach the node and node.toml; the history comes back in a new window; diagnostics; the
events arrive on the GUI thread; closing the window (no tray here) stops the node cleanly.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from PySide6.QtCore import Qt, QThread
from PySide6.QtGui import QGuiApplication

from app.bridge import WorkerBridge
from app.history import store_path
from app.settings import UiSettings, node_config_path
from app.window import MainWindow
from sapo_core.config import NodeConfig, load_config, save_config
from sapo_core.control import protocol as P

from helpers import light_config

pytestmark = [pytest.mark.gui, pytest.mark.node_process, pytest.mark.module_processes]
START_MS = 300_000  # loading even the tiny model takes tens of seconds on a busy 2-core machine
ROUND_MS = 120_000


def tiny_config(run_dir: Path, **changes) -> NodeConfig:
    return light_config(run_dir, max_new_tokens=8, **changes)


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    mp = pytest.MonkeyPatch()
    data = tmp_path_factory.mktemp("window-data")
    mp.setenv("SAPO_DATA_DIR", str(data))
    mp.setenv("SAPO_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "sapo-cache"))
    save_config(tiny_config(data / "run"), data / "node.toml")
    yield data
    mp.undo()


@pytest.fixture(scope="module")
def window(qapp, data_dir):
    w = MainWindow(WorkerBridge(heartbeat_timeout=180), UiSettings(), use_tray=False)
    w.show()
    assert w.start_node()
    yield w
    if w.bridge.running:
        w.bridge.stop_and_wait(timeout=30)
    w.deleteLater()


def state_is(*states: str):
    return lambda ev: ev.state in states


def label_state(w: MainWindow) -> str:
    return w.panel.state_label.property("state")


def test_the_plot_gains_a_point_when_a_round_ends(qtbot, window):
    with qtbot.waitSignal(window.bridge.round_done, timeout=START_MS) as done:
        pass
    ev: P.RoundDone = done.args[0]
    # the tiny model's rounds take about a second: later rounds may land before we look
    qtbot.waitUntil(
        lambda: (
            window.history.last_round >= ev.round and window.dashboard.points("reward:raw") == window.history.rounds
        ),
        timeout=5000,
    )  # redraws are coalesced (100 ms)
    x = list(window.dashboard.curves["reward:raw"].xData)
    y = window.dashboard.curves["reward:raw"].yData
    assert ev.round in x and y[x.index(ev.round)] == pytest.approx(ev.metrics["reward/mean"])
    assert window.dashboard.points("reward:rolling") == window.history.rounds
    assert f"round {ev.round} done" in window.log.text()
    assert label_state(window) == P.RUNNING and "Running" in window.panel.state_label.text()
    assert "tiny-random" in window.panel.resources_label.text()


def test_pause_resume_and_snooze_buttons_drive_the_node_and_the_label(qtbot, window):
    panel = window.panel
    qtbot.waitUntil(lambda: label_state(window) == P.RUNNING, timeout=START_MS)

    with qtbot.waitSignal(window.bridge.state_changed, check_params_cb=state_is(P.PAUSED), timeout=ROUND_MS) as s:
        qtbot.mouseClick(panel.pause_button, Qt.MouseButton.LeftButton)
    assert s.args[0].reason == "paused by you"
    assert label_state(window) == P.PAUSED and "paused by you" in panel.reason_label.text()
    assert panel.resume_button.isEnabled() and not panel.pause_button.isEnabled()
    assert window.settings.get("node/paused_by_user") is True  # a restart of the app stays paused

    with qtbot.waitSignal(window.bridge.state_changed, check_params_cb=state_is(P.RUNNING), timeout=ROUND_MS):
        qtbot.mouseClick(panel.resume_button, Qt.MouseButton.LeftButton)
    assert label_state(window) == P.RUNNING and not panel.resume_button.isEnabled()
    assert window.settings.get("node/paused_by_user") is False

    seen: list[P.Message] = []
    window.bridge.event.connect(seen.append)
    with qtbot.waitSignal(window.bridge.state_changed, check_params_cb=state_is(P.PAUSED), timeout=ROUND_MS) as s:
        qtbot.mouseClick(panel.pause_after_button, Qt.MouseButton.LeftButton)
    window.bridge.event.disconnect(seen.append)
    kinds = [
        e.state if isinstance(e, P.State) else type(e).__name__ for e in seen if isinstance(e, (P.State, P.RoundDone))
    ]
    # it finished its round first: a round that ended while the click was on its way is earlier
    assert P.PAUSING in kinds and "RoundDone" in kinds[kinds.index(P.PAUSING) :], kinds
    assert s.args[0].reason.startswith("paused by you after round")

    with qtbot.waitSignal(window.bridge.state_changed, check_params_cb=state_is(P.SNOOZED), timeout=ROUND_MS) as s:
        lengths = {a.text(): a for a in panel.snooze_button.menu().actions()}
        assert list(lengths) == ["Snooze 15 minutes", "Snooze 1 hour", "Snooze 3 hours", "Snooze 8 hours"]
        lengths["Snooze 3 hours"].trigger()
    assert s.args[0].until is not None and s.args[0].reason.startswith("snoozed until")
    assert label_state(window) == P.SNOOZED and "Snoozed" in panel.state_label.text()
    assert not panel.snooze_button.isEnabled()

    with qtbot.waitSignal(window.bridge.state_changed, check_params_cb=state_is(P.RUNNING), timeout=ROUND_MS):
        qtbot.mouseClick(panel.resume_button, Qt.MouseButton.LeftButton)
    words = [ln.text for ln in window.log.lines if ln.level == "command"]
    assert words == ["pause now", "resume", "pause after this round", "snooze 180 min", "resume"]


def _status(qtbot, window, check) -> P.Status:
    """Ask the node for its status until `check` holds (threads apply at the round's next checkpoint)."""
    got: list[P.Status] = []
    window.bridge.status.connect(got.append)

    def ok() -> bool:
        if got and check(got[-1]):
            return True
        window.bridge.request_status()
        return False

    try:
        qtbot.waitUntil(ok, timeout=ROUND_MS)
    finally:
        window.bridge.status.disconnect(got.append)
    return got[-1]


def test_throttle_threads_and_rules_reach_the_node_and_node_toml(qtbot, window):
    share = window.share
    with qtbot.waitSignal(share.throttle_changed):
        share.throttle_slider.setValue(40)
    status = _status(qtbot, window, lambda s: s.throttle == pytest.approx(0.4))
    assert "40 %" in share.throttle_value.text()

    share.threads_spin.setValue(1)
    with qtbot.waitSignal(share.threads_changed):
        share.threads_spin.editingFinished.emit()
    status = _status(qtbot, window, lambda s: s.threads == 1)

    share.battery_check.setChecked(True)
    share.schedule_edit.setText("daily 00:00-24:00")
    with qtbot.waitSignal(share.rules_changed):
        qtbot.mouseClick(share.apply_button, Qt.MouseButton.LeftButton)
    status = _status(qtbot, window, lambda s: s.rules.get("pause_on_battery") is True)
    assert status.rules["schedule"] == "daily 00:00-24:00" and status.throttle == pytest.approx(0.4)

    saved = load_config(node_config_path())
    assert saved.control.throttle == pytest.approx(0.4) and saved.sampler.threads == 1
    assert saved.control.pause_on_battery and saved.control.schedule == "daily 00:00-24:00"

    share.schedule_edit.setText("someday 25:00")  # refused before it reaches the node
    qtbot.mouseClick(share.apply_button, Qt.MouseButton.LeftButton)
    assert "control.schedule" in share.rules_error.text()
    assert load_config(node_config_path()).control.schedule == "daily 00:00-24:00"


def test_events_arrive_on_the_gui_thread(qtbot, window):
    threads = []
    window.bridge.heartbeat.connect(lambda _ev: threads.append(QThread.currentThread()))
    qtbot.waitUntil(lambda: len(threads) >= 2, timeout=30_000)
    assert all(t is window.thread() for t in threads)


def test_the_history_comes_back_in_a_new_window(qtbot, window):
    qtbot.waitUntil(
        lambda: window.history.rounds >= 2 and store_path(window.saved_config.run_dir).is_file(), timeout=START_MS
    )
    again = MainWindow(WorkerBridge(), UiSettings(), use_tray=False)  # not started: one node per run dir
    try:
        with qtbot.waitSignal(again.loader.loaded, timeout=30_000):
            again.load_history(store_path(window.saved_config.run_dir))
        qtbot.waitUntil(lambda: again.dashboard.points("reward:raw") >= window.history.rounds - 1, timeout=5000)
        n = again.history.rounds
        # the node runs on: the store may hold a round whose event has not reached the window yet
        m = min(n, window.history.rounds)
        assert m >= 2 and (again.history.get("reward/mean")[1][:m] == window.history.get("reward/mean")[1][:m]).all()
        assert again.dashboard.points("reward:raw") == n
    finally:
        again.deleteLater()


def test_copy_diagnostics_gathers_config_state_and_log(qtbot, window):
    window.tabs.setCurrentWidget(window.log_view)
    with qtbot.waitSignal(window.log_view.diagnostics_copied) as copied:
        qtbot.mouseClick(window.log_view.copy_button, Qt.MouseButton.LeftButton)
    text = copied.args[0]
    assert QGuiApplication.clipboard().text() == text
    assert "SAPO Swarm diagnostics" in text and 'name = "tiny-random"' in text
    assert f"node process: pid {window.bridge.last_hello.pid}" in text and "round" in text
    assert "copied" in window.log_view.copied_label.text()


def test_closing_the_window_without_a_tray_stops_the_node(qtbot, window):
    assert window.tray is None and window.bridge.running
    assert not [ln.text for ln in window.log.lines if "crashed" in ln.text]  # one node served the module
    with qtbot.waitSignal(window.bridge.exited, timeout=90_000) as gone:
        window.close()
    assert gone.args[0].clean, gone.args[0]
    qtbot.waitUntil(lambda: not window.isVisible(), timeout=10_000)
    assert not window.bridge.running
    assert os.path.exists(window.settings.path)  # the UI state was written on the way out
