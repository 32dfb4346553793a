"""The Settings tab's weekly schedule grid next to the text field: a drag paints or erases a
block and the text says it, typed text redraws the grid, invalid text keeps it and says why in red,
the keyboard moves and toggles, nothing painted is refused, and what Apply saves in node.toml parses
to the grid's slots. Real widgets, offscreen; the window test starts no node."""

from __future__ import annotations

import pytest
from PySide6.QtCore import Qt
from PySide6.QtGui import QPalette
from PySide6.QtWidgets import QWidget

from app.controls import ShareSettings
from app.schedule_grid import HOURS
from sapo_core.config import ConfigError, ControlConfig, load_config, save_config
from sapo_core.control.schedule import parse_schedule, schedule_grid

from helpers import light_config

pytestmark = pytest.mark.gui
MON, TUE, WED, THU, FRI, SAT, SUN = range(7)


def on_cells(grid) -> set[tuple[int, int]]:
    return {(d, h) for d, row in enumerate(grid) for h, on in enumerate(row) if on}


@pytest.fixture
def share(qtbot):
    w = ShareSettings()
    qtbot.addWidget(w)
    w.set_control(ControlConfig(schedule="sat-sun 00:00-24:00"), 0)
    w.resize(900, 700)
    w.show()
    qtbot.waitExposed(w)
    return w


def drag(qtbot, grid, first: tuple[int, int], last: tuple[int, int], via_middle: bool = True) -> None:
    a, b = grid.cell_rect(*first).center().toPoint(), grid.cell_rect(*last).center().toPoint()
    qtbot.mousePress(grid, Qt.MouseButton.LeftButton, pos=a)
    if via_middle:  # the text follows the drag as it goes
        qtbot.mouseMove(grid, pos=(a + b) / 2)
    qtbot.mouseMove(grid, pos=b)
    qtbot.mouseRelease(grid, Qt.MouseButton.LeftButton, pos=b)


def test_a_drag_paints_a_block_and_the_text_says_it(qtbot, share):
    grid = share.schedule_grid
    assert on_cells(grid.grid()) == {(d, h) for d in (SAT, SUN) for h in range(24)}
    with qtbot.waitSignal(grid.grid_edited):
        drag(qtbot, grid, (MON, 18), (FRI, 23))  # starts on an empty cell: paints the rectangle
    assert share.schedule_edit.text() == "mon-fri 18:00-24:00; sat-sun 00:00-24:00"
    assert on_cells(grid.grid()) == {(d, h) for d in range(5) for h in range(18, 24)} | {
        (d, h) for d in (SAT, SUN) for h in range(24)
    }
    drag(qtbot, grid, (SAT, 0), (SUN, 11))  # starts on a painted cell: erases
    assert share.schedule_edit.text() == "mon-fri 18:00-24:00; sat-sun 12:00-24:00"
    drag(qtbot, grid, (TUE, 7), (FRI, 0))  # dragged up and left: the same rectangle, early mornings
    assert share.schedule_edit.text() == "mon-thu 18:00-08:00; fri 18:00-24:00; sat-sun 12:00-24:00"  # overnight
    assert on_cells(schedule_grid(parse_schedule(share.schedule_edit.text()), HOURS)) == on_cells(grid.grid())
    assert not share.schedule_error.isVisible()


def test_typed_text_redraws_the_grid(qtbot, share):
    share.schedule_edit.selectAll()
    qtbot.keyClicks(share.schedule_edit, "daily 22:00-07:00")
    cells = on_cells(share.schedule_grid.grid())
    assert (MON, 22) in cells and (MON, 6) in cells and (MON, 7) not in cells and (SUN, 12) not in cells
    assert cells == {(d, h) for d in range(7) for h in (*range(7), 22, 23)}
    assert not share.schedule_error.isVisible()
    share.schedule_edit.setText("")  # empty: any time, the whole week painted
    assert len(on_cells(share.schedule_grid.grid())) == 7 * 24
    share.schedule_edit.setText("tue 09:15-10:20")  # finer than the grid: shown by the hours it touches
    assert on_cells(share.schedule_grid.grid()) == {(TUE, 9), (TUE, 10)}
    assert "minutes off the hour" in share.schedule_note.text()
    assert share.schedule_edit.text() == "tue 09:15-10:20"  # the text is not rewritten until a cell is painted


def test_invalid_text_keeps_the_grid_and_shows_the_parsers_message_in_red(qtbot):
    from app.theme import colours, style_sheet

    holder = QWidget()
    holder.setStyleSheet(style_sheet())  # as the window does
    qtbot.addWidget(holder)
    share = ShareSettings(holder)
    share.set_control(ControlConfig(schedule="mon-fri 18:00-08:00"), 0)
    holder.resize(900, 700)
    holder.show()
    before = share.schedule_grid.grid()
    share.schedule_edit.setText("mon-fry 10:00-12:00")
    assert share.schedule_grid.grid() == before
    assert share.schedule_error.isVisible() and "unknown day 'fry'" in share.schedule_error.text()
    assert (
        share.schedule_error.palette().color(QPalette.ColorRole.WindowText).name().lower() == colours()["error"].lower()
    )
    share.schedule_edit.setText("mon-fri 18:00-09:00")  # fixed: the grid follows, the message goes
    assert (TUE, 8) in on_cells(share.schedule_grid.grid()) and not share.schedule_error.isVisible()


def test_the_keyboard_moves_toggles_and_paints_along(qtbot, share):
    grid = share.schedule_grid
    grid.setFocus()
    assert grid.accessibleName() == "Weekly schedule"
    for _ in range(20):
        qtbot.keyClick(grid, Qt.Key.Key_Right)
    qtbot.keyClick(grid, Qt.Key.Key_Down)
    assert grid.focus_cell() == (TUE, 20)
    assert "Tuesday 20:00 to 21:00: does not run" in grid.accessibleDescription()
    qtbot.keyClick(grid, Qt.Key.Key_Space)
    assert share.schedule_edit.text() == "tue 20:00-21:00; sat-sun 00:00-24:00"
    assert "Tuesday 20:00 to 21:00: runs" in grid.accessibleDescription()
    for _ in range(2):  # Shift+arrow carries the painted value along
        qtbot.keyClick(grid, Qt.Key.Key_Down, Qt.KeyboardModifier.ShiftModifier)
    assert share.schedule_edit.text() == "tue-thu 20:00-21:00; sat-sun 00:00-24:00"
    qtbot.keyClick(grid, Qt.Key.Key_Space)  # and Space takes one back out
    assert share.schedule_edit.text() == "tue-wed 20:00-21:00; sat-sun 00:00-24:00"
    qtbot.keyClick(grid, Qt.Key.Key_End)
    qtbot.keyClick(grid, Qt.Key.Key_Down)  # clamped at the edges
    qtbot.keyClick(grid, Qt.Key.Key_Down)
    qtbot.keyClick(grid, Qt.Key.Key_Down)
    qtbot.keyClick(grid, Qt.Key.Key_Down)
    assert grid.focus_cell() == (SUN, 23)
    qtbot.keyClick(grid, Qt.Key.Key_Home)
    assert grid.focus_cell() == (SUN, 0)


def test_nothing_painted_is_refused_and_apply_saves_nothing(qtbot, share):
    with qtbot.assertNotEmitted(share.rules_changed):
        drag(qtbot, share.schedule_grid, (SAT, 0), (SUN, 23), via_middle=False)  # erase it all
        assert not on_cells(share.schedule_grid.grid())
        # no text means "never" ("" is any time): the text keeps the drag's last wording (the press erased Sat 00:00)
        assert share.schedule_edit.text() == "sat 01:00-24:00; sun 00:00-24:00"
        assert "never run" in share.schedule_error.text() and share.schedule_error.isVisible()
        with pytest.raises(ConfigError, match="control.schedule: .*never run"):
            share.edited_control()
        qtbot.mouseClick(share.apply_button, Qt.MouseButton.LeftButton)
        assert "never run" in share.rules_error.text()
    drag(qtbot, share.schedule_grid, (WED, 9), (WED, 9))  # one click paints one hour and lifts the refusal
    assert share.schedule_edit.text() == "wed 09:00-10:00" and share.edited_control().schedule == "wed 09:00-10:00"


def test_the_saved_schedule_parses_to_the_painted_slots_and_the_grid_fits_1000_by_640(qtbot, data_dir):
    from app.bridge import WorkerBridge
    from app.settings import UiSettings, node_config_path
    from app.window import TABS, MainWindow

    data_dir.mkdir()
    save_config(light_config(data_dir / "run"), data_dir / "node.toml")
    window = MainWindow(WorkerBridge(), UiSettings(), use_tray=False)
    qtbot.addWidget(window)
    window.resize(1000, 640)
    window.show()
    window.tabs.setCurrentIndex(TABS.index("Settings"))
    qtbot.waitExposed(window)
    share, grid = window.share, window.share.schedule_grid
    # fits: no sideways scrolling, every cell a comfortable target
    scroll = window.tabs.currentWidget()
    qtbot.waitUntil(lambda: share.width() == scroll.viewport().width())  # laid out to the viewport's width
    assert scroll.horizontalScrollBar().maximum() == 0
    assert grid.cell_rect(MON, 0).width() >= 24 and grid.cell_rect(MON, 0).height() >= 20
    drag(qtbot, grid, (MON, 0), (SUN, 23))  # the saved "" (any time) is all painted: this erases it all
    drag(qtbot, grid, (MON, 19), (THU, 23))
    drag(qtbot, grid, (TUE, 0), (FRI, 6))
    drag(qtbot, grid, (SAT, 9), (SUN, 16))
    painted = grid.grid()
    with qtbot.waitSignal(share.rules_changed):
        qtbot.mouseClick(share.apply_button, Qt.MouseButton.LeftButton)
    saved = load_config(node_config_path()).control.schedule
    assert saved == share.schedule_edit.text() == "mon-thu 19:00-07:00; sat-sun 09:00-17:00"
    assert schedule_grid(parse_schedule(saved), HOURS) == painted
