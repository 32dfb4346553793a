"""A PNG of each screen: `python -m app.screenshots DIR` or `sapo-swarm --screenshots DIR [--demo]`.

Renders offscreen (no display needed): the three setup pages (with this computer's real
hardware scan), the window's four tabs, the window showing a node error, and the tray menu.
The dashboard shows the run store of the configured run when it has rounds; otherwise, or
with `--demo`, made-up rounds from app/demo.py, and the window title then says "demo data".
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

SCAN_TIMEOUT_S = 180.0


def _wait(app, done, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while not done() and time.monotonic() < deadline:
        app.processEvents()
        time.sleep(0.02)
    app.processEvents()
    return done()


def _save(widget, out: Path, name: str, app) -> Path:
    app.processEvents()
    path = out / name
    if not widget.grab().save(str(path), "PNG"):
        raise OSError(f"could not write {path}")
    return path


def take_screenshots(out_dir: str | os.PathLike, demo: bool | None = None) -> list[Path]:
    """Write the PNGs; `demo` None = the real run store if it has rounds, else made-up rounds."""
    os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
    from PySide6.QtWidgets import QApplication

    from sapo_core.catalog import CatalogError, load_catalogue
    from sapo_core.config import NodeConfig
    from sapo_core.control import protocol as P

    from app.bridge import WorkerBridge
    from app.demo import demo_node_events, write_demo_store
    from app.history import read_rows, store_path
    from app.settings import UiSettings, has_node_config, load_node_config, with_run_dir
    from app.window import MainWindow
    from app.wizard import SetupWizard

    app = QApplication.instance() or QApplication(sys.argv[:1])
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    shots: list[Path] = []

    # --- the setup wizard, with the real scan ----------------------------------------------------------
    wizard = SetupWizard()
    wizard.show()
    _wait(app, lambda: not wizard.scanner.running() and wizard.scanner.process is not None, SCAN_TIMEOUT_S)
    for i, name in enumerate(("setup-1-computer.png", "setup-2-swarm.png", "setup-3-share.png")):
        wizard._show_page(i)
        shots.append(_save(wizard, out, name, app))
    wizard.close()

    # --- the window --------------------------------------------------------------------------------------
    cfg = with_run_dir(load_node_config()) if has_node_config() else with_run_dir(NodeConfig())
    store = store_path(cfg.run_dir)
    use_demo = demo if demo is not None else not (store.is_file() and read_rows(store))
    with tempfile.TemporaryDirectory(prefix="sapo-shots-") as tmp:
        bridge = WorkerBridge()
        settings = UiSettings(Path(tmp) / "ui.ini")  # the user's own UI settings stay untouched
        window = MainWindow(bridge, settings, use_tray=False)
        window.resize(1180, 800)
        if use_demo:
            store = write_demo_store(Path(tmp), 600)
        window.load_history(store)
        _wait(app, lambda: not window.loader.busy, 60)
        if use_demo:
            for ev in demo_node_events(window.history.last_round):
                bridge._on_relay(ev)  # the GUI-thread entry real events take
        window.setWindowTitle(window.windowTitle() + (" (demo data)" if use_demo else f" ({cfg.run_dir})"))
        if use_demo:  # said inside the picture too: a grab has no title bar
            window.statusBar().showMessage("Demo data for these screenshots: made-up rounds (app/demo.py), "
                                           "not a real run.")
        window.show()
        for index, name in enumerate(("dashboard.png", "swarm.png", "settings.png", "log.png")):
            window.tabs.setCurrentIndex(index)
            shots.append(_save(window, out, name, app))
        window.tabs.setCurrentIndex(0)
        try:
            load_catalogue().get("no-such-model")
            message = "model.name 'no-such-model' is unknown"
        except CatalogError as e:  # the real text the node sends for a model that does not exist
            message = str(e)
        bridge._on_relay(P.Error(message=message, kind=P.CONFIG, fatal=True))
        bridge._on_relay(P.State(state=P.CRASHED, reason=f"{message} (exited with code 2)"))
        shots.append(_save(window, out, "error.png", app))
        if window.tray is None:
            from app.tray import TrayIcon

            tray = TrayIcon(window.windowIcon())
            tray.refresh(window.status)
            tray.menu.adjustSize()
            shots.append(_save(tray.menu, out, "tray-menu.png", app))
            tray.hide()
        window.hide()
        window.deleteLater()
        app.processEvents()
    return shots


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m app.screenshots", description=__doc__.splitlines()[0])
    p.add_argument("dir", help="folder for the PNGs")
    p.add_argument("--demo", action="store_true", help="made-up rounds even if the run store has real ones")
    args = p.parse_args(argv)
    for path in take_screenshots(args.dir, demo=True if args.demo else None):
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
