"""The dashboard's "Your contribution by day": what this computer gave, day by day.

Three layers on one clock-time axis (pyqtgraph's DateAxisItem, local time), the last 14 days:
- bars: hours running per day (each bar spans its calendar day);
- peers' receipts per day, on the right axis (hidden while training alone, like the other peer plots);
- under them, a strip of the running intervals: consecutive rounds merged, so every gap is a pause,
  a stop or the computer being off (sapo_core/daily.py says what counts as a gap).

Bars show hours running, not CPU-hours: hours are what a volunteer lends and remembers ("it ran all
afternoon"), they compare across days and machines on one scale (0 to 24 h) and line up with the
strip under them. CPU-hours depend on the cores and threads given; the card above and
`sapo-node stats` count them.

The figures are `sapo-node stats`' "daily" part, read on a thread by the headline cards'
StatsLoader after each round: the plot changes only when they arrive, never in the dashboard's
per-round redraw (`sapo-bench gui`).
"""

from __future__ import annotations

import datetime as dt
import math
from typing import Any

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import Qt
from PySide6.QtWidgets import QGraphicsItem

from app import theme

BARS_MIN_PX = 170  # the bars' plot, title and legend included
STRIP_PX = 64  # the running strip with the date axis under it
BAR_GAP = 0.08  # share of a day left empty on each side of its bar
AXIS_PX = 58  # the dashboard's left axis width: the plots' left edges line up
DAY_NAMES_FROM_DAYS = 3.0  # from this many days shown the axis names days; below, the clock's hours


class DayAxis(pg.DateAxisItem):
    """A clock-time axis that names each day under the middle of its bar ("Mon 16") with a tick at
    every midnight, while days are shown; zoomed into a day or two, DateAxisItem's own clock times.
    (DateAxisItem labels midnight, the edge between two bars: which day does "19" name?)"""

    def tickValues(self, minVal, maxVal, size):  # noqa: N802, N803 (pyqtgraph's names)
        self.naming_days = size > 0 and (maxVal - minVal) / 86400 >= DAY_NAMES_FROM_DAYS
        if not self.naming_days:
            return super().tickValues(minVal, maxVal, size)
        first, last = dt.date.fromtimestamp(minVal), dt.date.fromtimestamp(maxVal)
        dates = [first + dt.timedelta(days=k) for k in range((last - first).days + 2)]
        midnights = [t for t in (dt.datetime.combine(d, dt.time()).timestamp() for d in dates) if minVal <= t <= maxVal]
        noons = [t for t in (dt.datetime.combine(d, dt.time(12)).timestamp() for d in dates) if minVal <= t <= maxVal]
        label_px = self.fontMetrics.boundingRect("Wed 30").width() + 12
        step = max(1, math.ceil(label_px / (size / max(1.0, (maxVal - minVal) / 86400))))
        named = noons[::-1][::step][::-1]  # every step-th day, today always named
        # midnights first: the major level draws the stronger grid line, the day's edge
        return [(86400.0, midnights), (86400.0 * step + 1, named)]

    def tickStrings(self, values, scale, spacing):  # noqa: N802
        if not getattr(self, "naming_days", False):  # zoomed in: DateAxisItem's clock times
            return super().tickStrings(values, scale, spacing)
        return [
            dt.datetime.fromtimestamp(v).strftime("%a %d") if dt.datetime.fromtimestamp(v).hour == 12 else ""
            for v in values
        ]


class ContributionByDay(pg.GraphicsLayout):
    """Bars per day over a strip of running intervals; `set_daily` with the stats' "daily" dict."""

    def __init__(self) -> None:
        super().__init__()
        colours = theme.curve_colours()
        bg = theme.colours()["plot_bg"]
        self._colours = {"hours": colours[0], "receipts": colours[1], "running": colours[2]}
        self._alone = True
        self.daily: dict[str, Any] | None = None
        self._days_shown = (0.0, 0.0)
        self.setContentsMargins(0, 0, 0, 0)
        self.layout.setVerticalSpacing(0)
        self._build_bars(bg)
        self._build_strip()
        for plot in (self.bars_plot, self.strip_plot):
            plot.setMenuEnabled(False)
            plot.setMouseEnabled(x=True, y=False)  # zoom into a day with the wheel; hours stay put
            plot.hideButtons()
            plot.getAxis("left").setWidth(AXIS_PX)
            plot.showAxis("right")
            plot.getAxis("right").setWidth(AXIS_PX)  # the strip's right edge lines up with the bars'
            for item in (plot.getAxis("left"), plot.getAxis("bottom"), plot.getAxis("right"), plot.titleLabel):
                item.setCacheMode(QGraphicsItem.CacheMode.DeviceCoordinateCache)
        self.strip_plot.getAxis("right").setStyle(showValues=False)
        self.strip_plot.getAxis("right").setTicks([[]])
        self.addItem(self.bars_plot, row=0, col=0)
        self.addItem(self.strip_plot, row=1, col=0)
        self.set_alone(False)

    def _build_bars(self, bg: str) -> None:
        """The upper plot: hours running per day as bars, peers' receipts as dots on a right axis."""
        self.bars_plot = pg.PlotItem(axisItems={"bottom": DayAxis()})
        self.bars_plot.setLabel("left", "hours running")
        self.bars_plot.getAxis("bottom").setStyle(showValues=False)  # the strip's axis below has the dates
        self.bars_plot.showGrid(y=True, alpha=0.25)  # the bars mark the days
        self.bars_plot.setMinimumHeight(BARS_MIN_PX)
        self.bars = pg.BarGraphItem(
            x0=[],
            x1=[],
            height=[],
            pen=pg.mkPen(self._colours["hours"], width=1),
            brush=pg.mkBrush(theme.mix(self._colours["hours"], bg, 0.35)),
        )
        self.bars_plot.addItem(self.bars)

        # receipts on a second view box over the bars, with its own (right) axis
        self.receipts_view = pg.ViewBox(enableMouse=False)
        self.receipts_view.setParentItem(self.bars_plot)
        self.receipts_view.setXLink(self.bars_plot)
        self.bars_plot.getAxis("right").linkToView(self.receipts_view)
        self.bars_plot.getAxis("right").setLabel("receipts")
        # a dot per day with receipts (a line through the days without any would zigzag to zero)
        self.receipts = pg.PlotDataItem(
            pen=None,
            symbol="o",
            symbolSize=8,
            symbolPen=pg.mkPen(theme.colours()["plot_bg"], width=1),
            symbolBrush=self._colours["receipts"],
        )
        self.receipts_view.addItem(self.receipts)
        self.bars_plot.getViewBox().sigResized.connect(self._on_view_box_resized)

    def _build_strip(self) -> None:
        """The lower strip: the running intervals on the same clock-time axis, and a line at now."""
        self.strip_plot = pg.PlotItem(axisItems={"bottom": DayAxis()})
        self.strip_plot.setLabel("left", "running")
        self.strip_plot.getAxis("left").setStyle(showValues=False)
        self.strip_plot.getAxis("left").setTicks([[]])
        self.strip_plot.showGrid(x=True, alpha=0.25)
        self.strip_plot.setYRange(0, 1, padding=0)
        self.strip_plot.setXLink(self.bars_plot)
        self.strip_plot.setMinimumHeight(STRIP_PX)
        self.strip_plot.setMaximumHeight(STRIP_PX)
        # a cosmetic 1 px outline: a run of a few minutes stays visible over two weeks
        self.running = pg.BarGraphItem(
            x0=[],
            x1=[],
            y0=0.15,
            height=0.7,
            pen=pg.mkPen(self._colours["running"], width=1),
            brush=pg.mkBrush(self._colours["running"]),
        )
        self.strip_plot.addItem(self.running)
        self.now_line = pg.InfiniteLine(
            angle=90, pen=pg.mkPen(theme.colours()["marker"], width=1, style=Qt.PenStyle.DotLine)
        )
        self.now_line.setVisible(False)
        self.strip_plot.addItem(self.now_line, ignoreBounds=True)

    def _on_view_box_resized(self) -> None:
        self.receipts_view.setGeometry(self.bars_plot.getViewBox().geometry())

    def set_alone(self, alone: bool) -> None:
        """While training alone no peer sends receipts: their axis and points are left out."""
        if alone == self._alone:
            return
        self._alone = alone
        self.receipts_view.setVisible(not alone)
        self.bars_plot.getAxis("right").setStyle(showValues=not alone)
        self.bars_plot.getAxis("right").setLabel("" if alone else "receipts")
        entries = (
            [("hours running", self._colours["hours"])]
            + ([] if alone else [("receipts from peers (right axis)", self._colours["receipts"])])
            + [("running: gaps are pauses", self._colours["running"])]
        )
        legend = " &nbsp; ".join(f"<span style='color:{c}'>■</span>&nbsp;{n}" for n, c in entries)
        self.bars_plot.setTitle(f"Your contribution by day<br><span style='font-size:8pt'>{legend}</span>")

    def set_daily(self, daily: dict[str, Any] | None) -> None:
        """Show `sapo-node stats`' "daily" figures; the same figures again cost nothing."""
        if not daily or not daily.get("days") or daily == self.daily:
            return
        self.daily = daily
        days = daily["days"]
        start = np.array([d["start"] for d in days], dtype=float)
        end = np.array([d["end"] for d in days], dtype=float)
        pad = (end - start) * BAR_GAP
        hours = np.array([d["seconds"] / 3600 for d in days])
        self.bars.setOpts(x0=start + pad, x1=end - pad, height=hours)
        receipts = np.array([d["receipts"] for d in days], dtype=float)
        some = receipts > 0
        self.receipts.setData(((start + end) / 2)[some], receipts[some])
        running = np.array(daily.get("running") or [], dtype=float).reshape(-1, 2)
        self.running.setOpts(x0=running[:, 0], x1=running[:, 1])
        if "now" in daily:
            self.now_line.setValue(daily["now"])
            self.now_line.setVisible(True)
        if (start[0], end[-1]) != self._days_shown:  # a new day: show the new 14 (a user's zoom stays till then)
            self._days_shown = (start[0], end[-1])
            for plot in (self.bars_plot, self.strip_plot):  # zoom no further out than the days, nor in than an hour
                plot.setLimits(xMin=start[0], xMax=end[-1], minXRange=3600)
            self.bars_plot.setXRange(start[0], end[-1], padding=0)
        self.bars_plot.setYRange(0, max(1.0, float(hours.max())) * 1.15, padding=0)
        self.receipts_view.setYRange(0, max(1.0, float(receipts.max())) * 1.15, padding=0)

    def bar_hours(self) -> list[float]:
        """Each day's bar height as drawn (tests)."""
        h = self.bars.opts["height"]
        return [] if h is None else [float(v) for v in np.atleast_1d(h)]

    def running_spans(self) -> list[tuple[float, float]]:
        """The running intervals as drawn (tests)."""
        x0, x1 = np.atleast_1d(self.running.opts["x0"]), np.atleast_1d(self.running.opts["x1"])
        return [(float(a), float(b)) for a, b in zip(x0, x1)]


__all__ = ["ContributionByDay", "BARS_MIN_PX", "STRIP_PX"]
