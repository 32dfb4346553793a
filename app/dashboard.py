"""The dashboard: how this node learns, round by round (pyqtgraph).

Headline cards (held-out quality, contribution: app/cards.py) over plots of a
`RoundHistory`: reward per round with its rolling mean, held-out solve rate against the base
model, accuracy per task, the share of training groups that came from peers (hidden while
training alone), tokens/s (sampling and training), time per phase, and cumulative reward last
(it rises whatever happens, so it is no headline), then "Your contribution by day" beside it
when two columns are free there, else across the full width below (app/daily_plot.py: hours
running per day on a clock-time axis over the running intervals; drawn when the contribution
card's figures arrive, not per round). Curriculum changes are marked on the reward, held-out
and accuracy plots. Three columns of plots from 1150 px, two below.
Colours come from the system palette (app/theme.py). Long curves are binned for the screen
(app/models.py: a raw figure's smallest and largest value per pixel, a rolling mean's mean), and a
long curve no point of which would move by half a pixel keeps what it shows, so a plot is painted
again only when something on it moved, so a history of 10,000 rounds redraws within a frame
(`sapo-bench gui` measures it; docs/calibration.md, 'Dashboard redraw', says which change bought
what). Redraws are coalesced: a burst of rounds (the history loading) costs one redraw.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import Qt, QTimer, Signal
from PySide6.QtWidgets import (
    QFileDialog,
    QGraphicsItem,
    QHBoxLayout,
    QLabel,
    QMessageBox,
    QPushButton,
    QScrollArea,
    QSpinBox,
    QVBoxLayout,
    QWidget,
)

from app import theme
from app.cards import HeadlineCards, SteadyLabel
from app.daily_plot import BARS_MIN_PX, STRIP_PX, ContributionByDay
from app.models import PHASE_GROUPS, RoundHistory, ScreenBins

PALETTE = theme.OKABE_ITO  # the light palette's curve colours (theme.curve_colours() for the current one)
# the plots in reading order; "peers" is left out while the node trains alone
PLOT_ORDER = ("reward", "heldout", "accuracy", "peers", "speed", "time", "cumulative")
WIDE_FROM_PX = 1150  # three columns of plots from this width, two below (a 1000 x 640 window)
PLOT_ROW_MIN_PX = 190
REFRESH_DELAY_MS = 100
# Qt's raster engine draws lines wider than 1 px segment by segment: with thousands of rounds that
# costs more than everything else in a redraw (sapo-bench gui), so long histories get 1 px lines
THICK_LINES_UP_TO = 2000
# a curve of a few points is drawn with dots too: a single point has no line to show it
DOTS_UP_TO = 40
# a long curve (more points than its plot has pixels) whose every point would land within this
# many pixels of where it is drawn keeps what it shows: at 10,000 rounds most rounds move no curve
# by a pixel, and a plot none of whose curves changed is not painted again (sapo-bench gui)
UNMOVED_PX = 0.5


def axis_end(last_round: float, least: float = 10.0) -> float:
    """Right end of the round axis: the last round plus about 10 %, rounded up to two significant
    digits, so that a new round moves the axis (and makes every axis redraw its ticks) only
    now and then: every round below 20, every 1,000 rounds around 10,000. Also the top of the
    cumulative reward's axis (`least` 1), which grows every round too."""
    target = max(least, last_round * 1.1)
    step = 10.0 ** max(0, math.floor(math.log10(target)) - 1)
    return math.ceil(target / step) * step


def configure_pyqtgraph() -> None:
    c = theme.colours()
    pg.setConfigOptions(background=c["plot_bg"], foreground=c["plot_fg"], antialias=False, useNumba=False)


def _tint(color: str, share: float) -> str:
    """The colour mixed with `share` of the plot background: opaque fills that stay behind the lines."""
    return theme.mix(color, theme.colours()["plot_bg"], share)


def _pen(i: int, width: float = 2.0) -> pg.QtGui.QPen:
    colours = theme.curve_colours()
    return pg.mkPen(colours[i % len(colours)], width=width)


def curriculum_changes(history: RoundHistory) -> np.ndarray:
    """Rounds at which any dataset's curriculum level differs from the round before."""
    out = [
        x[1:][np.diff(y) != 0]
        for x, y in (history.get(k) for k in history.series if k.startswith("curriculum/"))
        if len(y) > 1
    ]
    return np.unique(np.concatenate(out)) if out else np.empty(0)


class DashboardView(QWidget):
    refreshed = Signal(int)
    """The plots were redrawn; the number of rounds they show."""
    window_changed = Signal(int)
    """The user chose another rolling-mean window (rounds)."""

    def __init__(self, history: RoundHistory, window: int = 20, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        configure_pyqtgraph()
        self.history = history
        self.window = window
        self._titles: dict[str, str] = {}
        self._legends: dict[str, list[tuple[str, str]]] = {}  # plot -> (name, colour) under its title
        self._widths: dict[str, float] = {}  # each curve's line width while the history is short
        self._thin = False
        self.own_bins = True
        self._refreshing = False
        self._now: dict[str, tuple[float, float, int]] = {}  # plot -> its view, during a refresh
        self._plot_of: dict[str, str] = {}  # curve -> its plot
        self._bins: dict[str, ScreenBins] = {}  # curve -> its data binned for the screen
        self._given: dict[str, int] = {}  # curve -> points of the data given (before binning)
        self.skip_unmoved = True  # off: every refresh hands every curve its data (sapo-bench gui's comparison)
        self._stale: dict[str, tuple[np.ndarray, np.ndarray]] = {}  # curve -> data kept back (< UNMOVED_PX off)
        self._binned_for: tuple | None = None  # (first round, last round, pixels) of each plot at the last refresh
        self._follow = True  # the round axis shows every round until the user zooms or pans
        self._timer = QTimer(self, singleShot=True, interval=REFRESH_DELAY_MS)
        self._timer.timeout.connect(self.refresh)

        self.cards = HeadlineCards(history)
        self.cards.loader.loaded.connect(self._on_stats_loaded)
        self._columns = 3
        self._visible: tuple[str, ...] = ()
        self._marked = -1
        self._marks: np.ndarray | None = None
        self.summary = SteadyLabel("dashboardSummary")  # new text every round, rarely a new height
        self.window_spin = QSpinBox(minimum=1, maximum=1000, value=window, suffix=" rounds")
        self.window_spin.setToolTip("How many rounds the rolling means average over")
        self.window_spin.valueChanged.connect(self._on_window_spin_value_changed)
        self.png_button = QPushButton("Export PNG…")
        self.png_button.clicked.connect(self._on_png_button_clicked)
        self.csv_button = QPushButton("Export CSV…")
        self.csv_button.clicked.connect(self._on_csv_button_clicked)
        top = QHBoxLayout()
        top.addWidget(self.summary, 1)
        top.addWidget(QLabel("Rolling mean over"))
        top.addWidget(self.window_spin)
        top.addWidget(self.png_button)
        top.addWidget(self.csv_button)

        self.graphics = pg.GraphicsLayoutWidget()
        self.plots: dict[str, pg.PlotItem] = {}
        self.curves: dict[str, pg.PlotCurveItem] = {}
        self._dots: dict[str, pg.ScatterPlotItem] = {}  # curve -> its points as dots, while it has few
        self.markers: dict[str, pg.PlotDataItem] = {}
        self._build_plots()
        self.by_day = ContributionByDay()  # its own time axis: linked to none of the round plots
        self.scroll = QScrollArea(widgetResizable=True, frameShape=QScrollArea.Shape.NoFrame)
        self.scroll.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        self.scroll.setWidget(self.graphics)
        self.scroll.setMinimumHeight(150)  # an error banner on a 640 px screen must not push the window taller

        layout = QVBoxLayout(self)
        layout.setContentsMargins(8, 8, 8, 8)
        layout.addWidget(self.cards)
        layout.addLayout(top)
        layout.addWidget(self.scroll, 1)
        self.refresh()

    # --- plots -------------------------------------------------------------------------------------
    def _plot(self, key: str, title: str, y_label: str) -> pg.PlotItem:
        p = pg.PlotItem()
        self._titles[key] = title
        p.setLabel("left", y_label)
        p.getViewBox().sigResized.connect(self._on_view_changed)  # another width: other bins
        p.getViewBox().sigXRangeChanged.connect(self._on_view_changed)  # zoomed or panned: bin what shows
        # another scale: what was kept back as less than half a pixel off may be more now
        p.getViewBox().sigYRangeChanged.connect(lambda *_a, k=key: self._draw_stale(k))
        p.getViewBox().sigResized.connect(lambda *_a, k=key: self._draw_stale(k))
        p.showGrid(x=True, y=True, alpha=0.25)
        p.setLabel("bottom", "round")
        p.setMenuEnabled(False)
        p.enableAutoRange(x=False)  # the round axis is ours (refresh); y follows the data
        p.getViewBox().sigRangeChangedManually.connect(self._on_view_range_changed_manually)
        if self.plots:
            p.setXLink(next(iter(self.plots.values())))  # zoom one, zoom all
        self.plots[key] = p
        return p

    def _curve(self, plot_key: str, key: str, pen: pg.QtGui.QPen, name: str | None = None) -> pg.PlotCurveItem:
        self._widths[key] = pen.widthF()
        # a bare curve item, not pyqtgraph's PlotDataItem: the curves get data already binned for the
        # screen (`_show`), and PlotDataItem's bookkeeping around each setData cost more than the
        # curve's own (sapo-bench gui); dots for short histories are a scatter item of their own
        c = pg.PlotCurveItem(pen=pen, skipFiniteCheck=True)  # the history holds finite numbers only
        self.plots[plot_key].addItem(c)
        self.curves[key] = c
        self._plot_of[key] = plot_key
        self._bins[key] = ScreenBins(peak=key.endswith("/raw"))
        if name:
            self._legends.setdefault(plot_key, []).append((name, pen.color().name()))
            self._set_title(plot_key)
        return c

    def set_own_bins(self, own: bool) -> None:
        """Bin long histories for the screen (the default: each raw figure's smallest and largest
        value per pixel, keeping its spikes; the mean per pixel of a smooth rolling mean) or hand
        the curves every round (sapo-bench gui's comparison)."""
        self.own_bins = own
        self._binned_for = None
        self.refresh()

    def _view(self, plot_key: str) -> tuple[float, float, int]:
        """(first round, last round, pixels) the plot shows."""
        vb = self.plots[plot_key].getViewBox()
        (x0, x1), _ = vb.viewRange()
        pixels = int(vb.width())
        return x0, x1, pixels if pixels >= 2 else 1000  # not laid out yet: a guess, binned again once it is

    def _show(self, key: str, x: np.ndarray, y: np.ndarray) -> None:
        """Give curve `key` the data (x, y), binned for the plot's pixels (unless `own_bins` is off);
        a long curve that would move by less than `UNMOVED_PX` anywhere keeps what it shows."""
        self._given[key] = len(x)
        if self.own_bins:
            x0, x1, pixels = self._now[self._plot_of[key]]
            long = len(x) > pixels
            x, y = self._bins[key](x, y, x0, x1, pixels, (self.window, self.history.generation))
            if long and self.skip_unmoved and self._unmoved(key, x, y):
                self._stale[key] = (x, y)
                return
        self._stale.pop(key, None)
        self.curves[key].setData(x, y)

    def _unmoved(self, key: str, x: np.ndarray, y: np.ndarray) -> bool:
        """Would every point of curve `key`'s new data (as many as it has) land within `UNMOVED_PX`
        of where the curve draws it now?"""
        curve = self.curves[key]
        old_x, old_y = curve.xData, curve.yData
        if old_x is None or len(old_x) != len(x) or not len(x):
            return False
        vb = self.plots[self._plot_of[key]].getViewBox()
        (x0, x1), (y0, y1) = vb.viewRange()
        if not (x1 > x0 and y1 > y0 and vb.width() >= 2 and vb.height() >= 2):
            return False  # not laid out: nothing to compare with
        return bool(
            np.abs(x - old_x).max() * (vb.width() / (x1 - x0)) < UNMOVED_PX
            and np.abs(y - old_y).max() * (vb.height() / (y1 - y0)) < UNMOVED_PX
        )

    def _draw_stale(self, plot_key: str) -> None:
        """The plot's y range or size changed: give its curves the data kept back that is now
        `UNMOVED_PX` or more off."""
        if self._refreshing or not self._stale:
            return
        for key in [k for k in self._stale if self._plot_of[k] == plot_key]:
            x, y = self._stale[key]
            if not self._unmoved(key, x, y):
                del self._stale[key]
                self.curves[key].setData(x, y)

    def _on_view_changed(self, *_args: object) -> None:
        """A plot was zoomed, panned or resized: bin again for what it shows now (once per burst)."""
        if self.own_bins and not self._refreshing and self._binned_for != self._views():
            self.schedule_refresh()

    def _views(self) -> tuple:
        return tuple(self._view(k) for k in self._visible)

    def _set_title(self, plot_key: str) -> None:
        """The title, with the legend under it: a legend box inside the plot would hide data."""
        entries = [f"<span style='color:{color}'>■</span>&nbsp;{name}" for name, color in self._legends[plot_key]]
        lines = [" &nbsp; ".join(entries[i : i + 3]) for i in range(0, len(entries), 3)]
        self.plots[plot_key].setTitle(
            f"{self._titles[plot_key]}<br><span style='font-size:8pt'>{'<br>'.join(lines)}</span>"
        )

    def _build_plots(self) -> None:
        raw = pg.mkPen(theme.colours()["raw"], width=1)
        self._plot("reward", "Training reward per round", "reward (0 to 1)")
        self._curve("reward", "reward/raw", raw, "each round")
        self._curve("reward", "reward/rolling", _pen(0, 2.5), "rolling mean")
        self._plot("heldout", "Held-out questions solved", "share solved").setYRange(0, 1, padding=0.02)
        self._curve("heldout", "heldout/now", _pen(2, 2.5), "trained model")
        self._curve(
            "heldout",
            "heldout/base",
            pg.mkPen(theme.colours()["muted"], width=1.5, style=Qt.PenStyle.DashLine),
            "base model",
        )
        self._plot("accuracy", "Accuracy per task (rolling mean)", "share solved").setYRange(0, 1, padding=0.02)
        self._legends["accuracy"] = []
        self._set_title("accuracy")
        self._plot("peers", "Share of groups from peers", "share of groups").setYRange(0, 1, padding=0.02)
        self._curve("peers", "peers/raw", raw, "each round")
        self._curve("peers", "peers/rolling", _pen(2, 2.5), "rolling mean")
        self._plot("speed", "Tokens per second (rolling mean)", "tokens / s")
        for i, (key, name) in enumerate((("speed/sample", "sampling"), ("speed/train", "training"))):
            self._curve("speed", key, _pen(i), name).setFillLevel(0)  # no brush: only keeps 0 in the y range
        self._plot("cumulative", "Cumulative training reward", "sum of rewards")
        self._curve("cumulative", "cumulative", _pen(1, 2.5), "sum of rewards per question")
        self._plot("time", "Time per round by phase (rolling mean)", "seconds")
        # stacked bands: each curve is the running total up to its phase, filled down to 0 and drawn
        # over the ones above it, so the visible part of each fill is that phase's own share
        for i, (name, _) in enumerate(PHASE_GROUPS):
            c = self._curve("time", f"time/{name}", _pen(i, 1.0), name)
            c.setFillLevel(0)
            c.setBrush(pg.mkBrush(_tint(PALETTE[i % len(PALETTE)], 0.45)))
            c.setZValue(len(PHASE_GROUPS) - i)
        marker_pen = pg.mkPen(theme.colours()["marker"], width=1, style=Qt.PenStyle.DotLine)
        for key in ("reward", "heldout", "accuracy"):
            m = pg.PlotDataItem(pen=marker_pen, connect="finite")
            self.plots[key].addItem(m, ignoreBounds=True)  # marks must not stretch the y range
            self.markers[key] = m
            self._legends.setdefault(key, []).append(("level change", theme.colours()["marker"]))
            self._set_title(key)
        cached = QGraphicsItem.CacheMode.DeviceCoordinateCache
        for plot in self.plots.values():
            plot.getAxis("left").setWidth(58)
            plot.getAxis("left").enableAutoSIPrefix(False)  # "(x0.001)" beside a reward reads as an error
            # axes (with their grid) and titles change only when a range or a name does: keep them as
            # pixmaps instead of replaying their text every frame (halves a redraw: sapo-bench gui)
            for item in (plot.getAxis("left"), plot.getAxis("bottom"), plot.titleLabel):
                item.setCacheMode(cached)

    def _task_curve(self, task: str) -> pg.PlotDataItem:
        key = f"accuracy/{task}"
        if key not in self.curves:
            n = sum(1 for k in self.curves if k.startswith("accuracy/"))
            c = self._curve("accuracy", key, _pen(n), task.replace("_", " "))
            if self._thin:
                c.setPen(_pen(n, 1.0))
        return self.curves[key]

    @property
    def store_file(self) -> Path | None:
        """The run store: what the CSV export and the contribution card read."""
        return self.cards.store_file

    @store_file.setter
    def store_file(self, path: Path | None) -> None:
        self.cards.store_file = path

    # --- layout ------------------------------------------------------------------------------------
    def alone(self) -> bool:
        """No peer groups in any round and no swarm figures: the peer plots say nothing."""
        h = self.history
        return h.total("groups/external") == 0 and "swarm/peers" not in h.series

    def arrange(self, columns: int | None = None) -> None:
        """Place the visible plots row by row in `columns` columns (default: by the width)."""
        columns = columns or (3 if self.width() >= WIDE_FROM_PX else 2)
        visible = tuple(k for k in PLOT_ORDER if not (k == "peers" and self.alone()))
        if (columns, visible) == (self._columns, self._visible):
            return
        ci = self.graphics.ci
        for key in self._visible:
            ci.removeItem(self.plots[key])
        if self._visible:
            ci.removeItem(self.by_day)
        for key in PLOT_ORDER:
            self.plots[key].setVisible(key in visible)
        for i, key in enumerate(visible):
            ci.addItem(self.plots[key], row=i // columns, col=i % columns)
        rows = -(-len(visible) // columns)
        free = rows * columns - len(visible)
        if free >= 2:  # the last row's empty columns hold it (three columns, seven plots)
            ci.addItem(self.by_day, row=rows - 1, col=columns - free, colspan=free)
            height = (rows - 1) * PLOT_ROW_MIN_PX + max(PLOT_ROW_MIN_PX, BARS_MIN_PX + STRIP_PX)
        else:  # a row of its own, full width: two weeks need the room
            ci.addItem(self.by_day, row=rows, col=0, colspan=columns)
            height = rows * PLOT_ROW_MIN_PX + BARS_MIN_PX + STRIP_PX
        self.by_day.set_alone("peers" not in visible)
        for col in range(3):  # equal columns, whatever the length of a title
            ci.layout.setColumnStretchFactor(col, 1 if col < columns else 0)
            ci.layout.setColumnPreferredWidth(col, 250 if col < columns else 0)
        self.graphics.setMinimumHeight(height)
        self._columns, self._visible = columns, visible

    def resizeEvent(self, event) -> None:  # noqa: N802 (Qt's name)
        super().resizeEvent(event)
        self.arrange()

    def _mark_curriculum(self) -> None:
        if self._marked == self.history.rounds:
            return
        self._marked = self.history.rounds
        xs = curriculum_changes(self.history)
        if self._marks is not None and np.array_equal(xs, self._marks):
            return  # levels change rarely: redrawing unchanged marks cost ~1 ms a plot (sapo-bench gui)
        self._marks = xs
        x = np.repeat(xs, 3)
        y = np.tile([-100.0, 100.0, np.nan], len(xs))
        x[2::3] = np.nan
        for m in self.markers.values():
            m.setData(x, y)

    # --- drawing -----------------------------------------------------------------------------------
    def schedule_refresh(self) -> None:
        """Redraw soon; several calls in a burst cost one redraw."""
        if not self._timer.isActive():
            self._timer.start()

    def refresh(self) -> None:
        self._refreshing = True
        try:
            self._refresh()
        finally:
            self._refreshing = False
        self.refreshed.emit(self.history.rounds)

    def _refresh(self) -> None:
        h, w = self.history, self.window
        self.arrange()
        self._follow_rounds()  # the round axis first: the curves are binned for it
        self._now = {k: self._view(k) for k in self.plots}
        views = tuple(self._now[k] for k in self._visible)  # what `_binned_for` compares with
        x, rolling = h.rolling("reward/mean", w)
        self._show("reward/raw", *h.get("reward/mean"))
        self._show("reward/rolling", x, rolling)
        x, total = h.cumulative("reward/sum" if "reward/sum" in h.series else "reward/mean")
        if self._follow and len(total):  # it grows every round: step its axis as the round axis steps
            top = axis_end(float(total.max()), least=1.0)
            vb = self.plots["cumulative"].getViewBox()
            if vb.viewRange()[1] != [0.0, top]:
                vb.enableAutoRange(y=False)
                vb.setYRange(0, top, padding=0)
        self._show("cumulative", x, total)  # after its axis: what moves less than a pixel is measured on it
        for key, figure in (("heldout/now", "eval/solve_rate"), ("heldout/base", "eval/solve_rate_base")):
            x, y = h.get(figure)
            if self.points(key) != len(x) or self._binned_for != views:
                self._show(key, x, y)  # evaluations are every N rounds: skip the rounds between
        self._mark_curriculum()
        self.cards.refresh()
        for task in h.keys_under("accuracy/", skip=("mean",)):
            self._task_curve(task[len("accuracy/") :])
            self._show(task, *h.rolling(task, w))
        self._show("peers/raw", *h.get("groups/external_share"))
        self._show("peers/rolling", *h.rolling("groups/external_share", w))
        self._show("speed/sample", *h.rolling("sampler/tok_per_s", w))
        self._show("speed/train", *h.rolling("train/tok_per_s", w))
        x, bands = h.stacked(PHASE_GROUPS, w)
        below = None
        for (name, _), band in zip(PHASE_GROUPS, bands):
            self._show(f"time/{name}", x, band)
            # a band this node never has (sharing, alone) stays out of the legend's way
            self.curves[f"time/{name}"].setVisible(below is None or bool(len(band)) and not np.array_equal(band, below))
            below = band
        self._binned_for = views
        for key, curve in self.curves.items():
            dots = (
                0 < self.points(key) <= DOTS_UP_TO
                and not key.endswith("/raw")
                and not key.startswith("time/")
                and key != "heldout/base"
            )
            if dots:
                d = self._dots.get(key)
                if d is None:
                    pen = curve.opts["pen"]
                    d = self._dots[key] = pg.ScatterPlotItem(size=5, pen=pen, brush=pg.mkPen(pen).color())
                    self.plots[self._plot_of[key]].addItem(d)
                d.setData(curve.xData, curve.yData)
            elif key in self._dots:
                self.plots[self._plot_of[key]].removeItem(self._dots.pop(key))
        if (h.rounds > THICK_LINES_UP_TO) != self._thin:
            self._thin = not self._thin
            for key, curve in self.curves.items():
                pen = pg.mkPen(curve.opts["pen"])
                pen.setWidthF(1.0 if self._thin else self._widths[key])
                curve.setPen(pen)
        self.summary.setText(self.summary_text(rolling[-1] if len(rolling) else None))

    def _follow_rounds(self) -> None:
        """Show every round on the round axis, unless the user zoomed or panned."""
        first = next(iter(self.plots.values()))
        if self._follow or any(p.getViewBox().autoRangeEnabled()[0] for p in self.plots.values()):
            # following again after the plot's "A" button; keep the axis still between its steps
            self._follow = True
            end = axis_end(self.history.last_round)
            if first.getViewBox().viewRange()[0] != [0.0, end]:
                for p in self.plots.values():
                    p.enableAutoRange(x=False)
                first.setXRange(0, end, padding=0)

    def summary_text(self, rolling: float | None = None) -> str:
        h = self.history
        if not h.rounds:
            return (
                "No rounds yet. The curves fill in as rounds end; "
                "a run's history comes back from its run store when the app restarts."
            )
        if rolling is None:
            _, means = h.rolling("reward/mean", self.window)
            rolling = float(means[-1]) if len(means) else None
        parts = [
            f"<b>{h.rounds:,} round{'s' * (h.rounds != 1)}</b> (last: {h.last_round:,})",
            f"reward {h.last('reward/mean'):.3f}" + (f", rolling mean {rolling:.3f}" if rolling is not None else ""),
            f"accuracy {h.last('accuracy/mean'):.2f}",
        ]
        share = h.last("groups/external_share")
        if not math.isnan(share):
            parts.append(f"{share:.0%} of groups from peers")
        speed = h.last("sampler/tok_per_s")
        if not math.isnan(speed):
            parts.append(f"{speed:.0f} tok/s sampling")
        return " · ".join(parts)

    def _on_stats_loaded(self, stats: dict | None) -> None:
        if stats is not None:
            self.by_day.set_daily(stats.get("daily"))

    def _on_view_range_changed_manually(self, _mask: object) -> None:
        self._follow = False  # the user zoomed or panned: leave the axis where they put it

    def points(self, key: str) -> int:
        """Points a curve holds (tests: the plot gained one when a round ended)."""
        return self._given.get(key, 0)  # the data as given, before binning

    def set_window(self, rounds: int) -> None:
        self.window = max(1, int(rounds))
        if self.window_spin.value() != self.window:
            self.window_spin.setValue(self.window)
        self.refresh()

    def _on_window_spin_value_changed(self, value: int) -> None:
        if value != self.window:
            self.window = value
            self.schedule_refresh()
            self.window_changed.emit(value)

    # --- export ------------------------------------------------------------------------------------
    def export_png(self, path: str | Path) -> bool:
        return self.graphics.grab().save(str(path), "PNG")

    def export_csv(self, path: str | Path) -> int:
        """Every figure of every round in the run store as CSV; returns the rounds written."""
        from sapo_core.store import RunStore, export_csv

        if self.store_file is None or not self.store_file.is_file():
            raise FileNotFoundError("no run store yet: the first round has not ended")
        store = RunStore(self.store_file, readonly=True)
        try:
            rows = store.rounds()
        finally:
            store.close()
        with open(path, "w", newline="", encoding="utf-8") as out:
            export_csv(rows, out)
        return len(rows)

    def _on_png_button_clicked(self) -> None:
        path, _ = QFileDialog.getSaveFileName(self, "Export the plots as PNG", "sapo-dashboard.png", "PNG (*.png)")
        if path and not self.export_png(path):
            QMessageBox.warning(self, "Export PNG", f"Could not write {path}.")

    def _on_csv_button_clicked(self) -> None:
        path, _ = QFileDialog.getSaveFileName(
            self, "Export every round's figures as CSV", "sapo-rounds.csv", "CSV (*.csv)"
        )
        if not path:
            return
        try:
            self.export_csv(path)
        except (OSError, FileNotFoundError) as e:
            QMessageBox.warning(self, "Export CSV", f"Could not export: {e}")


__all__ = ["DashboardView", "configure_pyqtgraph", "PALETTE"]
