"""The tray icon: the node's state at a glance, and its controls without the window.

Where the desktop has no tray (`QSystemTrayIcon.isSystemTrayAvailable()` is False: some
Linux desktops, the offscreen platform), `available` is False and the window stays the only
way in: closing it then quits the app (and stops the node) instead of hiding it.
"""

from __future__ import annotations

from PySide6.QtCore import QObject, QRectF, Qt, Signal
from PySide6.QtGui import QAction, QColor, QFont, QIcon, QPainter, QPixmap
from PySide6.QtWidgets import QMenu, QSystemTrayIcon

from app.controls import SNOOZE_CHOICES
from app.models import NodeStatus
from sapo_core.control import protocol as P

# the dot drawn on the icon's corner: the state at a glance, also where the menu is never opened
STATE_DOTS = {
    P.RUNNING: "#2DA44E",
    P.STARTING: "#3B82F6",
    P.PAUSED: "#E3B341",
    P.PAUSING: "#E3B341",
    P.SNOOZED: "#E3B341",
    P.CRASHED: "#E5484D",
}


def state_icon(base: QIcon, state: str, size: int = 64) -> QIcon:
    """`base` with a coloured dot for `state` (none when stopped / not started)."""
    colour = STATE_DOTS.get(state)
    pix = base.pixmap(size, size)
    if pix.isNull():
        pix = QPixmap(size, size)
        pix.fill(Qt.GlobalColor.transparent)
    if colour:
        p = QPainter(pix)
        p.setRenderHint(QPainter.RenderHint.Antialiasing)
        p.setPen(QColor("#FFFFFF"))
        p.setBrush(QColor(colour))
        d = size * 0.42
        p.drawEllipse(QRectF(size - d - 1, size - d - 1, d, d))
        p.end()
    return QIcon(pix)


class TrayIcon(QObject):
    open_requested = Signal()
    """Show the window."""
    quit_requested = Signal()
    """Quit the app (the node stops)."""
    pause_requested = Signal(bool)
    """Pause now (False) or after this round (True)."""
    resume_requested = Signal()
    """Resume after a pause or a snooze."""
    snooze_requested = Signal(float)
    """Snooze for this many seconds."""
    start_requested = Signal()
    """Start the node (after an error or a stop)."""

    def __init__(self, icon: QIcon, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self.available = QSystemTrayIcon.isSystemTrayAvailable()
        self.menu = QMenu()
        self.base_icon = icon
        # the status line: enabled (a greyed item was hard to read) and it opens the window
        self.state_action = QAction("Not started", self.menu)
        bold = QFont()
        bold.setBold(True)
        self.state_action.setFont(bold)
        self.state_action.triggered.connect(self.open_requested)
        self.open_action = QAction("Open SAPO Swarm", self.menu)
        self.start_action = QAction("Start", self.menu)
        self.start_action.triggered.connect(self.start_requested)
        self.pause_action = QAction("Pause now", self.menu)
        self.pause_after_action = QAction("Pause after this round", self.menu)
        self.resume_action = QAction("Resume", self.menu)
        self.snooze_menu = QMenu("Snooze", self.menu)
        for text, seconds in SNOOZE_CHOICES:
            self.snooze_menu.addAction(f"Snooze {text}", lambda s=seconds: self.snooze_requested.emit(s))
        self.snooze_action = self.snooze_menu.menuAction()
        self.quit_action = QAction("Quit (stops the node)", self.menu)
        self.open_action.triggered.connect(self.open_requested)
        self.pause_action.triggered.connect(self._on_pause_action_triggered)
        self.pause_after_action.triggered.connect(self._on_pause_after_action_triggered)
        self.resume_action.triggered.connect(self.resume_requested)
        self.quit_action.triggered.connect(self.quit_requested)
        self.menu.addAction(self.state_action)
        self.menu.addSeparator()
        for a in (
            self.open_action,
            self.start_action,
            self.pause_action,
            self.pause_after_action,
            self.resume_action,
            self.snooze_action,
        ):
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
        self.start_action.setVisible(not s.alive)
        self.pause_action.setEnabled(alive and s.state not in (P.PAUSED, P.SNOOZED))
        self.pause_after_action.setEnabled(s.state == P.RUNNING)
        self.resume_action.setEnabled(alive and (by_you or s.state in (P.SNOOZED, P.PAUSING)))
        self.snooze_action.setEnabled(alive and s.state != P.SNOOZED)
        if s.state != getattr(self, "_icon_state", None):
            self._icon_state = s.state
            self.icon.setIcon(state_icon(self.base_icon, s.state))

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
