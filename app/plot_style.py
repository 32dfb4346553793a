"""How the dashboard's plots and curves look in pyqtgraph: pens, fills, titles with their legend, axes.

app/dashboard.py makes its plots and curves here from the rows of app/curves.py's tables and
then only feeds them data. Colours come from the system palette (app/theme.py).
"""

from __future__ import annotations

import pyqtgraph as pg
from PySide6.QtCore import Qt
from PySide6.QtWidgets import QGraphicsItem

from app import theme
from app.curves import BAND, Curve, Plot
from sapo_core.control.vocabulary import PHASE_BANDS

PALETTE = theme.OKABE_ITO  # the light palette's curve colours (theme.curve_colours() for the current one)
LEVEL_CHANGE = "level change"  # the legend's name of the curriculum marks


def configure_pyqtgraph() -> None:
    c = theme.colours()
    pg.setConfigOptions(background=c["plot_bg"], foreground=c["plot_fg"], antialias=False, useNumba=False)


def tint(color: str, share: float) -> str:
    """The colour mixed with `share` of the plot background: opaque fills that stay behind the lines."""
    return theme.mix(color, theme.colours()["plot_bg"], share)


def pen(i: int, width: float = 2.0) -> pg.QtGui.QPen:
    """The `i`-th curve colour of the current palette."""
    colours = theme.curve_colours()
    return pg.mkPen(colours[i % len(colours)], width=width)


def new_plot(spec: Plot) -> pg.PlotItem:
    """An empty plot of the table's row `spec`: its labels, grid and axes (the round axis is the
    dashboard's to set; y follows the data)."""
    p = pg.PlotItem()
    p.setLabel("left", spec.y_label)
    p.showGrid(x=True, y=True, alpha=0.25)
    p.setLabel("bottom", "round")
    p.setMenuEnabled(False)
    p.enableAutoRange(x=False)
    if spec.share:
        p.setYRange(0, 1, padding=0.02)
    p.getAxis("left").setWidth(58)
    p.getAxis("left").enableAutoSIPrefix(False)  # "(x0.001)" beside a reward reads as an error
    # axes (with their grid) and titles change only when a range or a name does: keep them as
    # pixmaps instead of replaying their text every frame (halves a redraw: sapo-bench gui)
    for item in (p.getAxis("left"), p.getAxis("bottom"), p.titleLabel):
        item.setCacheMode(QGraphicsItem.CacheMode.DeviceCoordinateCache)
    return p


def new_curve(spec: Curve) -> pg.PlotCurveItem:
    """The curve of the table's row `spec`: its pen, and its fill where it has one.

    A bare curve item, not pyqtgraph's PlotDataItem: the curves get data already binned for the
    screen, and PlotDataItem's bookkeeping around each setData cost more than the curve's own
    (sapo-bench gui); dots for short histories are a scatter item of their own."""
    if isinstance(spec.colour, str):
        colour = theme.colours()[spec.colour]
    else:
        colour = theme.curve_colours()[spec.colour % len(theme.curve_colours())]
    style = Qt.PenStyle.DashLine if spec.dashed else Qt.PenStyle.SolidLine
    c = pg.PlotCurveItem(pen=pg.mkPen(colour, width=spec.width, style=style), skipFiniteCheck=True)
    if spec.fill:  # without a brush (speed) this only keeps 0 in the y range
        c.setFillLevel(0)
    if spec.how == BAND:  # opaque fills that stay behind the lines; the first band on top
        c.setBrush(pg.mkBrush(tint(PALETTE[spec.colour % len(PALETTE)], 0.45)))
        c.setZValue(len(PHASE_BANDS) - spec.colour)
    return c


def level_marks() -> tuple[pg.PlotDataItem, str]:
    """Dotted vertical lines where a curriculum level changed, and their legend colour."""
    colour = theme.colours()["marker"]
    return pg.PlotDataItem(pen=pg.mkPen(colour, width=1, style=Qt.PenStyle.DotLine), connect="finite"), colour


def title_html(title: str, legend: list[tuple[str, str]]) -> str:
    """The title, with the legend (name, colour) under it: a legend box inside the plot would hide data."""
    entries = [f"<span style='color:{color}'>■</span>&nbsp;{name}" for name, color in legend]
    lines = [" &nbsp; ".join(entries[i : i + 3]) for i in range(0, len(entries), 3)]
    return f"{title}<br><span style='font-size:8pt'>{'<br>'.join(lines)}</span>"


__all__ = ["PALETTE", "configure_pyqtgraph", "tint", "pen", "new_plot", "new_curve", "level_marks", "title_html"]
