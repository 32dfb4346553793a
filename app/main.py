"""`sapo-swarm`: the desktop app.

    sapo-swarm                    first run: the setup wizard; then the window and the tray icon
    sapo-swarm --setup            the setup wizard again
    sapo-swarm --screenshots DIR  a PNG of each screen into DIR (see app/screenshots.py)
    sapo-swarm --headless         no window: run the node in this terminal (`sapo-node run`)
    sapo-swarm sapo://join/...    the setup wizard with this invitation (the desktop entry's %u)

Without a display (Linux with neither DISPLAY nor WAYLAND_DISPLAY, and QT_QPA_PLATFORM not
asking for an offscreen platform) it says so and runs the node headless. One app runs per data
directory: a second launch shows the first one's window and exits.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
from collections.abc import Mapping

HEADLESS_PLATFORMS = ("offscreen", "minimal", "vnc", "eglfs", "linuxfb")


def display_available(env: Mapping[str, str] = os.environ, platform: str = sys.platform) -> bool:
    """Whether Qt can show a window here."""
    qpa = env.get("QT_QPA_PLATFORM", "").split(":")[0]
    if qpa in HEADLESS_PLATFORMS:
        return True  # asked for a platform without a display server: it works anywhere
    if platform.startswith(("linux", "freebsd", "openbsd", "netbsd")):
        return bool(env.get("DISPLAY") or env.get("WAYLAND_DISPLAY"))
    return True  # Windows and macOS always have their window system


def display_problem() -> str:
    """Why the window cannot open on this session's display, found before Qt tries: Qt's xcb or
    wayland plugin aborts the process when a system library it needs is missing, with the reason
    on stderr only, which nobody sees when the app starts from a menu. '' when nothing is known
    to be missing (sapo-node doctor's display check, without opening a window)."""
    from sapo_core.commands.doctor import _soname_package, display_platform, missing_platform_libraries

    platform = display_platform()
    if platform not in ("xcb", "wayland"):
        return ""
    missing = missing_platform_libraries(platform)
    if not missing:
        return ""
    packages = " ".join(_soname_package(m) for m in missing)
    return (
        f"SAPO Swarm cannot open its window: Qt's {platform} display support needs {', '.join(missing)}, "
        f"which this system lacks. Install them (Debian/Ubuntu: sudo apt install {packages}) and start "
        "SAPO Swarm again; `sapo-node doctor` checks it. Until then `sapo-node run` trains without a window."
    )


def tell_outside_qt(message: str) -> str:
    """Show a message without Qt (which cannot start): a desktop notification or a dialog from
    whatever this system has. The name of the tool used, '' if none was found."""
    import shutil
    import subprocess

    for cmd in (
        ["notify-send", "--urgency=critical", "--app-name=SAPO Swarm", "SAPO Swarm", message],
        ["zenity", "--error", "--title=SAPO Swarm", f"--text={message}"],
        ["kdialog", "--title", "SAPO Swarm", "--error", message],
        ["xmessage", "-center", message],
    ):
        if shutil.which(cmd[0]):
            try:
                subprocess.Popen(
                    cmd,
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                    start_new_session=True,
                )
                return cmd[0]
            except OSError:
                continue
    return ""


def run_headless(reason: str) -> int:
    from app.settings import node_config_path

    cfg = node_config_path()
    where = f"settings from {cfg}" if cfg.is_file() else "default settings; `sapo-node run --help` for options"
    print(
        f"sapo-swarm: {reason}: running the node headless, as `sapo-node run` ({where}). Stop it with Ctrl-C.",
        flush=True,
    )
    from sapo_core.cli import main as node_main

    return node_main(["run"])


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="sapo-swarm", description="SAPO Swarm: train a small language model with a swarm of volunteers' computers"
    )
    p.add_argument("--setup", action="store_true", help="show the setup wizard even if a config exists")
    p.add_argument("--headless", action="store_true", help="no window: run the node in this terminal")
    p.add_argument("--screenshots", metavar="DIR", help="write a PNG of each screen to DIR and exit")
    p.add_argument("--demo", action="store_true", help="with --screenshots: use made-up rounds, not the run store")
    p.add_argument(
        "--minimized", action="store_true", help="start in the tray, without the window (how start at login runs it)"
    )
    p.add_argument(
        "invitation",
        nargs="?",
        default="",
        help="an invitation link (sapo://join/...) to open in the setup; the desktop entry passes it",
    )
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(list(sys.argv[1:] if argv is None else argv))
    if args.screenshots:
        os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
        from app.screenshots import take_screenshots

        for path in take_screenshots(args.screenshots, demo=True if args.demo else None):
            print(path)
        return 0
    if args.headless:
        return run_headless("--headless")
    if not display_available():
        return run_headless("no display found (DISPLAY and WAYLAND_DISPLAY are not set)")
    problem = display_problem()
    if problem:  # said where a person started from a menu sees it, not only on stderr
        print(f"sapo-swarm: {problem}", file=sys.stderr)
        tell_outside_qt(problem)
        return 1
    return run_gui(args.setup or bool(args.invitation), minimized=args.minimized, invitation=args.invitation)


def run_gui(force_setup: bool = False, minimized: bool = False, invitation: str = "") -> int:
    from PySide6.QtCore import QTimer
    from PySide6.QtWidgets import QApplication

    from app import APP_NAME, ORG_NAME
    from app.bridge import WorkerBridge
    from app.settings import UiSettings, has_node_config, save_node_config
    from app.single import SingleInstance
    from app.window import MainWindow, app_icon

    app = QApplication.instance() or QApplication(sys.argv)
    from app.qtcheck import binding_problem

    problem = binding_problem()
    if problem:
        from PySide6.QtWidgets import QMessageBox

        print(f"sapo-swarm: {problem}", file=sys.stderr)
        QMessageBox.critical(None, APP_NAME, problem)
        return 1
    app.setApplicationName(APP_NAME)
    app.setOrganizationName(ORG_NAME)
    app.setDesktopFileName("sapo-swarm")
    app.setWindowIcon(app_icon())
    app.setQuitOnLastWindowClosed(False)  # the tray keeps the app; the window's Quit leaves
    single = SingleInstance()
    if not single.acquire():
        print(
            "sapo-swarm: already running for this data directory; its window was asked to show."
            + (" To use the invitation, paste it in Setup again… there." if invitation else "")
        )
        return 0
    bridge = WorkerBridge()
    settings = UiSettings()
    windows: list[MainWindow] = []

    def open_window() -> None:
        window = MainWindow(bridge, settings)
        single.activated.connect(window.bring_to_front)
        windows.append(window)
        if not (minimized and window.tray is not None and window.tray.available):
            window.show()
        window.start_node()
        # Ctrl-C in the terminal that started the app quits cleanly (the node stops first)
        signal.signal(signal.SIGINT, lambda *_: window.request_quit())

    signal.signal(signal.SIGINT, lambda *_: app.quit())  # Ctrl-C before the window is up
    if force_setup or not has_node_config():
        from app.wizard import SetupWizard

        wizard = SetupWizard(invitation=invitation)
        wizard.joined.connect(lambda cfg: (save_node_config(cfg), open_window()))
        wizard.rejected.connect(app.quit)
        wizard.show()
    else:
        open_window()
    ticker = QTimer(interval=250)  # lets Python run its signal handlers while Qt waits
    ticker.timeout.connect(lambda: None)
    ticker.start()
    code = app.exec()
    if bridge.running:
        bridge.stop_and_wait()
    settings.sync()
    single.release()
    return code


if __name__ == "__main__":
    sys.exit(main())
