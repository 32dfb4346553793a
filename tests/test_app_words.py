"""The setup's words about what sharing gives are the lab's figures: each `Measured` the swarm page
quotes is recomputed here from the committed CSVs under docs/results (what `sapo-experiment
--from-csv` reads), so a new result cannot leave an old claim on screen."""

from __future__ import annotations

from pathlib import Path

import pytest

from app.setup_choices import SHARING_LINES, SHARING_MEASURED, Measured
from sapo_core.experiment_files import read_rows
from sapo_core.experiment_report import difference, hourly_difference

RESULTS = Path(__file__).resolve().parent.parent / "docs" / "results"
QUOTED = [m for _, m in SHARING_LINES]  # every figure the swarm page shows


@pytest.mark.parametrize("m", QUOTED, ids=[m.files for m in QUOTED])
def test_each_quoted_figure_is_what_the_committed_csvs_say(m: Measured):
    files = sorted(str(p) for p in RESULTS.glob(m.files))
    assert files, f"no docs/results/{m.files}"
    rows, _, _ = read_rows(files)
    rows = [r for r in rows if r["arm"] in (m.baseline, m.arm) and r.get("role") != "veteran"]
    c = difference(rows, m.baseline, m.arm)
    assert c.unit == "seed" and c.n == m.seeds
    h = hourly_difference(rows, m.baseline, m.arm)
    assert h.n == m.seeds
    # each figure within half a thousandth, and shown to two places as the exact figure is (0.68499
    # stored as 0.685 would show +0.69 where the docs say +0.68)
    for exact, quoted in zip((c.mean, c.lo, c.hi, h.mean, h.lo, h.hi), (m.mean, m.lo, m.hi, *m.hourly)):
        assert abs(exact - quoted) < 5e-4 and f"{exact:+.2f}" == f"{quoted:+.2f}", (exact, quoted)
    assert max(int(r["round"]) for r in rows) == m.rounds


def test_the_words_call_a_gain_only_an_interval_above_zero_over_six_seeds():
    quiet = Measured("x", "a", "b", 100, 5, 0.007, -0.037, 0.050, (-0.33, -0.64, -0.02))
    assert quiet.words() == (
        "+0.01 after 100 rounds (5 seeds, 95 % interval -0.04..+0.05: no gain shown); "
        "per computing hour -0.33 (-0.64..-0.02: less than alone)"
    )
    even = (0.1, -0.2, 0.4)
    assert ": a gain); " in Measured("x", "a", "b", 30, 6, 0.031, 0.004, 0.058, even).words()
    few = Measured("x", "a", "b", 30, 2, 0.029, 0.012, 0.045, (0.5, 0.1, 0.9))
    assert ": a lead; too few seeds to decide); " in few.words()
    assert few.hourly_words().endswith("(+0.10..+0.90: no difference shown)")  # 2 seeds: no claim of more
    assert Measured("x", "a", "b", 30, 6, 0, 0, 0, (0.5, 0.1, 0.9)).hourly_words().endswith(": more than alone)")
    assert Measured("x", "a", "b", 30, 6, 0, 0, 0, even).hourly_words().endswith(": no difference shown)")
    near = Measured("x", "a", "b", 100, 4, 0.018, -0.001, 0.037, (0.004, -0.69, 0.1))  # bounds that round to 0
    assert "(4 seeds, 95 % interval 0.00..+0.04: no gain shown)" in near.words()
    assert near.hourly_words() == "per computing hour 0.00 (-0.69..+0.10: no difference shown)"
    assert all(m.words() in SHARING_MEASURED for m in QUOTED)


@pytest.mark.gui
def test_the_swarm_page_shows_the_measured_words(qtbot, tmp_path, monkeypatch):
    from app.wizard import SetupWizard

    monkeypatch.setenv("SAPO_DATA_DIR", str(tmp_path))
    wizard = SetupWizard(scan=False)
    qtbot.addWidget(wizard)
    wizard.show()
    wizard._show_page(1)
    assert wizard.measured_label.isVisible() and wizard.measured_label.text() == SHARING_MEASURED
    # at the wizard's default size the words run past the window's foot: the page scrolls, and
    # scrolled to, each paragraph shows whole, at the height its wrapped lines need (a page laid out
    # without the scroll area squeezed them and cut the last lines off)
    from PySide6.QtWidgets import QScrollArea

    area = wizard.pages.currentWidget()
    assert isinstance(area, QScrollArea)
    for label in (wizard.measured_label, wizard.shared_label):
        area.ensureWidgetVisible(label, 0, 0)
        qtbot.wait(10)
        assert label.height() >= label.heightForWidth(label.width())
        assert label.visibleRegion().boundingRect() == label.rect()
