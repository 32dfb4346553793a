"""A PNG of each screen: `python -m app.screenshots DIR` or `sapo-swarm --screenshots DIR [--demo]`.

Renders offscreen (no display needed): the three setup pages (with this computer's real
hardware scan), the window's five tabs, the window showing a node error, the tray menu, and
(with demo data) the bar a new release brings;
then the setup pages and the window again on a dark palette (`-dark`) and the window at
1000 x 640 (`-small`), the two cases a review of the screens found unreadable.
The dashboard shows the run store of the configured run when it has rounds; otherwise, or
with `--demo`, made-up rounds from app/demo.py, and the window title then says "demo data".
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import tempfile
import time
from pathlib import Path

SCAN_TIMEOUT_S = 180.0
DEMO_SCHEDULE = "mon-fri 18:00-08:00; sat-sun 00:00-24:00"


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

    from app.history import read_rows, store_path
    from app.settings import has_node_config, load_node_config, with_run_dir
    from app.theme import dark_palette
    from app.wizard import SetupWizard
    from sapo_core.config import NodeConfig

    app = QApplication.instance() or QApplication(sys.argv[:1])
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    shots: list[Path] = []
    light = app.palette()
    cfg = with_run_dir(load_node_config()) if has_node_config() else with_run_dir(NodeConfig())
    store = store_path(cfg.run_dir)
    use_demo = demo if demo is not None else not (store.is_file() and read_rows(store))
    for suffix, palette, size in (
        ("", light, (1180, 800)),
        ("-dark", dark_palette(), (1180, 800)),
        ("-small", light, (1000, 640)),
    ):
        app.setPalette(palette)
        # --- the setup wizard, with the real scan ------------------------------------------------------
        if suffix != "-small":
            wizard = SetupWizard()
            wizard.show()
            _wait(app, lambda w=wizard: not w.scanner.running() and w.scanner.process is not None, SCAN_TIMEOUT_S)
            for i, name in enumerate(("setup-1-computer", "setup-2-swarm", "setup-3-share")):
                wizard._show_page(i)
                shots.append(_save(wizard, out, f"{name}{suffix}.png", app))
            wizard.close()
        shots += _window_shots(app, out, suffix, size, use_demo, cfg, store)
    app.setPalette(light)
    return shots


def _window_shots(app, out: Path, suffix: str, size: tuple[int, int], use_demo: bool, cfg, store: Path) -> list[Path]:
    from app.bridge import WorkerBridge
    from app.demo import demo_node_events, demo_try_result, write_demo_store
    from app.settings import UiSettings
    from app.window import TABS, MainWindow
    from sapo_core.catalog import CatalogError, load_catalogue
    from sapo_core.control import protocol as P

    shots: list[Path] = []
    with tempfile.TemporaryDirectory(prefix="sapo-shots-") as tmp:
        bridge = WorkerBridge()
        settings = UiSettings(Path(tmp) / "ui.ini")  # the user's own UI settings stay untouched
        window = MainWindow(bridge, settings, use_tray=False)
        window.resize(*size)
        if use_demo:
            store = write_demo_store(Path(tmp), 600)
        window.load_history(store)
        _wait(app, lambda: not window.loader.busy, 60)
        if use_demo:
            for ev in demo_node_events(window.history.last_round):
                bridge._on_relay(ev)  # the GUI-thread entry real events take
            window.try_view.show_result(demo_try_result())
            # the Settings tab's weekly grid with a schedule in it (shown, not applied or saved)
            window.share.set_control(
                dataclasses.replace(window.share.control, schedule=DEMO_SCHEDULE), window.share.threads
            )
        window.setWindowTitle(window.windowTitle() + (" (demo data)" if use_demo else f" ({cfg.run_dir})"))
        if use_demo:  # said inside the picture too: a grab has no title bar
            window.statusBar().showMessage(
                "Demo data for these screenshots: made-up rounds (app/demo.py), not a real run."
            )
        window.show()
        _wait(app, lambda: not window.dashboard.cards.loader.busy, 10)
        for index, name in enumerate(TABS):
            window.tabs.setCurrentIndex(index)
            shots.append(_save(window, out, f"{name.lower().replace(' ', '-')}{suffix}.png", app))
        window.tabs.setCurrentIndex(0)
        if use_demo:  # the bar a new release brings (a made-up one, like the rest of the demo)
            from sapo_core.updates import Release

            bar = window.update_flow.bar
            bar.offer(Release("0.2.0", "Made-up notes for the screenshots: rounds a third faster."), True)
            shots.append(_save(window, out, f"update{suffix}.png", app))
            bar.hide()
        try:
            load_catalogue().get("no-such-model")
            message = "model.name 'no-such-model' is unknown"
        except CatalogError as e:  # the real text the node sends for a model that does not exist
            message = str(e)
        bridge._on_relay(P.Error(message=message, kind=P.CONFIG, fatal=True))
        bridge._on_relay(P.State(state=P.CRASHED, reason=f"{message} (exited with code 2)"))
        shots.append(_save(window, out, f"error{suffix}.png", app))
        if window.tray is None and suffix != "-small":
            from app.tray import TrayIcon

            tray = TrayIcon(window.windowIcon())
            tray.refresh(window.status)
            tray.menu.adjustSize()
            shots.append(_save(tray.menu, out, f"tray-menu{suffix}.png", app))
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
