"""The event log, and "Copy diagnostics": everything a bug report needs, in one paste.

`LogView` shows an `EventLog` (states with reasons, rounds, commands, the node's own log and
errors). `diagnostics_text` gathers the versions, the node's identity and state, its last
crash with the tail of its stderr, the config and the log into plain text.
"""

from __future__ import annotations

import platform
import sys
import time
from collections.abc import Callable

from PySide6.QtCore import Signal, qVersion
from PySide6.QtGui import QFont, QFontDatabase, QGuiApplication
from PySide6.QtWidgets import QHBoxLayout, QLabel, QPlainTextEdit, QPushButton, QVBoxLayout, QWidget

from app.eventlog import EventLog, LogLine
from app.models import NodeStatus
from sapo_core.config import NodeConfig, dump_config
from sapo_core.control import protocol as P
from sapo_core.control.client import CrashReport

MAX_LINES = 5000


def diagnostics_text(
    log: EventLog,
    status: NodeStatus,
    config: NodeConfig | None,
    hello: P.Hello | None,
    info: P.NodeInfo | None,
    crash: CrashReport | None,
    stderr_tail: list[str],
    config_path: str = "",
) -> str:
    """Plain text for a bug report: versions, node, last crash, config, recent log."""
    try:
        from importlib.metadata import version

        app_version = version("sapo-swarm")
    except Exception:
        app_version = "unknown"
    out = [
        f"SAPO Swarm diagnostics, {time.strftime('%Y-%m-%d %H:%M:%S %z')}",
        f"app {app_version}; python {sys.version.split()[0]}; {platform.platform()}; Qt {qVersion()}; "
        f"control protocol {P.PROTOCOL_VERSION}",
        "",
        f"node state: {status.state}" + (f" ({status.reason})" if status.reason else "") + f", round {status.round}",
    ]
    if hello is not None:
        out.append(f"node process: pid {hello.pid}, python {hello.python}, package {hello.package_version}")
    if info is not None:
        out.append(
            f"node: model {info.model_id}, sampler {info.sampler}, run dir {info.run_dir}, "
            f"peer id {info.peer_id or '(alone)'}, name {info.node_name or '-'}"
        )
    if crash is not None:
        out += [
            "",
            f"last crash: {crash.reason}",
            f"  exit code {crash.returncode}, signal {crash.signal or '-'}, "
            f"at {time.strftime('%H:%M:%S', time.localtime(crash.when))}",
        ]
        if crash.traceback:
            out += ["  traceback:", *("    " + ln for ln in crash.traceback.rstrip().splitlines())]
    if stderr_tail:
        out += ["", "last lines of the node's stderr:", *("  " + ln for ln in stderr_tail)]
    if config is not None:
        out += ["", f"config ({config_path or 'not saved'}):", dump_config(config).rstrip()]
    out += ["", "event log (newest last):", log.text(last=300)]
    return "\n".join(out) + "\n"


class LogView(QWidget):
    diagnostics_copied = Signal(str)
    """The diagnostics text went to the clipboard."""

    def __init__(self, log: EventLog, diagnostics: Callable[[], str], parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.log = log
        self.diagnostics = diagnostics
        self.text = QPlainTextEdit(readOnly=True)
        self.text.setMaximumBlockCount(MAX_LINES)
        font = QFontDatabase.systemFont(QFontDatabase.SystemFont.FixedFont)
        font.setStyleHint(QFont.StyleHint.Monospace)
        self.text.setFont(font)
        self.copy_button = QPushButton("Copy diagnostics")
        self.copy_button.setToolTip(
            "Copy versions, the node's state, its last crash, the config and this log for a bug report"
        )
        self.copy_button.clicked.connect(self._on_copy_button_clicked)
        self.copied_label = QLabel()
        row = QHBoxLayout()
        row.addWidget(QLabel("What the node and the app did, newest at the bottom."), 1)
        row.addWidget(self.copied_label)
        row.addWidget(self.copy_button)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(8, 8, 8, 8)
        layout.addLayout(row)
        layout.addWidget(self.text, 1)
        for line in log.lines:
            self.append(line)

    def append(self, line: LogLine) -> None:
        from app.theme import status_colours

        c = status_colours()  # from the palette: fixed dark text vanished on a dark desktop
        color = {"error": c["error"], "warning": c["warning"], "state": c["info"], "command": c["command"]}.get(
            line.level, c["plain"]
        )
        text = line.format().replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
        self.text.appendHtml(f"<span style='white-space:pre; color:{color}'>{text}</span>")

    def _on_copy_button_clicked(self) -> None:
        text = self.diagnostics()
        QGuiApplication.clipboard().setText(text)
        self.copied_label.setText(f"copied {len(text.splitlines())} lines")
        self.diagnostics_copied.emit(text)


__all__ = ["LogView", "diagnostics_text"]
