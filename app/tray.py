"""The tray icon: the node's state at a glance, and its controls without the window.

Where the desktop has no tray (`QSystemTrayIcon.isSystemTrayAvailable()` is False: some
Linux desktops, the offscreen platform), `available` is False and the window stays the only
way in: closing it then quits the app (and stops the node) instead of hiding it.
"""

from __future__ import annotations

from PySide6.QtCore import QObject, Signal
from PySide6.QtGui import QAction, QIcon
from PySide6.QtWidgets import QMenu, QSystemTrayIcon

from sapo_core.control import protocol as P

from app.models import NodeStatus


class TrayIcon(QObject):
    open_requested = Signal()
    """Show the window."""
    quit_requested = Signal()
    """Quit the app (the node stops)."""
    pause_requested = Signal(bool)
    """Pause now (False) or after this round (True)."""
    resume_requested = Signal()
    """Resume after a pause or a snooze."""
    snooze_requested = Signal()
    """Snooze for an hour."""

    def __init__(self, icon: QIcon, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self.available = QSystemTrayIcon.isSystemTrayAvailable()
        self.menu = QMenu()
        self.state_action = QAction("Not started", self.menu, enabled=False)
        self.open_action = QAction("Open SAPO Swarm", self.menu)
        self.pause_action = QAction("Pause now", self.menu)
        self.pause_after_action = QAction("Pause after this round", self.menu)
        self.resume_action = QAction("Resume", self.menu)
        self.snooze_action = QAction("Snooze 1 h", self.menu)
        self.quit_action = QAction("Quit (stops the node)", self.menu)
        self.open_action.triggered.connect(self.open_requested)
        self.pause_action.triggered.connect(self._on_pause_action_triggered)
        self.pause_after_action.triggered.connect(self._on_pause_after_action_triggered)
        self.resume_action.triggered.connect(self.resume_requested)
        self.snooze_action.triggered.connect(self.snooze_requested)
        self.quit_action.triggered.connect(self.quit_requested)
        self.menu.addAction(self.state_action)
        self.menu.addSeparator()
        for a in (self.open_action, self.pause_action, self.pause_after_action, self.resume_action,
                  self.snooze_action):
            self.menu.addAction(a)
        self.menu.addSeparator()
        self.menu.addAction(self.quit_action)
        self.icon = QSystemTrayIcon(icon, self)
        self.icon.setContextMenu(self.menu)
        self.icon.activated.connect(self._on_icon_activated)
        if self.available:
            self.icon.show()

    def refresh(self, s: NodeStatus) -> None:
        text = s.title + (f": {s.detail}" if s.detail else "")
        self.state_action.setText(text if len(text) < 70 else text[:67] + "…")
        self.icon.setToolTip(f"SAPO Swarm — {text}")
        alive = s.alive and s.state != P.STOPPING
        by_you = s.state == P.PAUSED and s.reason.startswith("paused by you")
        self.pause_action.setEnabled(alive and not by_you)
        self.pause_after_action.setEnabled(s.state == P.RUNNING)
        self.resume_action.setEnabled(alive and s.state in (P.PAUSED, P.SNOOZED, P.PAUSING))
        self.snooze_action.setEnabled(alive and s.state != P.SNOOZED)

    def notify(self, title: str, message: str, error: bool = False) -> None:
        if self.available:
            icon = QSystemTrayIcon.MessageIcon.Critical if error else QSystemTrayIcon.MessageIcon.Information
            self.icon.showMessage(title, message, icon, 8000)

    def hide(self) -> None:
        self.icon.hide()

    def _on_icon_activated(self, reason: QSystemTrayIcon.ActivationReason) -> None:
        if reason in (QSystemTrayIcon.ActivationReason.Trigger, QSystemTrayIcon.ActivationReason.DoubleClick):
            self.open_requested.emit()

    def _on_pause_action_triggered(self) -> None:
        self.pause_requested.emit(False)

    def _on_pause_after_action_triggered(self) -> None:
        self.pause_requested.emit(True)


__all__ = ["TrayIcon"]
