"""Around the main window: the setup wizard with this machine's real hardware scan, settings that
survive a restart of the window, a node that cannot run shown as a message, a broken settings
file, one instance per data directory, `sapo-swarm` without a display, and the screenshots.
Real parts throughout (the scan and the nodes are real child processes), offscreen."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from PySide6.QtCore import QPoint, Qt
from PySide6.QtGui import QColor, QImage

from app.bridge import WorkerBridge
from app.settings import UiSettings, node_config_path
from app.single import SingleInstance
from app.window import MainWindow
from app.wizard import SetupWizard
from sapo_core.config import NodeConfig, load_config, save_config
from sapo_core.control import protocol as P

from helpers import light_config

pytestmark = pytest.mark.gui
PEER = "/ip4/203.0.113.5/tcp/31337/p2p/QmYyQSo1c1Ym7orWxLYvCrM2EmxFTANf8wXmmE7DWjhx5N"
START_MS = 300_000


@pytest.fixture
def data(tmp_path, tmp_path_factory, monkeypatch):
    monkeypatch.setenv("SAPO_DATA_DIR", str(tmp_path / "data"))
    monkeypatch.setenv("SAPO_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "sapo-cache"))
    (tmp_path / "data").mkdir()
    return tmp_path / "data"


def tiny(data: Path, **changes) -> NodeConfig:
    return light_config(data / "run", max_new_tokens=8, **changes)


def test_the_wizard_scans_recommends_and_joins(qtbot, data):
    wizard = SetupWizard()
    qtbot.addWidget(wizard)
    with qtbot.waitSignal(wizard.scanner.finished, timeout=180_000) as scanned:
        wizard.show()
    report = scanned.args[0]
    item = wizard.models.currentItem()
    assert item.data(0, Qt.ItemDataRole.UserRole) == report.recommended and "★" in item.text(0)
    assert report.recommended_reason in wizard.scan_label.text() and " GB" in item.text(5)
    assert wizard.models.topLevelItemCount() == len(report.models)
    # the embedded model: its parameters, its licence, already here, and the whole why under the list
    assert item.text(2) == "135 M" and item.text(6) == "apache-2.0" and item.text(3) == "included"
    assert "about" in wizard.model_note.text() and "rounds per hour" in wizard.model_note.text()
    # sorted by usefulness: everything that fits comes first
    verdicts = [wizard.models.topLevelItem(i).text(1) for i in range(wizard.models.topLevelItemCount())]
    assert verdicts == sorted(verdicts, key=["fits", "slow", "doesn't fit"].index)

    qtbot.mouseClick(wizard.next_button, Qt.MouseButton.LeftButton)
    # on the radio's circle, where a user clicks (its centre is empty space: the button spans the page)
    qtbot.mouseClick(wizard.join_radio, Qt.MouseButton.LeftButton, pos=QPoint(8, wizard.join_radio.height() // 2))
    assert not wizard.next_button.isEnabled() and "invite address" in wizard.address_problem.text()
    wizard.address_edit.setText(PEER)
    assert wizard.next_button.isEnabled()
    qtbot.mouseClick(wizard.next_button, Qt.MouseButton.LeftButton)
    wizard.throttle_slider.setValue(30)
    assert wizard.join_button.text() == "Join" and "30%" in wizard.summary_label.text()
    with qtbot.waitSignal(wizard.joined) as joined:
        qtbot.mouseClick(wizard.join_button, Qt.MouseButton.LeftButton)
    cfg = joined.args[0]
    assert cfg.model.name == report.recommended and cfg.swarm.initial_peers == [PEER] and cfg.swarm.enabled
    assert cfg.control.throttle == pytest.approx(0.3)


def test_the_wizard_measures_this_computer_while_the_first_page_is_read(qtbot, data, tmp_path, monkeypatch):
    """No probe cached: after the scan the wizard runs the real one (two rounds of the embedded
    model) and shows rounds per hour from it, not the formula's guess; the user's pick stays."""
    monkeypatch.setenv("SAPO_CACHE_DIR", str(tmp_path / "fresh-cache"))  # nothing measured yet
    wizard = SetupWizard()
    qtbot.addWidget(wizard)
    with qtbot.waitSignal(wizard.scanner.finished, timeout=180_000) as scanned:
        wizard.show()
    assert not scanned.args[0].measured and wizard.measure_label.isVisible()
    assert "Measuring this computer" in wizard.measure_label.text()
    guessed = {m.id: m.rounds_per_hour for m in scanned.args[0].models}
    items = [wizard.models.topLevelItem(i) for i in range(wizard.models.topLevelItemCount())]
    other = next(i for i in items if i.data(0, Qt.ItemDataRole.UserRole) != scanned.args[0].recommended)
    wizard.models.setCurrentItem(other)  # the user's own pick, which the measured figures keep
    picked = other.data(0, Qt.ItemDataRole.UserRole)
    with qtbot.waitSignal(wizard.measurer.finished, timeout=600_000) as measured:
        pass
    report = measured.args[0]
    assert report.measured and report.probe["round_seconds"] > 0
    assert not list((tmp_path / "fresh-cache").glob("eval/base-*.json"))  # two rounds, no held-out evaluation
    assert "Measured on this computer" in wizard.measure_label.text() and not wizard.scan_busy.isVisible()
    shown = {
        wizard.models.topLevelItem(i).data(0, Qt.ItemDataRole.UserRole): wizard.models.topLevelItem(i).text(4)
        for i in range(wizard.models.topLevelItemCount())
    }
    assert shown == {m.id: f"{m.rounds_per_hour:.0f}" for m in report.models}  # the measured figures
    assert shown != {k: f"{v:.0f}" for k, v in guessed.items()}  # not the guess
    assert wizard.models.currentItem().data(0, Qt.ItemDataRole.UserRole) == picked
    assert wizard.machine_form.rowCount() == len(report.machine)  # redrawn, not doubled
    wizard.close()


def test_settings_survive_a_restart_of_the_window(qtbot, data):
    save_config(tiny(data), data / "node.toml")
    first = MainWindow(WorkerBridge(), UiSettings(), use_tray=False)
    qtbot.addWidget(first)
    screen = first.screen().availableGeometry()  # restoreGeometry fits a window to its screen
    first.resize(screen.width() - 50, screen.height() - 60)
    first.show()
    first.tabs.setCurrentIndex(2)
    first.dashboard.window_spin.setValue(35)
    first.share.throttle_slider.setValue(30)
    first.share.threads_spin.setValue(1)
    first.share.threads_spin.editingFinished.emit()
    first.share.idle_check.setChecked(True)
    qtbot.mouseClick(first.share.apply_button, Qt.MouseButton.LeftButton)
    first.save_ui()
    size = first.size()

    second = MainWindow(WorkerBridge(), UiSettings(), use_tray=False)
    qtbot.addWidget(second)
    assert second.tabs.currentIndex() == 2 and second.dashboard.window == 35
    assert second.dashboard.window_spin.value() == 35 and second.size() == size
    assert second.share.throttle_slider.value() == 30 and second.share.threads_spin.value() == 1
    assert second.share.idle_check.isChecked()
    saved = load_config(node_config_path())  # what `sapo-node run` would read
    assert saved.control.throttle == pytest.approx(0.3) and saved.control.only_when_idle and saved.sampler.threads == 1


@pytest.mark.node_process
def test_a_node_that_cannot_run_shows_a_readable_message(qtbot, data):
    save_config(tiny(data, **{"model.name": "no-such-model"}), data / "node.toml")
    window = MainWindow(WorkerBridge(), UiSettings(), use_tray=False)
    qtbot.addWidget(window)
    window.show()
    with qtbot.waitSignal(window.bridge.error, timeout=START_MS) as err:
        assert window.start_node()
    assert err.args[0].kind == P.CONFIG and "no-such-model" in err.args[0].message
    assert window.banner.isVisible()
    assert "cannot run with these settings" in window.banner.text and "no-such-model" in window.banner.text
    qtbot.waitUntil(lambda: window.panel.state_label.property("state") == P.CRASHED, timeout=60_000)
    qtbot.waitUntil(lambda: not window.bridge.running, timeout=60_000)  # not restarted: settings must change
    assert window.panel.start_button.isVisible() and not window.panel.pause_button.isEnabled()
    assert any(line.level == "error" and "no-such-model" in line.text for line in window.log.lines)


def test_a_broken_settings_file_is_named_and_nothing_starts(qtbot, data):
    (data / "node.toml").write_text("[model\nname = 'x'\n")
    window = MainWindow(WorkerBridge(), UiSettings(), use_tray=False)
    qtbot.addWidget(window)
    window.show()
    assert not window.start_node() and not window.bridge.running and window.bridge.node is None
    assert "settings file cannot be used" in window.banner.text and "not valid TOML" in window.banner.text


def test_one_instance_per_data_directory(qtbot, tmp_path):
    first = SingleInstance(tmp_path)
    assert first.acquire()
    try:
        with qtbot.waitSignal(first.activated, timeout=10_000):
            assert not SingleInstance(tmp_path).acquire()  # asks the first to show its window
        other = SingleInstance(tmp_path / "elsewhere")  # another data directory is another node
        assert other.acquire()
        other.release()
    finally:
        first.release()
    again = SingleInstance(tmp_path)
    assert again.acquire()
    again.release()


@pytest.mark.node_process
def test_without_a_display_it_says_so_and_runs_the_node_headless(data):
    save_config(tiny(data, **{"model.name": "no-such-model"}), data / "node.toml")
    env = {k: v for k, v in os.environ.items() if k not in ("DISPLAY", "WAYLAND_DISPLAY", "QT_QPA_PLATFORM")}
    if sys.platform != "linux":
        pytest.skip("the no-display fallback is for Linux desktops")
    out = subprocess.run([sys.executable, "-m", "app.main"], env=env, capture_output=True, text=True, timeout=600)
    assert "no display found" in out.stdout and "running the node headless" in out.stdout
    assert out.returncode == 2 and "no-such-model" in out.stdout + out.stderr  # sapo-node run's exit for config


def test_screenshots_of_every_screen(tmp_path, data):
    shots = tmp_path / "shots"
    env = {**os.environ, "QT_QPA_PLATFORM": "offscreen"}
    out = subprocess.run(
        [sys.executable, "-m", "app.main", "--screenshots", str(shots), "--demo"],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    names = {p.name for p in shots.glob("*.png")}
    screens = ["dashboard", "try-it", "swarm", "settings", "log", "error", "update"]
    light_and_dark = ["setup-1-computer", "setup-2-swarm", "setup-3-share", "tray-menu", *screens]
    assert names == {f"{n}{v}.png" for n in light_and_dark for v in ("", "-dark")} | {f"{n}-small.png" for n in screens}
    image = QImage(str(shots / "dashboard.png"))
    assert image.width() >= 1000 and image.height() >= 700
    for name in screens:  # every screen fits 1000 x 640, the error banner included
        small = QImage(str(shots / f"{name}-small.png"))
        assert (small.width(), small.height()) == (1000, 640), name
    # the dark variant is dark: the window's corner pixel has a low lightness
    assert QColor(QImage(str(shots / "log-dark.png")).pixel(5, 400)).lightness() < 80
    # the plots are drawn: many distinct colours, not a blank window
    colours = {image.pixel(x, y) for x in range(0, image.width(), 7) for y in range(0, image.height(), 7)}
    assert len(colours) > 50


def test_the_tray_menu_follows_the_state_and_sends_requests(qtbot):
    from app.models import NodeStatus
    from app.tray import TrayIcon
    from app.window import app_icon

    tray = TrayIcon(app_icon())
    status = NodeStatus()
    status.apply(P.State(state=P.RUNNING, round=4))
    tray.refresh(status)
    assert tray.pause_action.isEnabled() and tray.pause_after_action.isEnabled() and not tray.resume_action.isEnabled()
    assert tray.state_action.text() == "Running: round 4" and "Running" in tray.icon.toolTip()
    with qtbot.waitSignal(tray.pause_requested) as paused:
        tray.pause_after_action.trigger()
    assert paused.args == [True]
    status.apply(P.State(state=P.PAUSED, reason="paused by you", round=4))
    tray.refresh(status)
    assert tray.resume_action.isEnabled() and not tray.pause_action.isEnabled()
    assert not tray.pause_after_action.isEnabled()  # a disabled action sends nothing
    with qtbot.assertNotEmitted(tray.pause_requested):
        tray.pause_after_action.trigger()
    with qtbot.waitSignal(tray.resume_requested):
        tray.resume_action.trigger()
    with qtbot.waitSignal(tray.quit_requested):
        tray.quit_action.trigger()
    tray.hide()


@pytest.mark.node_process
def test_sapo_swarm_runs_once_and_quits_on_ctrl_c(qtbot, data):
    if sys.platform == "win32":
        pytest.skip("SIGINT to a child process is a POSIX affair")
    import signal

    import psutil

    save_config(tiny(data), data / "node.toml")
    env = {**os.environ, "QT_QPA_PLATFORM": "offscreen"}
    first = subprocess.Popen(
        [sys.executable, "-m", "app.main"], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        qtbot.waitUntil(lambda: (data / "sapo-swarm.lock").exists() or first.poll() is not None, timeout=60_000)
        assert first.poll() is None, first.communicate()
        second = subprocess.run(
            [sys.executable, "-m", "app.main"], env=env, capture_output=True, text=True, timeout=120
        )
        assert second.returncode == 0 and "already running" in second.stdout

        workers: list[psutil.Process] = []

        def node_started() -> bool:  # the window is up and has started its node process
            workers[:] = [
                k for k in psutil.Process(first.pid).children() if "sapo_core.control.worker" in " ".join(k.cmdline())
            ]
            return bool(workers) or first.poll() is not None

        qtbot.waitUntil(node_started, timeout=60_000)
        first.send_signal(signal.SIGINT)
        out, err = first.communicate(timeout=120)
    finally:
        if first.poll() is None:
            first.kill()
    assert first.returncode == 0, err[-3000:]
    assert "Traceback" not in err and not (data / "sapo-swarm.lock").exists()
    assert workers and not workers[0].is_running()  # the node was stopped before the app left
