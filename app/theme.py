"""Colours from the system palette, so the app reads on a light and on a dark desktop.

The style sheet and the plots take their colours from here instead of fixed hex values:
fixed dark text (the swarm numbers, log lines, the wizard's subtitle) disappeared on a dark
palette. Curve colours are Okabe-Ito (readable by colour-blind users); on a dark
background its black becomes white and the fills are mixed towards the background.
"""

from __future__ import annotations

from PySide6.QtGui import QColor, QPalette
from PySide6.QtWidgets import QApplication

OKABE_ITO = ("#0072B2", "#D55E00", "#009E73", "#CC79A7", "#E69F00", "#56B4E9", "#000000", "#F0E442", "#999999")
OKABE_ITO_DARK = ("#56B4E9", "#E69F00", "#009E73", "#CC79A7", "#F0E442", "#0072B2", "#FFFFFF", "#D55E00", "#999999")


def palette() -> QPalette:
    app = QApplication.instance()
    return app.palette() if app is not None else QPalette()


def is_dark(pal: QPalette | None = None) -> bool:
    pal = pal or palette()
    return pal.color(QPalette.ColorRole.Window).lightness() < 128


def mix(a: str | QColor, b: str | QColor, t: float) -> str:
    """`a` moved a share `t` towards `b`, as #RRGGBB."""
    ca, cb = QColor(a), QColor(b)
    return QColor(
        round(ca.red() + (cb.red() - ca.red()) * t),
        round(ca.green() + (cb.green() - ca.green()) * t),
        round(ca.blue() + (cb.blue() - ca.blue()) * t),
    ).name()


def colours(pal: QPalette | None = None) -> dict[str, str]:
    """Named colours for text, panels, errors and plots, from the palette."""
    pal = pal or palette()
    dark = is_dark(pal)
    text = pal.color(QPalette.ColorRole.WindowText).name()
    window = pal.color(QPalette.ColorRole.Window).name()
    base = pal.color(QPalette.ColorRole.Base).name()
    return {
        "text": text,
        "window": window,
        "base": base,
        "muted": mix(text, window, 0.35),
        "panel": mix(window, text, 0.05),
        "border": mix(window, text, 0.2),
        "error": "#FF8A80" if dark else "#B42318",
        "error_bg": mix(window, "#E5484D", 0.18),
        "error_border": mix(window, "#E5484D", 0.5),
        "ok": "#7EE2A8" if dark else "#1A7F37",
        "plot_bg": base,
        "plot_fg": text,
        "raw": mix(base, text, 0.3),
        "marker": mix(base, text, 0.45),
    }


def status_colours(pal: QPalette | None = None) -> dict[str, str]:
    """Text colours with a meaning (ok, warning, error, info, command, plain) that read on the palette."""
    if is_dark(pal):
        return {
            "ok": "#7EE2A8",
            "warning": "#F2C94C",
            "error": "#FF8A80",
            "info": "#8AB4F8",
            "command": "#C58AF9",
            "plain": colours(pal)["text"],
            "muted": colours(pal)["muted"],
        }
    return {
        "ok": "#1B7F3B",
        "warning": "#9A6700",
        "error": "#B42318",
        "info": "#1F4E99",
        "command": "#5B3E96",
        "plain": colours(pal)["text"],
        "muted": colours(pal)["muted"],
    }


def curve_colours(pal: QPalette | None = None) -> tuple[str, ...]:
    return OKABE_ITO_DARK if is_dark(pal) else OKABE_ITO


def style_sheet(pal: QPalette | None = None) -> str:
    c = colours(pal)
    return f"""
QLabel#bigNumber {{ font-size: 20pt; font-weight: 600; color: {c["text"]}; }}
QLabel#errorText {{ color: {c["error"]}; }}
QFrame#errorBanner {{ background: {c["error_bg"]}; border: 1px solid {c["error_border"]}; border-radius: 4px; }}
QFrame#errorBanner QLabel {{ color: {c["text"]}; }}
QFrame#statusPanel, QFrame#card {{ background: {c["panel"]}; border: 1px solid {c["border"]}; border-radius: 4px; }}
QFrame#card QLabel {{ border: none; background: transparent; }}
QLabel#cardTitle {{ color: {c["muted"]}; font-size: 9pt; }}
QLabel#cardValue {{ font-size: 14pt; font-weight: 600; color: {c["text"]}; }}
QLabel#reasonLabel {{ color: {c["text"]}; font-size: 11pt; }}
QLabel#resourcesLabel {{ color: {c["muted"]}; }}
"""


def dark_palette() -> QPalette:
    """A dark palette (the screenshots' dark variant; what a dark desktop theme gives Qt)."""
    p = QPalette()
    R = QPalette.ColorRole
    for role, colour in (
        (R.Window, "#202124"),
        (R.WindowText, "#E8EAED"),
        (R.Base, "#33363B"),
        (R.AlternateBase, "#3A3D42"),
        (R.Text, "#E8EAED"),
        (R.Button, "#2D2E31"),
        (R.ButtonText, "#E8EAED"),
        (R.Highlight, "#3B82F6"),
        (R.HighlightedText, "#FFFFFF"),
        (R.ToolTipBase, "#2D2E31"),
        (R.ToolTipText, "#E8EAED"),
        (R.PlaceholderText, "#9AA0A6"),
        (R.Link, "#8AB4F8"),
        (R.BrightText, "#FFFFFF"),
        (R.Mid, "#3C4043"),
        (R.Dark, "#111111"),
        (R.Light, "#5F6368"),
        (R.Midlight, "#4A4D51"),
        (R.Shadow, "#000000"),
    ):
        p.setColor(role, QColor(colour))
    for role in (R.WindowText, R.Text, R.ButtonText):
        p.setColor(QPalette.ColorGroup.Disabled, role, QColor("#80868B"))
    return p


__all__ = ["status_colours", "colours", "curve_colours", "is_dark", "mix", "style_sheet", "dark_palette", "palette"]
