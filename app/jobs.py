"""One `sapo-node` command run as a child process whose stdout is JSON lines (QProcess).

The app never imports torch; work that needs the model (answering a question, exporting the
trained model) runs as `python -m sapo_core.cli <command> ...` beside the GUI, which reads its
JSON lines as they come and stays responsive.
"""

from __future__ import annotations

import json
import sys

from PySide6.QtCore import QObject, QProcess, Signal


class NodeCommand(QObject):
    line = Signal(dict)
    """One JSON object the command printed."""
    finished = Signal(int, str)
    """(exit code, the end of stderr): the command ended."""

    def __init__(self, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self.process: QProcess | None = None
        self._buffer = b""
        self._stderr = b""

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.state() != QProcess.ProcessState.NotRunning

    def start(self, args: list[str]) -> None:
        if self.running:
            raise RuntimeError("a command is running already")
        self._buffer, self._stderr = b"", b""
        p = QProcess(self)
        p.setProgram(sys.executable)
        p.setArguments(["-m", "sapo_core.cli", *args])
        p.readyReadStandardOutput.connect(self._on_ready_read_standard_output)
        p.readyReadStandardError.connect(self._on_ready_read_standard_error)
        p.finished.connect(self._on_finished)
        p.errorOccurred.connect(self._on_error_occurred)
        self.process = p
        p.start()

    def cancel(self) -> None:
        if self.running:
            self.process.terminate()
            if not self.process.waitForFinished(3000):
                self.process.kill()

    def _on_ready_read_standard_output(self) -> None:
        self._buffer += bytes(self.process.readAllStandardOutput())
        *lines, self._buffer = self._buffer.split(b"\n")
        for raw in lines:
            try:
                obj = json.loads(raw)
            except ValueError:
                continue  # a library's chatter on stdout
            if isinstance(obj, dict):
                self.line.emit(obj)

    def _on_ready_read_standard_error(self) -> None:
        self._stderr = (self._stderr + bytes(self.process.readAllStandardError()))[-4000:]

    def _on_finished(self, code: int, _status: QProcess.ExitStatus) -> None:
        self._on_ready_read_standard_output()
        self.finished.emit(code, self._stderr.decode("utf-8", "replace").strip()[-600:])

    def _on_error_occurred(self, error: QProcess.ProcessError) -> None:
        if error == QProcess.ProcessError.FailedToStart:
            self.finished.emit(-1, f"could not start {sys.executable}")


__all__ = ["NodeCommand"]
