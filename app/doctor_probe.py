"""`sapo-node doctor`'s two Qt checks, run in a child Python (`python -c "from app.doctor_probe
import main; main('offscreen')"`) so the engine's own process never imports Qt and a native crash
or a hang is a failed check, not a dead doctor. Each prints one JSON line for its judge
(`sapo_core.commands.doctor_judges.judge_qt`, `doctor_display.judge_display`)."""

from __future__ import annotations

import json
import os


def offscreen() -> dict:
    """Qt draws a label offscreen: the bindings and Qt's own libraries load."""
    os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
    import PySide6
    from PySide6 import QtCore
    from PySide6.QtWidgets import QApplication, QLabel

    _app = QApplication([])  # kept alive until the label is drawn
    label = QLabel("ok")
    label.resize(64, 24)
    image = label.grab()
    return {"pyside": PySide6.__version__, "qt": QtCore.qVersion(), "grab": [image.width(), image.height()]}


def display() -> dict:
    """A window opens on this session's display with the platform the app will use."""
    os.environ.pop("QT_QPA_PLATFORM", None)
    from PySide6 import QtCore
    from PySide6.QtGui import QGuiApplication
    from PySide6.QtWidgets import QApplication, QLabel

    app = QApplication([])
    label = QLabel("ok")
    label.resize(64, 24)
    label.show()
    QtCore.QTimer.singleShot(200, app.quit)
    app.exec()
    return {"platform": QGuiApplication.platformName(), "qt": QtCore.qVersion()}


def main(which: str) -> None:
    print(json.dumps({"offscreen": offscreen, "display": display}[which]()))
