"""The Try it tab: ask the base model and the trained one the same question, side by side.

Type a question, or draw one from the run's tasks (then each answer gets its reward against
ReasoningGYM's reference). `sapo-node try --json` does the work in a child process, so the
app stays free of torch; both answers are greedy, so what differs is the training.
"""

from __future__ import annotations

from html import escape

from PySide6.QtCore import Signal
from PySide6.QtGui import QKeySequence, QShortcut
from PySide6.QtWidgets import (
    QGridLayout,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QPushButton,
    QTextBrowser,
    QVBoxLayout,
    QWidget,
)

from app.jobs import NodeCommand
from app.theme import colours


class TryView(QWidget):
    answered = Signal(dict)
    """Both answers arrived: the JSON of `sapo-node try`."""
    failed = Signal(str)
    """The command could not answer; why."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.run_dir: str = ""
        self.max_new_tokens = 0  # 0: the run's own limit
        self.command = NodeCommand(self)
        self.command.line.connect(self._on_command_line)
        self.command.finished.connect(self._on_command_finished)
        self._result: dict | None = None

        self.question = QLineEdit(placeholderText="Type a question, e.g. What is 17 + 25?")
        self.question.setAccessibleName("Question")
        self.question.returnPressed.connect(self._on_ask_clicked)
        self.ask_button = QPushButton("&Ask both models")
        self.ask_button.setAccessibleName("Ask both models the question")
        self.ask_button.clicked.connect(self._on_ask_clicked)
        self.draw_button = QPushButton("&Draw a task question")
        self.draw_button.setToolTip(
            "A question from the tasks this node trains on, with a reference answer so each answer gets its reward"
        )
        self.draw_button.clicked.connect(self._on_draw_clicked)
        QShortcut(QKeySequence("Ctrl+D"), self, activated=self._on_draw_clicked)
        self.status = QLabel(
            "Compares the model you started from with the one you trained. Answering loads the "
            "model beside the node: it takes a minute on a small computer.",
            wordWrap=True,
        )
        self.status.setObjectName("tryStatus")
        self.reference = QLabel(wordWrap=True)
        self.headers = {k: QLabel() for k in ("base", "trained")}
        self.answers = {k: QTextBrowser() for k in ("base", "trained")}
        for k, label in (("base", "Base model"), ("trained", "Trained model")):
            self.headers[k].setText(f"<b>{label}</b>")
            self.answers[k].setAccessibleName(f"Answer of the {label.lower()}")

        row = QHBoxLayout()
        row.addWidget(self.question, 1)
        row.addWidget(self.ask_button)
        row.addWidget(self.draw_button)
        grid = QGridLayout()
        for col, k in enumerate(("base", "trained")):
            grid.addWidget(self.headers[k], 0, col)
            grid.addWidget(self.answers[k], 1, col)
            grid.setColumnStretch(col, 1)
        layout = QVBoxLayout(self)
        layout.addLayout(row)
        layout.addWidget(self.status)
        layout.addWidget(self.reference)
        layout.addLayout(grid, 1)

    # --- asking ---------------------------------------------------------------------------------
    def ask(self, question: str | None = None, seed: int | None = None) -> None:
        """Ask `question`, or draw one from the tasks (with `seed`, reproducibly) when it is None."""
        if self.command.running:
            return
        args = ["try", "--json"]
        if self.run_dir:
            args += ["--run-dir", self.run_dir]
        if question:
            args += ["--question", question]
        elif seed is not None:
            args += ["--seed", str(seed)]
        if self.max_new_tokens:
            args += ["--max-new-tokens", str(self.max_new_tokens)]
        self._result = None
        self._set_busy(True)
        self.status.setText("Loading the models and answering… (both answers come together)")
        for k in self.answers:
            self.answers[k].clear()
        self.command.start(args)

    def _set_busy(self, busy: bool) -> None:
        for w in (self.ask_button, self.draw_button, self.question):
            w.setEnabled(not busy)

    def _on_ask_clicked(self) -> None:
        text = self.question.text().strip()
        if text:
            self.ask(text)
        else:
            self.status.setText("Type a question first, or draw one from the tasks.")

    def _on_draw_clicked(self) -> None:
        self.ask(None)

    def _on_command_line(self, obj: dict) -> None:
        if "error" in obj:
            self._result = {"error": str(obj["error"])}
        elif "base" in obj and "trained" in obj:
            self._result = obj

    def _on_command_finished(self, code: int, stderr: str) -> None:
        self._set_busy(False)
        result = self._result
        if not result or "error" in result:
            why = (result or {}).get("error") or stderr.splitlines()[-1:] or [f"exit code {code}"]
            why = why if isinstance(why, str) else why[0]
            red = colours()["error"]
            self.status.setText(f"<span style='color:{red}'>Could not answer: {escape(why)}</span>")
            self.failed.emit(why)
            return
        self.show_result(result)
        self.answered.emit(result)

    def show_result(self, r: dict) -> None:
        self.question.setText(r["question"])
        where = f" ({r['dataset'].replace('_', ' ')})" if r.get("dataset") else ""
        self.status.setText(f"Answered in {r.get('seconds', 0):.0f} s{where}. Trained model: round {r['round']}.")
        self.reference.setText(
            f"Reference answer: <b>{escape(str(r['reference']))}</b>"
            if r.get("reference") is not None
            else "Typed question: no reference answer, so no reward."
        )
        for k, label in (("base", "Base model"), ("trained", f"Trained model (round {r['round']})")):
            reward = r[k].get("reward")
            self.headers[k].setText(
                f"<b>{label}</b>" + (f" · reward <b>{reward:.2f}</b>" if reward is not None else "")
            )
            self.answers[k].setPlainText(r[k]["text"] or "(empty answer)")


__all__ = ["TryView"]
