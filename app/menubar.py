"""The main window's menu bar (Node, View, Help) and the Help menu's two dialogs.

Every action calls a slot of the window (app/window.py); the View menu's shortcuts follow the
tabs' order (`window.TABS`).
"""

from __future__ import annotations

from PySide6.QtGui import QAction

from app import APP_NAME
from app.banner import ABOUT_TEXT, HELP_TEXT


def build_menu_bar(window) -> None:
    """Fill `window`'s menu bar (a MainWindow)."""
    from app.window import TABS

    sep = (None, None, "")
    menus = {
        "&Node": (
            ("Start", window._on_start_requested, "Ctrl+R"),
            ("Stop", window._on_stop_action_triggered, ""),
            ("Setup again…", window.open_setup, ""),
            sep,
            ("Export the trained model…", window.open_export, "Ctrl+E"),
            sep,
            ("Export plots as PNG…", window.dashboard._on_png_button_clicked, ""),
            ("Export rounds as CSV…", window.dashboard._on_csv_button_clicked, ""),
            sep,
            ("Quit (stops the node)", window.request_quit, "Ctrl+Q"),
        ),
        "&View": tuple(
            (name, lambda _=False, i=i: window.tabs.setCurrentIndex(i), f"Ctrl+{i + 1}") for i, name in enumerate(TABS)
        ),
        "&Help": (
            ("How SAPO Swarm works", lambda _=False: show_help(window), "F1"),
            ("About SAPO Swarm", lambda _=False: show_about(window), ""),
        ),
    }
    for title, actions in menus.items():
        menu = window.menuBar().addMenu(title)
        for text, slot, keys in actions:
            if text is None:
                menu.addSeparator()
                continue
            action = QAction(text, window)
            action.setShortcut(keys)
            action.triggered.connect(slot)
            menu.addAction(action)


def show_help(parent) -> None:
    from PySide6.QtWidgets import QMessageBox

    QMessageBox.information(parent, "How SAPO Swarm works", HELP_TEXT)


def show_about(parent) -> None:
    from importlib.metadata import PackageNotFoundError, version

    from PySide6.QtWidgets import QMessageBox

    try:
        v = version("sapo-swarm")
    except PackageNotFoundError:
        v = "(not installed)"
    QMessageBox.about(parent, f"About {APP_NAME}", f"<b>{APP_NAME}</b> {v}<br>{ABOUT_TEXT}")


__all__ = ["build_menu_bar", "show_about", "show_help"]
