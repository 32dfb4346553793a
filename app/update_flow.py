"""The update flow of the window: from a release found to installed, between the node's rounds.

`UpdateFlow` owns the pieces of app/updater.py (the `Updater`, the `UpdateBar` above the status
panel, the Settings tab's `UpdateSettings` group) and the flow's state; the main window places
the two widgets, hands it the node's stops and acts on its three signals.

1. A check (a minute after start, then daily, or Check now) finds a newer release: the bar
   offers it, the tray says so once per release, and with `updates/automatic` on it goes on by
   itself. A check that cannot confirm this copy is up to date (the repository's signed
   metadata expired) says so in the bar, with why.
2. Update now: a running node is asked to pause after its round (its checkpoint is written),
   then stopped; the window calls `node_stopped()` when it has, and the package downloads and
   installs. A node that is not running is not waited for.
3. Done: a restart is offered; if it failed, the installed version stays and the node that was
   stopped for it trains on.
"""

from __future__ import annotations

from PySide6.QtCore import QObject, QProcess, Signal

from app import APP_NAME
from app.updater import UpdateBar, Updater, UpdateSettings
from sapo_core.control import protocol as P


class UpdateFlow(QObject):
    log_line = Signal(str, str)
    """(level, text): a line for the Log tab."""
    start_node = Signal()
    """The install failed after the node was stopped for it: start it again."""
    quit_requested = Signal()
    """The new version was started: stop the node and leave."""

    def __init__(
        self, bridge, status, settings, tray=None, updater: Updater | None = None, parent: QObject | None = None
    ) -> None:
        """`bridge`: the node's WorkerBridge; `status`: its models.NodeStatus; `tray`: the
        TrayIcon that tells of a release once (None: no tray); `updater`: checks and installs
        (default: this copy's, from the settings)."""
        super().__init__(parent)
        self.bridge, self.status, self.settings, self.tray = bridge, status, settings, tray
        self.updater = updater or Updater(settings, self)
        self.bar = UpdateBar()
        self.settings_group = UpdateSettings(settings)
        self._pending = self._start_after = False  # waiting for the node to stop; start it again if it fails
        self.updater.found.connect(self._on_updater_found)
        self.updater.checked.connect(self._on_updater_checked)
        self.updater.unconfirmed.connect(self._on_updater_unconfirmed)
        self.updater.progress.connect(self.bar.downloading)
        self.updater.done.connect(self._on_updater_done)
        self.bar.update_requested.connect(self._on_bar_update_requested)
        self.bar.restart_requested.connect(self._on_bar_restart_requested)
        self.bar.check_requested.connect(self._on_check_requested)
        self.settings_group.check_requested.connect(self._on_check_requested)
        bridge.state_changed.connect(self._on_bridge_state_changed)

    def schedule(self) -> None:
        """The first check a minute from now, then daily."""
        self.updater.schedule()

    def node_stopped(self) -> bool:
        """The node has stopped; True if it stopped for the update, which now installs."""
        if not self._pending:
            return False
        self._pending = False
        self._install()
        return True

    def _on_bridge_state_changed(self, ev: P.State) -> None:
        if self._pending and ev.state in (P.PAUSED, P.SNOOZED):
            self.bridge.stop()  # its round is over and checkpointed: stop it for the update

    def _on_check_requested(self) -> None:
        if not self.updater.check_now():
            self.settings_group.status_label.setText("Set the address first (or a check is under way).")

    def _on_updater_checked(self, line: str) -> None:
        self.log_line.emit("info", line)
        self.settings_group.status_label.setText(line[:1].upper() + line[1:] + ".")

    def _on_updater_unconfirmed(self, why: str) -> None:
        self.log_line.emit("warning", f"SAPO Swarm cannot confirm it is up to date: {why}")
        self.settings_group.status_label.setText(f"Cannot confirm this copy is up to date: {why}.")
        if not self._pending and not self.updater.installing:  # an update under way keeps its bar
            self.bar.unconfirmed(why)

    def _on_updater_found(self, release) -> None:
        installable = self.updater.package() is not None
        self.bar.offer(release, installable)
        if self.tray is not None and self.settings.get("updates/told") != release.version:
            self.settings.set("updates/told", release.version)
            self.tray.notify(APP_NAME, f"SAPO Swarm {release.version} is available. Open the window to update.")
        if installable and self.settings.get("updates/automatic"):
            self._on_bar_update_requested()

    def _on_bar_update_requested(self) -> None:
        """Install between rounds: a running node pauses after its round, then stops, then the
        package is fetched and installed."""
        if self.updater.package() is None or self._pending:
            return
        if not self.bridge.running:
            self._install()
            return
        self._pending = self._start_after = True
        self.bar.waiting("Waiting for the node to finish its round; then the update downloads and installs.")
        if self.status.state in (P.PAUSED, P.SNOOZED):
            self.bridge.stop()
        else:
            self.bridge.pause(after_round=True)

    def _install(self) -> None:
        self.bar.waiting("Downloading and installing the update…")
        self.updater.install_now()  # `done` follows, whether it ran or could not start

    def _on_updater_done(self, ok: bool, text: str) -> None:
        launcher = self.updater.launcher()
        self.bar.finished(ok, text, launcher is not None and launcher.exists())
        self.log_line.emit("info" if ok else "warning", text)
        start_again, self._start_after = self._start_after and not ok, False
        if start_again:  # the installed version stays: train on with it
            self.start_node.emit()

    def _on_bar_restart_requested(self) -> None:
        launcher = self.updater.launcher()
        if launcher is not None and QProcess.startDetached(str(launcher), []):
            self.quit_requested.emit()


__all__ = ["UpdateFlow"]
