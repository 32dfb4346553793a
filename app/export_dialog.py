"""Export… : write the trained model for another tool, with a progress bar.

Runs `sapo-node export --progress-json` in a child process (the app never imports torch) and
follows its JSON lines: a fraction and the step being done, then the files written.
"""

from __future__ import annotations

from html import escape
from pathlib import Path

from PySide6.QtCore import Signal
from PySide6.QtWidgets import (
    QComboBox,
    QDialog,
    QDialogButtonBox,
    QFileDialog,
    QFormLayout,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QProgressBar,
    QPushButton,
    QVBoxLayout,
    QWidget,
)

from app.jobs import NodeCommand
from app.theme import colours

FORMAT_CHOICES = (
    ("gguf", "GGUF for llama.cpp / LM Studio (adapter merged)"),
    ("ollama", "Ollama (GGUF + Modelfile)"),
    ("hf", "Hugging Face folder (transformers)"),
    ("peft", "LoRA adapter only (PEFT, small)"),
)


class ExportDialog(QDialog):
    exported = Signal(bool, str)
    """(ok, message): the export ended; the folder written, or why not."""

    def __init__(self, run_dir: str, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setWindowTitle("Export the trained model")
        self.run_dir = run_dir
        self.command = NodeCommand(self)
        self.command.line.connect(self._on_command_line)
        self.command.finished.connect(self._on_command_finished)
        self._files: list[str] = []
        self._error = ""

        self.format = QComboBox()
        for key, text in FORMAT_CHOICES:
            self.format.addItem(text, key)
        self.format.setAccessibleName("Format")
        self.quant = QComboBox()
        # F16 first: it is the model as trained (0.003 nats/token from the trainer's log-probs);
        # Q8_0's rounding moves them ~0.07 (tests/test_export.py), past the 0.05 the node holds its sampler to
        self.quant.addItem("F16 (exactly what you trained)", "f16")
        self.quant.addItem("Q8_0 (half the size, answers differ slightly)", "q8_0")
        self.quant.setAccessibleName("GGUF weights")
        self.format.currentIndexChanged.connect(self._on_format_current_index_changed)
        self.output = QLineEdit(str(Path.home() / "sapo-model"))
        self.output.setAccessibleName("Output folder")
        browse = QPushButton("Choose…")
        browse.clicked.connect(self._on_browse_clicked)
        out_row = QHBoxLayout()
        out_row.addWidget(self.output, 1)
        out_row.addWidget(browse)
        form = QFormLayout()
        form.addRow("&Format:", self.format)
        form.addRow("&Weights:", self.quant)
        form.addRow("&Into folder:", out_row)
        self.progress = QProgressBar(minimum=0, maximum=100, value=0)
        self.progress.setAccessibleName("Export progress")
        self.step = QLabel(
            "A model card (README.md) with the base model, its licence and this run's figures goes with every format.",
            wordWrap=True,
        )
        self.buttons = QDialogButtonBox()
        self.export_button = self.buttons.addButton("&Export", QDialogButtonBox.ButtonRole.AcceptRole)
        self.close_button = self.buttons.addButton(QDialogButtonBox.StandardButton.Close)
        self.export_button.clicked.connect(self.start)
        self.close_button.clicked.connect(self.reject)
        layout = QVBoxLayout(self)
        layout.addLayout(form)
        layout.addWidget(self.progress)
        layout.addWidget(self.step)
        layout.addWidget(self.buttons)
        self.resize(560, 0)

    def _on_format_current_index_changed(self, _i: int) -> None:
        self.quant.setEnabled(self.format.currentData() in ("gguf", "ollama"))

    def _on_browse_clicked(self) -> None:
        path = QFileDialog.getExistingDirectory(self, "Folder to export into (a new one inside it is fine)")
        if path:
            self.output.setText(str(Path(path) / "sapo-model"))

    def start(self) -> None:
        if self.command.running:
            return
        self._files, self._error = [], ""
        args = [
            "export",
            "--progress-json",
            "--format",
            self.format.currentData(),
            "--quant",
            self.quant.currentData(),
            "--output",
            self.output.text().strip(),
        ]
        if self.run_dir:
            args += ["--run-dir", self.run_dir]
        self.progress.setValue(0)
        self.step.setText("Starting…")
        self.export_button.setEnabled(False)
        self.command.start(args)

    def _on_command_line(self, obj: dict) -> None:
        if "progress" in obj:
            self.progress.setValue(round(100 * float(obj["progress"])))
            self.step.setText(escape(str(obj.get("step", ""))))
        elif "error" in obj:
            self._error = str(obj["error"])
        elif obj.get("done"):
            self._files = [str(f) for f in obj.get("files", [])]

    def _on_command_finished(self, code: int, stderr: str) -> None:
        self.export_button.setEnabled(True)
        if code == 0 and self._files:
            folder = str(Path(self._files[0]).parent)
            self.progress.setValue(100)
            names = ", ".join(Path(f).name for f in self._files)
            self.step.setText(f"Written to <b>{escape(folder)}</b>: {escape(names)}")
            self.exported.emit(True, folder)
            return
        why = self._error or (stderr.splitlines()[-1] if stderr else f"exit code {code}")
        self.step.setText(f"<span style='color:{colours()['error']}'>Export failed: {escape(why)}</span>")
        self.exported.emit(False, why)

    def reject(self) -> None:
        self.command.cancel()
        super().reject()


__all__ = ["ExportDialog", "FORMAT_CHOICES"]
