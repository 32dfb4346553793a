"""The dashboard's headline cards, layout by width, peers' plots while alone, curriculum marks,
and palette colours (offscreen Qt)."""

from __future__ import annotations

import random

import numpy as np
import pytest

from app.demo import demo_metrics, write_demo_store
from app.models import RoundHistory

pytestmark = pytest.mark.gui


def _history(n: int, swarm: bool = True) -> RoundHistory:
    h = RoundHistory()
    rng = random.Random(0)
    h.add_many((r, demo_metrics(r, rng, swarm)) for r in range(1, n + 1))
    return h


def test_held_out_card_says_no_evaluation_then_the_sentence(qtbot):
    from app.cards import held_out_text

    h = RoundHistory()
    h.add(1, {"reward/mean": 0.2})
    assert held_out_text(h)[0] == "no evaluation yet"
    h.add(
        2,
        {
            "eval/solve_rate": 0.27,
            "eval/solve_rate_base": 0.10,
            "eval/gain": 0.17,
            "eval/gain_ci_low": 0.10,
            "eval/gain_ci_high": 0.24,
        },
    )
    head, detail = held_out_text(h)
    assert head == "0.10 at start -> 0.27 now (+0.17, ±0.07)" and "better than the base model" in detail
    h.add(
        3,
        {
            "eval/solve_rate": 0.12,
            "eval/solve_rate_base": 0.10,
            "eval/gain": 0.02,
            "eval/gain_ci_low": -0.05,
            "eval/gain_ci_high": 0.09,
        },
    )
    assert "not yet distinguishable" in held_out_text(h)[1]
    assert "every level" not in held_out_text(h)[1]  # none measured yet
    h.add(4, {"eval/solve_rate": 0.3, "eval/capability": 0.14, "eval/capability_base": 0.05})
    assert held_out_text(h)[1].endswith("<br>every level, easy to hard (capability): 0.05 at start -> 0.14 now")


def test_contribution_card_reads_the_store_on_a_thread(qtbot, tmp_path):
    from app.cards import HeadlineCards

    store = write_demo_store(tmp_path, 50)  # 50 rounds ending now, 50 receipts from 7 peers
    h = RoundHistory()
    from app.history import read_rows

    h.add_many(read_rows(store))
    cards = HeadlineCards(h)
    qtbot.addWidget(cards)
    cards.store_file = store
    with qtbot.waitSignal(cards.loader.loaded, timeout=10_000):
        cards.refresh()
    assert "50 rounds" in cards.given.value.text()
    assert cards.given.detail.text().endswith(
        "<br>your groups were trained on 50 times by 7 peers this week<br>100 peers' groups trained here"
    )
    assert cards.given.detail.text().startswith("running ")


def test_a_new_round_relays_out_nothing_unless_a_label_needs_another_line(qtbot):
    """QLabel.setText relays out every layout up to the window, half a redraw's CPU (sapo-bench gui)."""
    from PySide6.QtCore import QEvent, QObject

    from app.dashboard import DashboardView

    class Requests(QObject):
        count = 0

        def eventFilter(self, obj, event):  # noqa: N802
            if event.type() == QEvent.Type.LayoutRequest:
                Requests.count += 1
            return False

    h = _history(100)
    view = DashboardView(h)
    qtbot.addWidget(view)
    view.resize(1200, 800)
    view.show()
    qtbot.waitExposed(view)
    qtbot.wait(50)
    seen = Requests()
    for w in (view, view.cards, view.cards.given, view.cards.held):
        w.installEventFilter(seen)
    rng = random.Random(1)
    for r in range(101, 106):  # new summary and contribution figures every round, same number of lines
        before = view.summary.text(), view.cards.given.value.text()
        h.add(r, demo_metrics(r, rng))
        view.refresh()
        qtbot.wait(20)
        assert (view.summary.text(), view.cards.given.value.text()) != before
    assert Requests.count == 0

    height = view.summary.height()
    view.summary.setText("a long summary, " * 40)  # three lines or more: the row must grow
    qtbot.waitUntil(lambda: view.summary.height() > height, timeout=2000)
    assert Requests.count > 0
    assert view.summary.label.geometry() == view.summary.rect()


def test_two_columns_below_1150_px_and_peers_hidden_while_alone(qtbot):
    from app.dashboard import DashboardView

    view = DashboardView(_history(100))
    qtbot.addWidget(view)
    view.resize(1000, 640)
    view.show()
    view.arrange()
    layout = view.graphics.ci.layout
    assert view._columns == 2 and layout.itemAt(0, 1) is view.plots["heldout"]
    view.resize(1300, 800)
    view.arrange()
    assert view._columns == 3 and layout.itemAt(0, 2) is view.plots["accuracy"]
    assert view.plots["peers"].isVisible()
    alone = DashboardView(_history(100, swarm=False))
    qtbot.addWidget(alone)
    alone.resize(1300, 800)
    alone.arrange()
    assert "peers" not in alone._visible and not alone.plots["peers"].isVisible()


def _shown_long(qtbot, rounds: int = 5000):
    """A dashboard of `rounds` rounds, laid out at 1300 x 800 and drawn."""
    from app.dashboard import DashboardView

    h = _history(rounds)
    view = DashboardView(h)
    qtbot.addWidget(view)
    view.resize(1300, 800)
    view.show()
    qtbot.waitUntil(lambda: view.plots["reward"].getViewBox().width() > 100)
    view.refresh()
    return h, view


def test_long_histories_are_binned_for_the_pixels_and_again_when_zoomed(qtbot):
    h, view = _shown_long(qtbot)
    vb = view.plots["reward"].getViewBox()
    pixels = int(vb.width())
    raw, rolling = view.curves["reward:raw"], view.curves["reward:rolling"]
    assert view.points("reward:raw") == 5000  # what it was given
    assert len(raw.xData) <= 2 * pixels + 2 and len(rolling.xData) <= pixels + 2  # what it draws
    _, y = h.get("reward/mean")
    assert raw.yData.max() == y.max() and raw.yData.min() == y.min()  # peaks kept: no spike lost
    # the cumulative reward's axis steps like the round axis instead of moving every round
    top = view.plots["cumulative"].getViewBox().viewRange()[1]
    total = h.cumulative("reward/sum")[1][-1]
    assert top[0] == 0 and total <= top[1] <= 1.2 * total
    # zoomed into 100 rounds: every round there is drawn, plus one on either side
    vb.sigRangeChangedManually.emit([True, False])  # as a mouse wheel says it
    vb.setXRange(2000, 2100, padding=0)
    qtbot.waitUntil(lambda: raw.xData is not None and len(raw.xData) < 200, timeout=3000)
    assert raw.xData[0] == 1999 and raw.xData[-1] == 2101
    # and a new round changes only the end of a long curve
    vb.enableAutoRange(x=True)  # the "A" button: follow every round again
    h.add(5001, demo_metrics(5001, random.Random(1)))
    view.refresh()
    before = view.curves["reward:rolling"].yData.copy()
    h.add(5002, demo_metrics(5002, random.Random(2)))
    view.refresh()  # the round axis stays at 5,600 (it steps every 100 rounds here)
    after = view.curves["reward:rolling"].yData
    assert len(after) >= len(before) - 1 and np.array_equal(after[: len(before) - 1], before[:-1])


def test_short_histories_get_dots_that_go_when_the_history_grows(qtbot):
    from app.dashboard import DOTS_UP_TO, DashboardView

    h = _history(3)
    view = DashboardView(h)
    qtbot.addWidget(view)
    dots = view._dots["reward:rolling"]
    assert dots.data["x"].tolist() == [1, 2, 3] and "reward:raw" not in view._dots
    h.add_many((r, demo_metrics(r, random.Random(r))) for r in range(4, DOTS_UP_TO + 2))
    view.refresh()
    assert "reward:rolling" not in view._dots and dots.scene() is None


def test_curriculum_changes_are_marked(qtbot):
    from app.dashboard import DashboardView, curriculum_changes

    h = RoundHistory()
    for r, level in enumerate([0, 0, 1, 1, 1, 2, 1], start=1):
        h.add(r, {"curriculum/basic_arithmetic_level": float(level), "reward/mean": 0.1})
    assert curriculum_changes(h).tolist() == [3.0, 6.0, 7.0]
    view = DashboardView(h)
    qtbot.addWidget(view)
    x = view.markers["reward"].xData
    assert np.array_equal(x[~np.isnan(x)], [3, 3, 6, 6, 7, 7])


def test_dark_palette_gives_light_text_and_plots(qtbot):
    from PySide6.QtGui import QColor

    from app import theme

    dark = theme.dark_palette()
    c = theme.colours(dark)
    assert theme.is_dark(dark) and QColor(c["text"]).lightness() > 180 and QColor(c["plot_bg"]).lightness() < 60
    assert "#000000" not in theme.curve_colours(dark)  # black curves vanish on a dark plot
    assert f"color: {c['text']}" in theme.style_sheet(dark)


def test_start_at_login_writes_and_removes_the_autostart_entry(qtbot, tmp_path, monkeypatch):
    import sys

    if sys.platform != "linux":
        pytest.skip("the freedesktop autostart entry")
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path))
    from app.controls import ShareSettings

    settings = ShareSettings()
    qtbot.addWidget(settings)
    entry = tmp_path / "autostart" / "sapo-swarm.desktop"
    assert not settings.autostart_box.isChecked()
    settings.autostart_box.setChecked(True)
    text = entry.read_text()
    assert "app.main --minimized" in text and sys.executable in text
    settings.autostart_box.setChecked(False)
    assert not entry.exists()


def test_a_long_curve_keeps_what_it_shows_while_no_point_moves_half_a_pixel(qtbot):
    """At 10,000 rounds most rounds move most curves by less than a pixel: those are not given
    their data again (a plot none of whose curves changed is not painted: sapo-bench gui), and what
    every curve shows stays within half a pixel of its data, also when the y scale changes."""
    from app.dashboard import UNMOVED_PX

    h, view = _shown_long(qtbot)

    def off_px(key: str) -> float:
        """How far (pixels) what curve `key` shows is from the data it was last binned from."""
        x, y = view._stale.get(key, (view.curves[key].xData, view.curves[key].yData))
        c = view.curves[key]
        vb = view.plots[view._plot_of[key]].getViewBox()
        (x0, x1), (y0, y1) = vb.viewRange()
        return max(
            np.abs(x - c.xData).max() * vb.width() / (x1 - x0), np.abs(y - c.yData).max() * vb.height() / (y1 - y0)
        )

    rng = random.Random(3)
    kept = given = 0
    for r in range(5001, 5041):
        before = {k: c.yData for k, c in view.curves.items()}
        h.add(r, demo_metrics(r, rng))
        view.refresh()
        for key, c in view.curves.items():
            if key in view._stale:
                assert c.yData is before[key] and off_px(key) < UNMOVED_PX
                kept += 1
            elif view.points(key) > 200:
                given += 1
    assert kept > 0 and given > 0  # some curves were left as drawn, some moved and were drawn again
    assert view.points("reward:raw") == 5040
    # zoomed into the y axis: what was less than half a pixel off may be more now, and is drawn
    stale = [k for k in view._stale if view._plot_of[k] == "reward"]
    assert stale
    vb = view.plots["reward"].getViewBox()
    (_, _), (y0, y1) = vb.viewRange()
    vb.setYRange(y0, y0 + (y1 - y0) / 50, padding=0)
    for key in stale:
        assert off_px(key) < UNMOVED_PX
    # the comparison mode gives every curve its data every round
    view.skip_unmoved = False
    h.add(5041, demo_metrics(5041, rng))
    view.refresh()
    assert not view._stale


def test_sapo_bench_gui_runs_the_window_in_its_own_process(capfd):
    """`sapo-bench gui` starts app.guibench as a process (the engine never imports Qt): a short
    history still goes through the whole measurement to the one summary line."""
    import sys

    from sapo_core.bench.cli import main

    assert main(["gui", "--rounds", "300", "--redraws", "5", "--width", "1000", "--height", "700"]) == 0
    out = capfd.readouterr().out
    assert "history: 300 rounds written" in out
    assert "1000x700" in out
    summary = out.strip().splitlines()[-1]
    assert summary.startswith("gui: redraw 300 rounds CPU p50 ")
    assert "RSS" in summary and "goal <= 200" in summary
    assert "app.guibench" not in sys.modules  # it ran in a process of its own
