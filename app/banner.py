"""The main window's error banner (one message, with the button that fixes it) and its help texts."""

from __future__ import annotations

from PySide6.QtCore import Signal
from PySide6.QtWidgets import QFrame, QHBoxLayout, QLabel, QPushButton, QWidget

HELP_TEXT = (
    "<p>Your computer answers practice questions with a small language model, scores the answers, "
    "and trains the model on them (SAPO: swarm GRPO). With a swarm, nodes share their scored answers, "
    "so each one also trains on the others' (whether that teaches more than alone: the setup's swarm "
    "page says what was measured).</p><p><b>Dashboard</b>: is the model getting better "
    "(held-out questions it never trains on), and what you gave. <b>Try it</b>: ask the model you "
    "started from and the one you trained the same question. <b>Settings</b>: how much of this "
    "computer to share and when. Pausing is always safe: the node resumes where it stopped.</p>"
    "<p>Keys: Ctrl+1…5 switch tabs, Ctrl+R starts, Ctrl+E exports the model, Ctrl+Q quits.</p>"
)
ABOUT_TEXT = (
    "Volunteer post-training of small language models with SAPO (Swarm sAmpling Policy "
    "Optimization). Models keep their own licences; see the model card of an export."
)


class ErrorBanner(QFrame):
    details_requested = Signal()
    """Show the log, where the traceback and the node's output are."""
    action_requested = Signal(str)
    """The action button was pressed: "setup" (change the settings) or "start" (start again)."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("errorBanner")
        self.label = QLabel(wordWrap=True)
        self.label.setObjectName("errorMessage")
        details, dismiss = QPushButton("Details"), QPushButton("Dismiss")
        self.action_button = QPushButton()
        self.action_button.clicked.connect(self._on_action_button_clicked)
        self._action = ""
        details.clicked.connect(self.details_requested)
        dismiss.clicked.connect(self.hide)
        row = QHBoxLayout(self)
        row.addWidget(self.label, 1)
        row.addWidget(self.action_button)
        row.addWidget(details)
        row.addWidget(dismiss)
        self.hide()

    def show_message(self, headline: str, hint: str = "", action: str = "") -> None:
        """`action`: "setup" offers to change the settings, "start" to start again, "" nothing."""
        esc = headline.replace("&", "&amp;").replace("<", "&lt;")
        self.label.setText(f"<b>{esc}</b>" + (f"<br>{hint}" if hint else ""))
        self._action = action
        self.action_button.setText({"setup": "Change settings…", "start": "Start again"}.get(action, ""))
        self.action_button.setVisible(bool(action))
        self.show()

    def _on_action_button_clicked(self) -> None:
        self.action_requested.emit(self._action)

    @property
    def text(self) -> str:
        return self.label.text()


__all__ = ["ErrorBanner", "HELP_TEXT", "ABOUT_TEXT"]
