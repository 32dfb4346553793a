"""The dashboard: how this node learns, round by round (pyqtgraph).

Headline cards (held-out quality, contribution: app/cards.py) over plots of a
`RoundHistory`: reward per round with its rolling mean, held-out solve rate against the base
model, accuracy per task, the share of training groups that came from peers (hidden while
training alone), tokens/s (sampling and training), time per phase, and cumulative reward last
(it rises whatever happens, so it is no headline), then "Your contribution by day" beside it
when two columns are free there, else across the full width below (app/daily_plot.py: hours
running per day on a clock-time axis over the running intervals; drawn when the contribution
card's figures arrive, not per round). Curriculum changes are marked on the reward, held-out
and accuracy plots. Three columns of plots from 1150 px, two below. Which figure each curve draws,
and how, is a table (app/curves.py).
How they look is app/plot_style.py's. Long curves are binned for the screen
(app/binning.py: a raw figure's smallest and largest value per pixel, a rolling mean's mean), and a
long curve no point of which would move by half a pixel keeps what it shows, so a plot is painted
again only when something on it moved, so a history of 10,000 rounds redraws within a frame
(`sapo-bench gui` measures it; docs/calibration.md, 'Dashboard redraw', says which change bought
what). Redraws are coalesced: a burst of rounds (the history loading) costs one redraw.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import Qt, QTimer, Signal
from PySide6.QtWidgets import (
    QFileDialog,
    QHBoxLayout,
    QLabel,
    QMessageBox,
    QPushButton,
    QScrollArea,
    QSpinBox,
    QVBoxLayout,
    QWidget,
)

from app.binning import ScreenBins
from app.cards import HeadlineCards, SteadyLabel, summary_text
from app.curves import (
    BAND,
    CUMULATIVE,
    CURVES,
    EVALUATIONS,
    PLOTS,
    ROLLING,
    Curve,
    Plot,
    axis_end,
    curriculum_changes,
    task_curve,
)
from app.daily_plot import BARS_MIN_PX, STRIP_PX, ContributionByDay
from app.history import write_csv
from app.models import RoundHistory
from app.plot_style import LEVEL_CHANGE, configure_pyqtgraph, level_marks, new_curve, new_plot, pen, title_html
from sapo_core.control import vocabulary as K

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
        self._specs: dict[str, Curve] = {}  # curve -> its row of the table (app/curves.py)
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
    def _plot(self, spec: Plot) -> pg.PlotItem:
        key = spec.id
        p = new_plot(spec)
        self._titles[key] = spec.title
        p.getViewBox().sigResized.connect(self._on_view_changed)  # another width: other bins
        p.getViewBox().sigXRangeChanged.connect(self._on_view_changed)  # zoomed or panned: bin what shows
        # another scale: what was kept back as less than half a pixel off may be more now
        p.getViewBox().sigYRangeChanged.connect(lambda *_a, k=key: self._draw_stale(k))
        p.getViewBox().sigResized.connect(lambda *_a, k=key: self._draw_stale(k))
        p.getViewBox().sigRangeChangedManually.connect(self._on_view_range_changed_manually)
        if self.plots:
            p.setXLink(next(iter(self.plots.values())))  # zoom one, zoom all
        self.plots[key] = p
        self._legends[key] = []
        self._set_title(key)
        return p

    def _curve(self, spec: Curve) -> pg.PlotCurveItem:
        """The curve of one row of the table, on its plot, named in the legend under the plot's title."""
        key, plot_key = spec.id, spec.plot
        c = new_curve(spec)  # skips pyqtgraph's finite checks: the history holds finite numbers only
        self._widths[key] = c.opts["pen"].widthF()
        self.plots[plot_key].addItem(c)
        self.curves[key] = c
        self._plot_of[key] = plot_key
        self._specs[key] = spec
        self._bins[key] = ScreenBins(peak=spec.peak)
        self._legends[plot_key].append((spec.label, c.opts["pen"].color().name()))
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
        self.plots[plot_key].setTitle(title_html(self._titles[plot_key], self._legends[plot_key]))

    def _build_plots(self) -> None:
        for plot in PLOTS:
            self._plot(plot)
        for curve in CURVES:
            self._curve(curve)
        for key in (plot.id for plot in PLOTS if plot.marks_levels):
            m, colour = level_marks()
            self.plots[key].addItem(m, ignoreBounds=True)  # marks must not stretch the y range
            self.markers[key] = m
            self._legends[key].append((LEVEL_CHANGE, colour))
            self._set_title(key)

    def _task_curve(self, task: str) -> None:
        """The accuracy plot's curve of `task`, made when the task first appears in the history."""
        n = sum(1 for c in self._specs.values() if c.plot == "accuracy")
        spec = task_curve(task, n)
        if spec.id not in self.curves:
            c = self._curve(spec)
            if self._thin:
                c.setPen(pen(n, 1.0))

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
        return h.total(K.GROUPS_EXTERNAL) == 0 and K.SWARM_PEERS not in h.series

    def arrange(self, columns: int | None = None) -> None:
        """Place the visible plots row by row in `columns` columns (default: by the width)."""
        columns = columns or (3 if self.width() >= WIDE_FROM_PX else 2)
        alone = self.alone()
        visible = tuple(p.id for p in PLOTS if not (p.peers_only and alone))
        if (columns, visible) == (self._columns, self._visible):
            return
        ci = self.graphics.ci
        for key in self._visible:
            ci.removeItem(self.plots[key])
        if self._visible:
            ci.removeItem(self.by_day)
        for key in self.plots:
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
        self.by_day.set_alone(alone)
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
        h = self.history
        self.arrange()
        self._follow_rounds()  # the round axis first: the curves are binned for it
        self._now = {k: self._view(k) for k in self.plots}
        views = tuple(self._now[k] for k in self._visible)  # what `_binned_for` compares with
        for task in h.keys_under(K.ACCURACY_PREFIX, skip=(K.ACCURACY_MEAN,)):
            self._task_curve(task[len(K.ACCURACY_PREFIX) :])
        drawn = {c.id: self._draw(c, views) for c in list(self._specs.values()) if c.how != BAND}
        self._draw_bands()
        self._mark_curriculum()
        self.cards.refresh()
        self._binned_for = views
        self._update_dots()
        if (h.rounds > THICK_LINES_UP_TO) != self._thin:
            self._thin = not self._thin
            for key, curve in self.curves.items():
                thin = pg.mkPen(curve.opts["pen"])
                thin.setWidthF(1.0 if self._thin else self._widths[key])
                curve.setPen(thin)
        rolling = drawn["reward:rolling"]
        self.summary.setText(summary_text(h, self.window, float(rolling[-1]) if len(rolling) else None))

    def _figure(self, spec: Curve) -> tuple[np.ndarray, np.ndarray]:
        """The (rounds, values) curve `spec` draws, from the history."""
        h = self.history
        key = spec.fallback if spec.fallback and spec.key not in h.series else spec.key
        if spec.how == ROLLING:
            return h.rolling(key, self.window)
        if spec.how == CUMULATIVE:
            return h.cumulative(key)
        return h.get(key)

    def _draw(self, spec: Curve, views: tuple) -> np.ndarray:
        """Give curve `spec` its figure (unless it is an evaluation's and nothing changed); its values."""
        x, y = self._figure(spec)
        if spec.how == EVALUATIONS and self.points(spec.id) == len(x) and self._binned_for == views:
            return y  # evaluations are every N rounds: skip the rounds between
        if spec.how == CUMULATIVE and self._follow and len(y):
            # it grows every round: step its axis as the round axis steps, before the curve is given
            # its data (what moves less than a pixel is measured on the axis)
            top = axis_end(float(y.max()), least=1.0)
            vb = self.plots[spec.plot].getViewBox()
            if vb.viewRange()[1] != [0.0, top]:
                vb.enableAutoRange(y=False)
                vb.setYRange(0, top, padding=0)
        self._show(spec.id, x, y)
        return y

    def _draw_bands(self) -> None:
        """The time per round, stacked by band of phases (vocabulary.PHASE_BANDS)."""
        x, bands = self.history.stacked(K.PHASE_BANDS, self.window)
        below = None
        for (name, _), band in zip(K.PHASE_BANDS, bands):
            self._show(f"time:{name}", x, band)
            # a band this node never has (sharing, alone) stays out of the legend's way
            self.curves[f"time:{name}"].setVisible(below is None or bool(len(band)) and not np.array_equal(band, below))
            below = band

    def _update_dots(self) -> None:
        """Dots on the curves that have few points yet (and draw them with dots at all)."""
        for key, curve in self.curves.items():
            if 0 < self.points(key) <= DOTS_UP_TO and self._specs[key].dots:
                d = self._dots.get(key)
                if d is None:
                    p = curve.opts["pen"]
                    d = self._dots[key] = pg.ScatterPlotItem(size=5, pen=p, brush=pg.mkPen(p).color())
                    self.plots[self._plot_of[key]].addItem(d)
                d.setData(curve.xData, curve.yData)
            elif key in self._dots:
                self.plots[self._plot_of[key]].removeItem(self._dots.pop(key))

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
        return write_csv(self.store_file, path)

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


__all__ = ["DashboardView"]
