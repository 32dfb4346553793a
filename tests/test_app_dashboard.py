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
    h.add(2, {"eval/solve_rate": 0.27, "eval/solve_rate_base": 0.10, "eval/gain": 0.17, "eval/gain_ci_low": 0.10,
              "eval/gain_ci_high": 0.24})
    head, detail = held_out_text(h)
    assert head == "0.10 at start -> 0.27 now (+0.17, ±0.07)" and "better than the base model" in detail
    h.add(3, {"eval/solve_rate": 0.12, "eval/solve_rate_base": 0.10, "eval/gain": 0.02, "eval/gain_ci_low": -0.05,
              "eval/gain_ci_high": 0.09})
    assert "not yet distinguishable" in held_out_text(h)[1]


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
    assert cards.given.detail.text().endswith("<br>your groups were trained on 50 times by 7 peers this week")
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
