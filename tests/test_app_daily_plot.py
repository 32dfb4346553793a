"""The dashboard's "Your contribution by day": one bar per day with the run store's figures, a gap in
the running strip where the store has a pause, receipts hidden while training alone (offscreen Qt,
a real run store read by the contribution card's thread)."""

from __future__ import annotations

import datetime as dt

import pytest

from app.history import read_rows
from app.models import RoundHistory
from sapo_core.store import STORE_NAME, RunStore

pytestmark = pytest.mark.gui


def _at(day: dt.date, hh: int, mm: int = 0) -> float:
    return dt.datetime.combine(day, dt.time(hh, mm)).timestamp()


def _store(tmp_path, swarm: bool):
    """Three days ago 2 h (09:00-11:00); yesterday 09:00-11:00, paused, 14:00-15:00; receipts yesterday."""
    today = dt.date.today()
    ago3, yesterday = today - dt.timedelta(days=3), today - dt.timedelta(days=1)
    s = RunStore(tmp_path / STORE_NAME)
    r = 1
    extra = {"swarm/peers": 2.0, "swarm/published": 2.0, "groups/external": 1.0} if swarm else {}
    for day, start, n in ((ago3, 9, 4), (yesterday, 9, 4), (yesterday, 14, 2)):
        for k in range(n):  # back-to-back rounds of 30 min
            t = _at(day, start) + 1800 * k
            s.record_round(r, {"reward/mean": 0.2, "cpu/seconds": 3000.0, **extra}, started=t, ended=t + 1800)
            r += 1
    if swarm:
        s.record_receipts(r - 1, [("peerA", 5, 0), ("peerB", 5, 1), ("peerA", 6, 0)], seen=_at(yesterday, 15))
    s.close()
    return tmp_path / STORE_NAME, ago3, yesterday


def _dashboard(qtbot, store, width=1000, height=640):
    from app.dashboard import DashboardView

    h = RoundHistory()
    h.add_many(read_rows(store))
    view = DashboardView(h)
    qtbot.addWidget(view)
    view.resize(width, height)
    view.show()
    view.store_file = store
    with qtbot.waitSignal(view.cards.loader.loaded, timeout=10_000):
        view.refresh()
    return view


def test_one_bar_per_day_with_the_stores_figures_and_a_gap_for_the_pause(qtbot, tmp_path):
    store, ago3, yesterday = _store(tmp_path, swarm=True)
    view = _dashboard(qtbot, store)
    plot = view.by_day
    days = plot.daily["days"]
    assert len(days) == 14 and len(plot.bar_hours()) == 14
    hours = dict(zip((d["date"] for d in days), plot.bar_hours()))
    assert hours.pop(ago3.isoformat()) == pytest.approx(2.0)
    assert hours.pop(yesterday.isoformat()) == pytest.approx(3.0)
    assert set(hours.values()) == {0.0}
    # each bar sits inside its own day on the clock-time axis
    x0, x1 = plot.bars.opts["x0"], plot.bars.opts["x1"]
    assert all(d["start"] < a < b < d["end"] for d, a, b in zip(days, x0, x1))
    # the strip: the morning, then a gap over the pause (11:00-14:00), then the afternoon
    spans = plot.running_spans()
    assert spans == [
        (_at(ago3, 9), _at(ago3, 11)),
        (_at(yesterday, 9), _at(yesterday, 11)),
        (_at(yesterday, 14), _at(yesterday, 15)),
    ]
    assert not any(a < _at(yesterday, 12, 30) < b for a, b in spans)
    # peers' receipts: a dot on the day they came, the right axis shown
    x, y = plot.receipts.getData()
    assert list(y) == [3.0] and _at(yesterday, 0) < x[0] < _at(yesterday + dt.timedelta(days=1), 0)
    assert plot.receipts_view.isVisible() and "receipts from peers" in plot.bars_plot.titleLabel.text
    # two columns: the plot spans both below the others, on a clock axis linked to none of the round plots
    layout = view.graphics.ci.layout
    rows = -(-len(view._visible) // 2)
    assert layout.itemAt(rows, 0) is plot and layout.itemAt(rows, 1) is plot
    view.resize(1300, 800)  # three columns: seven plots leave two free beside the last one, and it takes them
    view.arrange()
    assert [layout.itemAt(2, c) for c in range(3)] == [view.plots["cumulative"], plot, plot]
    assert plot.bars_plot.getViewBox().linkedView(0) is None


def test_receipts_are_left_out_while_training_alone_and_redraws_leave_the_plot_alone(qtbot, tmp_path):
    store, _, yesterday = _store(tmp_path, swarm=False)
    view = _dashboard(qtbot, store)
    plot = view.by_day
    assert "peers" not in view._visible
    assert not plot.receipts_view.isVisible() and "receipts" not in plot.bars_plot.titleLabel.text
    assert sum(plot.bar_hours()) == pytest.approx(5.0)
    # the per-round redraw does not touch it: its figures change only when the card's stats arrive
    drawn = plot.bars.opts["height"]
    view.refresh()
    view.refresh()
    assert plot.bars.opts["height"] is drawn
