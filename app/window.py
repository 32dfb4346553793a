"""The main window: status and controls on top, then Dashboard, Try it, Swarm, Settings and Log tabs.

It holds the models (status, history, swarm, log), feeds them the bridge's signals, and
turns the views' requests into node commands and saved settings. Closing it hides it in the
tray while the node goes on; without a tray, closing quits. Quitting stops the node first
(ask, wait, terminate, kill: the bridge does it on a thread) and then leaves.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from PySide6.QtCore import QTimer, Signal
from PySide6.QtGui import QCloseEvent, QIcon
from PySide6.QtWidgets import QApplication, QMainWindow, QScrollArea, QTabWidget, QVBoxLayout, QWidget

from app import APP_NAME
from app.banner import ErrorBanner
from app.bridge import WorkerBridge
from app.controls import ShareSettings, StatusPanel
from app.dashboard import DashboardView
from app.eventlog import EventLog, readable_error
from app.history import HistoryLoader, store_path
from app.log_view import LogView, diagnostics_text
from app.menubar import build_menu_bar
from app.models import NodeStatus, RoundHistory, SwarmModel
from app.settings import UiSettings, has_node_config, load_node_config, node_config_path, save_node_config, with_run_dir
from app.swarm_view import SwarmView
from app.theme import style_sheet
from app.tray import TrayIcon
from app.try_view import TryView
from app.update_flow import UpdateFlow
from app.updater import Updater
from sapo_core.config import ConfigError, ControlConfig, NodeConfig
from sapo_core.control import protocol as P

TABS = ("Dashboard", "Try it", "Swarm", "Settings", "Log")
# "Run anyway": the rules that would hold the node back, set aside for a while
RULES_SET_ASIDE = dict(
    pause_on_battery=False, only_when_idle=False, schedule="", max_temperature_c=0.0, min_free_memory_gb=0.0
)


def app_icon() -> QIcon:
    from importlib import resources

    return QIcon(str(resources.files("sapo_resources") / "sapo-swarm.svg"))


class MainWindow(QMainWindow):
    quit_finished = Signal()
    """The node has stopped after Quit; the app may leave."""

    def __init__(
        self, bridge: WorkerBridge, settings: UiSettings, use_tray: bool = True, updater: Updater | None = None
    ) -> None:
        """`updater`: checks for and installs releases (default: this copy's, from the settings)."""
        super().__init__()
        self.bridge, self.settings = bridge, settings
        self.saved_config: NodeConfig | None = None  # node.toml as written (run_dir may be empty)
        self.status, self.history, self.swarm, self.log = NodeStatus(), RoundHistory(), SwarmModel(), EventLog()
        self._loaded_store: Path | None = None
        self._pending_rounds: list[P.RoundDone] = []
        self._quitting = self._restart_after_stop = False
        self.setWindowTitle(APP_NAME)
        self.setWindowIcon(app_icon())
        self.setStyleSheet(style_sheet())  # colours from the system palette: light or dark
        self.tray = TrayIcon(self.windowIcon(), self) if use_tray else None
        self.update_flow = UpdateFlow(bridge, self.status, settings, self.tray, updater, self)
        self._build_views()
        self._build_tabs()
        self._build_layout()
        build_menu_bar(self)
        self.loader = HistoryLoader(self)
        self._rules_back = QTimer(self, singleShot=True)

        self._connect_bridge()
        self._connect_controls()
        self._connect_views()
        self._connect_updates()
        geometry = settings.get("window/geometry")
        if not geometry or not self.restoreGeometry(geometry):
            self.resize(1180, 780)
        self.reload_config()
        self._refresh_status()

    # --- building ------------------------------------------------------------------------------
    def _build_views(self) -> None:
        self.banner = ErrorBanner()
        self.panel = StatusPanel()
        self.dashboard = DashboardView(self.history, window=self.settings.get("dashboard/window"))
        self.try_view = TryView()
        self.swarm_view = SwarmView(self.swarm)
        self.share = ShareSettings()
        self.log_view = LogView(self.log, self.diagnostics)

    def _build_tabs(self) -> None:
        # the Settings page scrolls: its form is taller than a 640 px screen leaves it under an error banner
        # the Updates group under the share's groups, aligned and spaced as they are
        share = self.share.layout()
        margins, gap = share.contentsMargins(), share.spacing()
        settings_page = QWidget()
        col = QVBoxLayout(settings_page)
        col.setContentsMargins(0, 0, 0, margins.bottom())
        col.setSpacing(max(0, gap - margins.bottom()))
        col.addWidget(self.share)
        inset = QVBoxLayout()
        inset.setContentsMargins(margins.left(), 0, margins.right(), 0)
        inset.addWidget(self.update_flow.settings_group)
        col.addLayout(inset)
        col.addStretch(1)
        share_scroll = QScrollArea(widgetResizable=True, frameShape=QScrollArea.Shape.NoFrame)
        share_scroll.setWidget(settings_page)
        self.tabs = QTabWidget()
        for i, (view, name) in enumerate(
            zip((self.dashboard, self.try_view, self.swarm_view, share_scroll, self.log_view), TABS)
        ):
            self.tabs.addTab(view, f"&{name}" if i else name)
            view.setAccessibleName(name)
        self.tabs.setCurrentIndex(min(max(0, self.settings.get("window/tab")), len(TABS) - 1))

    def _build_layout(self) -> None:
        central = QWidget()
        col = QVBoxLayout(central)
        col.setContentsMargins(8, 8, 8, 4)
        col.addWidget(self.update_flow.bar)
        col.addWidget(self.banner)
        col.addWidget(self.panel)
        col.addWidget(self.tabs, 1)
        self.setCentralWidget(central)

    # --- connecting ----------------------------------------------------------------------------
    def _connect_bridge(self) -> None:
        b = self.bridge
        for signal, slot in (
            (b.state_changed, self._on_state_changed),
            (b.round_done, self._on_round_done),
            (b.progress, self._on_progress),
            (b.node_info, self._on_node_info),
            (b.heartbeat, self._on_heartbeat),
            (b.status, self._on_status),
            (b.error, self._on_error),
            (b.event, self._on_event),
            (b.command_sent, self._on_command_sent),
            (b.stop_finished, self._on_stop_finished),
        ):
            signal.connect(slot)

    def _connect_controls(self) -> None:
        """The status panel's and the tray's buttons, and the Settings tab's share."""
        for source in (self.panel, self.tray):
            if source is not None:
                source.pause_requested.connect(self._on_pause_requested)
                source.resume_requested.connect(self._on_resume_requested)
                source.start_requested.connect(self._on_start_requested)
                source.snooze_requested.connect(self._on_snooze_requested)
        self.panel.run_anyway_requested.connect(self._on_run_anyway_requested)
        self._rules_back.timeout.connect(self._on_rules_back_timeout)
        if self.tray is not None:
            self.tray.open_requested.connect(self.bring_to_front)
            self.tray.quit_requested.connect(self.request_quit)
        self.share.throttle_changed.connect(self._on_throttle_changed)
        self.share.threads_changed.connect(self._on_threads_changed)
        self.share.rules_changed.connect(self._on_rules_changed)
        self.share.setup_requested.connect(self.open_setup)

    def _connect_views(self) -> None:
        self.dashboard.window_changed.connect(self._on_window_changed)
        self.banner.details_requested.connect(self._on_details_requested)
        self.banner.action_requested.connect(self._on_banner_action_requested)
        self.loader.loaded.connect(self._on_loaded)
        self.tabs.currentChanged.connect(self._on_tabs_current_changed)

    def _connect_updates(self) -> None:
        flow = self.update_flow
        flow.log_line.connect(self._on_update_flow_log_line)
        flow.start_node.connect(self._on_update_flow_start_node)
        flow.quit_requested.connect(self.request_quit)
        flow.schedule()

    # --- config and start ----------------------------------------------------------------------------
    def reload_config(self) -> bool:
        """Read node.toml again (the user may have fixed it by hand); a broken file shows why."""
        if not has_node_config():
            self.saved_config = None
            self.share.set_node_text(
                f"No settings saved yet: choose <i>Setup again…</i> to pick the model and "
                f"the swarm.<br>Settings file: {node_config_path()}"
            )
            return False
        try:
            self.saved_config = load_node_config()
        except ConfigError as e:
            self.saved_config = None
            self.banner.show_message(
                f"The settings file cannot be used: {e}",
                f"Fix {node_config_path()} or choose Setup again… in the Node menu.",
            )
            self.log.add("error", str(e))
            self.log_view.append(self.log.lines[-1])
            return False
        cfg = self.saved_config
        self.share.set_control(cfg.control, cfg.sampler.threads)
        self.share.set_node_text(
            f"Model: <b>{cfg.model.name}</b> · swarm: "
            f"{'off (training alone)' if not cfg.swarm.enabled else cfg.swarm.swarm_name}"
            f"<br>Run directory: {with_run_dir(cfg).run_dir}"
            f"<br>Settings file: {node_config_path()}"
        )
        return True

    def start_node(self) -> bool:
        if self.bridge.running:
            return False
        if not self.reload_config():
            if self.saved_config is None and not has_node_config():
                self.banner.show_message(
                    "No settings yet.",
                    "Choose Setup again… in the Node menu to pick the model, the swarm and your share.",
                )
            return False
        cfg = with_run_dir(self.saved_config)
        self.banner.hide()
        self.load_history(store_path(cfg.run_dir))
        self.bridge.start(cfg, paused=self.settings.get("node/paused_by_user"))
        return True

    def load_history(self, path: Path) -> None:
        if path == self._loaded_store or self.loader.busy:
            return
        if self._loaded_store is not None:  # another run (setup again): its curves start from its own store
            self.history.clear()
            self.swarm.clear()
        self._loaded_store = path
        self.dashboard.store_file = path
        self.try_view.run_dir = str(path.parent)
        self.loader.load(path)

    def _save(self, cfg: NodeConfig) -> None:
        self.saved_config = cfg
        save_node_config(cfg)

    # --- bridge signals ---------------------------------------------------------------------------------
    def _on_event(self, ev: P.Message) -> None:
        line = self.log.from_event(ev)
        if line is not None:
            self.log_view.append(line)

    def _on_state_changed(self, ev: P.State) -> None:
        self.status.apply(ev)
        self._refresh_status()
        if ev.state == P.CRASHED and self.banner.isHidden():
            self.banner.show_message(f"The node stopped: {ev.reason}", "See the Log tab for details.", "start")
        self._refresh_status()

    def _on_round_done(self, ev: P.RoundDone) -> None:
        self.status.apply(ev)
        self._refresh_status()
        if self.loader.busy:
            self._pending_rounds.append(ev)
            return
        if self.history.add(ev.round, ev.metrics):
            self.swarm.add_round(ev.round, ev.metrics)
            self.swarm_view.refresh()
            self.dashboard.schedule_refresh()
            self._show_typical_round()

    def _on_loaded(self, rows: list, error: str) -> None:
        if error:
            self.log_view.append(self.log.add("warning", error))
        self.history.add_many(rows)
        for r, metrics in rows:
            self.swarm.add_round(r, metrics)
        pending, self._pending_rounds = self._pending_rounds, []
        for ev in pending:
            if self.history.add(ev.round, ev.metrics):
                self.swarm.add_round(ev.round, ev.metrics)
        self.dashboard.refresh()
        self.swarm_view.refresh()
        self._show_typical_round()

    def _show_typical_round(self) -> None:
        _, recent = self.history.rolling("time/round", 5)
        self.panel.typical_round_s = float(recent[-1]) if len(recent) else 0.0

    def _on_progress(self, ev: P.Progress) -> None:
        self.status.apply(ev)
        self._refresh_status()
        if self.swarm.apply_progress(ev):
            self.swarm_view.refresh()

    def _on_node_info(self, ev: P.NodeInfo) -> None:
        self.banner.hide()  # the node is up again (after a restart): the error stays in the log
        self.status.apply(ev)
        self.swarm.apply_info(ev)
        self.swarm_view.reload_page_link()  # a restart may come with a new config (Setup again…)
        self.swarm_view.refresh()
        self._refresh_status()

    def _on_heartbeat(self, ev: P.Heartbeat) -> None:
        if self.status.apply(ev):
            self._refresh_status()

    def _on_status(self, ev: P.Status) -> None:
        self.status.apply(ev)
        self._refresh_status()

    def _on_error(self, ev: P.Error) -> None:
        headline, hint = readable_error(ev)
        self.banner.show_message(headline, hint, "setup" if ev.kind == P.CONFIG else "start" if ev.fatal else "")
        self._refresh_status()
        if self.tray is not None and not self.isVisible():
            self.tray.notify(APP_NAME, headline, error=True)

    def _on_command_sent(self, words: str) -> None:
        self.log_view.append(self.log.add("command", words))

    def _on_stop_finished(self) -> None:
        if self.update_flow.node_stopped():
            return  # it stopped for the update, which installs now
        if self._quitting:
            self.quit_finished.emit()
            self.close()
            QApplication.quit()
        elif self._restart_after_stop:
            self._restart_after_stop = False
            QTimer.singleShot(0, self.start_node)

    def _refresh_status(self) -> None:
        self.panel.refresh(self.status)
        if self.status.state == P.CRASHED and not self.banner.isHidden():
            # one message: the banner says what happened and what to do; the panel does not repeat it
            self.panel.reason_label.setText("The message above says why, and what to change.")
            self.panel.reason_label.setToolTip("")
        if self.tray is not None:
            self.tray.refresh(self.status)
        self.setWindowTitle(f"{APP_NAME} — {self.status.title}")

    # --- the user's requests ----------------------------------------------------------------------------
    def _on_pause_requested(self, after_round: bool) -> None:
        self.settings.set("node/paused_by_user", True)
        self.bridge.pause(after_round)

    def _on_resume_requested(self) -> None:
        self.settings.set("node/paused_by_user", False)
        self.bridge.resume()

    def _on_snooze_requested(self, seconds: float = 3600.0) -> None:
        self.settings.set("node/paused_by_user", False)
        self.bridge.snooze(seconds)

    def _on_run_anyway_requested(self, seconds: float) -> None:
        """Set the rules aside for a while: the node runs now; the saved rules come back by themselves."""
        if self.saved_config is None:
            return
        self.bridge.set_rules(dataclasses.replace(self.saved_config.control, **RULES_SET_ASIDE))
        self._rules_back.start(int(seconds * 1000))
        self.log_view.append(self.log.add("info", f"your rules are set aside for {seconds / 60:.0f} min"))

    def _on_rules_back_timeout(self) -> None:
        if self.saved_config is not None:
            self.bridge.set_rules(self.saved_config.control)
            self.log_view.append(self.log.add("info", "your rules hold again"))

    def _on_banner_action_requested(self, action: str) -> None:
        self.banner.hide()
        if action == "setup":
            self.open_setup()
        else:
            self._on_start_requested()

    def _on_start_requested(self) -> None:
        if self.bridge.running:
            self.log_view.append(self.log.add("info", "the node is already running (or restarting by itself)"))
            return
        self.start_node()

    def _on_stop_action_triggered(self) -> None:
        self.bridge.stop()

    def _on_throttle_changed(self, share: float) -> None:
        if self.saved_config is not None:
            self._save(self.saved_config.replace(**{"control.throttle": share}))
        self.bridge.set_throttle(share)

    def _on_threads_changed(self, threads: int) -> None:
        if self.saved_config is not None:
            self._save(self.saved_config.replace(**{"sampler.threads": threads}))
        self.bridge.set_threads(threads)

    def _on_rules_changed(self, control: ControlConfig) -> None:
        if self.saved_config is not None:
            self._save(dataclasses.replace(self.saved_config, control=control))
        self.bridge.set_rules(control)

    def _on_window_changed(self, rounds: int) -> None:
        self.settings.set("dashboard/window", rounds)

    def _on_tabs_current_changed(self, index: int) -> None:
        self.settings.set("window/tab", index)

    # --- updates (app/update_flow.py) ----------------------------------------------------------------
    def _on_update_flow_log_line(self, level: str, text: str) -> None:
        self.log_view.append(self.log.add(level, text))

    def _on_update_flow_start_node(self) -> None:
        QTimer.singleShot(0, self.start_node)

    def _on_details_requested(self) -> None:
        self.tabs.setCurrentWidget(self.log_view)

    def open_export(self) -> None:
        from app.export_dialog import ExportDialog

        cfg = with_run_dir(self.saved_config) if self.saved_config is not None else None
        dialog = ExportDialog(str(cfg.run_dir) if cfg is not None else "", parent=self)
        dialog.open()

    def open_setup(self) -> None:
        from app.wizard import SetupWizard

        wizard = SetupWizard(base=self.saved_config, parent=self)
        wizard.joined.connect(self._on_joined)
        wizard.open()

    def _on_joined(self, cfg: NodeConfig) -> None:
        self._save(cfg)
        self.reload_config()
        if self.bridge.running:
            self._restart_after_stop = True
            self.bridge.stop()
        else:
            self.start_node()

    def diagnostics(self) -> str:
        cfg = with_run_dir(self.saved_config) if self.saved_config is not None else None
        return diagnostics_text(
            self.log,
            self.status,
            cfg,
            self.bridge.last_hello,
            self.bridge.last_info,
            self.bridge.crash,
            self.bridge.stderr_tail(),
            str(node_config_path()),
        )

    # --- window life ------------------------------------------------------------------------------------
    def bring_to_front(self) -> None:
        self.show()
        self.setWindowState(self.windowState() & ~self.windowState().WindowMinimized)
        self.raise_()
        self.activateWindow()

    def save_ui(self) -> None:
        self.settings.set("window/geometry", self.saveGeometry())
        self.settings.set("window/tab", self.tabs.currentIndex())
        self.settings.sync()

    def request_quit(self) -> None:
        """Stop the node (on a thread), then close and leave."""
        self.save_ui()
        self._quitting = True
        self.panel.reason_label.setText("Stopping the node before quitting…")
        if self.tray is not None:
            self.tray.hide()
        self.bridge.stop()

    def closeEvent(self, event: QCloseEvent) -> None:
        self.save_ui()
        if self._quitting and not self.bridge.running:
            event.accept()
            return
        event.ignore()
        if self.tray is not None and self.tray.available:
            self.hide()
            if not self.settings.get("tray/told_about_close"):
                self.settings.set("tray/told_about_close", True)
                self.tray.notify(APP_NAME, "Still training in the background. Use the tray icon to pause or quit.")
        elif not self._quitting:
            self.request_quit()


__all__ = ["MainWindow", "ErrorBanner", "app_icon", "TABS"]
