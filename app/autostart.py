"""Start SAPO Swarm at login (the Settings tab's check box), per platform, for this user only.

- Linux and other freedesktop systems: `$XDG_CONFIG_HOME/autostart/sapo-swarm.desktop` (the
  same entry installer/install.sh --autostart writes), with `--minimized` so it starts in the tray.
- Windows: the `Run` key of the current user (through QSettings' registry format).
- macOS: a LaunchAgent `~/Library/LaunchAgents/org.sapo-swarm.plist` with RunAtLoad.
The command is this interpreter running `app.main`, so it starts the same installation.
"""

from __future__ import annotations

import os
import shlex
import sys
from pathlib import Path

ENTRY = "sapo-swarm"


def command() -> list[str]:
    return [sys.executable, "-m", "app.main", "--minimized"]


def _desktop_file() -> Path:
    base = Path(os.environ.get("XDG_CONFIG_HOME") or Path.home() / ".config")
    return base / "autostart" / f"{ENTRY}.desktop"


def _plist() -> Path:
    return Path.home() / "Library" / "LaunchAgents" / "org.sapo-swarm.plist"


def is_enabled() -> bool:
    if sys.platform == "win32":
        from PySide6.QtCore import QSettings

        run = QSettings(
            r"HKEY_CURRENT_USER\Software\Microsoft\Windows\CurrentVersion\Run", QSettings.Format.NativeFormat
        )
        return run.contains(ENTRY)
    return (_plist() if sys.platform == "darwin" else _desktop_file()).is_file()


def set_enabled(on: bool) -> None:
    """Turn starting at login on or off; raises OSError when the file cannot be written."""
    if sys.platform == "win32":
        from PySide6.QtCore import QSettings

        run = QSettings(
            r"HKEY_CURRENT_USER\Software\Microsoft\Windows\CurrentVersion\Run", QSettings.Format.NativeFormat
        )
        if on:
            run.setValue(ENTRY, " ".join(f'"{a}"' for a in command()))
        else:
            run.remove(ENTRY)
        run.sync()
        return
    path = _plist() if sys.platform == "darwin" else _desktop_file()
    if not on:
        path.unlink(missing_ok=True)
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    if sys.platform == "darwin":
        args = "".join(f"<string>{a}</string>" for a in command())
        text = (
            '<?xml version="1.0" encoding="UTF-8"?>\n<plist version="1.0"><dict>'
            f"<key>Label</key><string>org.sapo-swarm</string><key>ProgramArguments</key><array>{args}</array>"
            "<key>RunAtLoad</key><true/></dict></plist>\n"
        )
    else:
        text = (
            "[Desktop Entry]\nType=Application\nName=SAPO Swarm\n"
            "Comment=Post-train a small language model with a swarm of peers (SAPO)\n"
            f"Exec={shlex.join(command())}\nTerminal=false\nX-GNOME-Autostart-enabled=true\n"
        )
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)


__all__ = ["is_enabled", "set_enabled", "command"]
