"""The weekly schedule as a grid: Monday to Sunday as rows, the day's 24 hours as columns.

Click or drag to paint hours in or out: the cell a drag starts on decides which (a painted
cell erases, an empty one paints) and the drag covers the rectangle from there to the pointer,
so one stroke from Monday 18:00 to Friday 23:00 gives weekday evenings. From the keyboard the
arrow keys move a focus cell, Space toggles it, Shift+arrow carries its value along, Home and
End go to the day's first and last hour. The cells are whole hours: a 28 px column keeps every
cell a comfortable target at 1000 px, and times off the hour stay in the text, which is what the
node follows (`ShareSettings` in app/controls.py keeps the two in step).
"""

from __future__ import annotations

from bisect import bisect_right

from PySide6.QtCore import QEvent, QPoint, QRectF, QSize, Qt, Signal
from PySide6.QtGui import QAccessible, QAccessibleEvent, QColor, QKeyEvent, QMouseEvent, QPainter, QPalette, QPen
from PySide6.QtWidgets import QSizePolicy, QToolTip, QWidget

from app.theme import mix
from sapo_core.control.schedule import SlotGrid

HOURS = 24
"""Columns per day: `schedule_grid(schedule, HOURS)` gives what the grid shows."""
DAY_LABELS = ("Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun")
DAY_FULL = ("Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday")
LABEL_EVERY = 3  # hours between the column labels
MIN_CELL_W, CELL_W = 18, 28
_MOVES = {Qt.Key.Key_Left: (0, -1), Qt.Key.Key_Right: (0, 1), Qt.Key.Key_Up: (-1, 0), Qt.Key.Key_Down: (1, 0)}


def cell_text(day: int, hour: int, on: bool) -> str:
    """What a screen reader and the tooltip say about one cell."""
    return f"{DAY_FULL[day]} {hour:02d}:00 to {hour + 1:02d}:00: {'runs' if on else 'does not run'}"


class ScheduleGrid(QWidget):
    grid_edited = Signal(object)
    """The volunteer changed cells (mouse or keyboard): the whole new SlotGrid, 7 rows x HOURS."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self._cells = [[True] * HOURS for _ in range(7)]
        self._focus = (0, 0)
        self._drag: tuple[int, int, bool, list[list[bool]]] | None = None  # start day, hour, value, cells before
        self.setFocusPolicy(Qt.FocusPolicy.StrongFocus)
        self.setSizePolicy(QSizePolicy.Policy.Expanding, QSizePolicy.Policy.Fixed)
        self.setAccessibleName("Weekly schedule")
        self.setCursor(Qt.CursorShape.PointingHandCursor)
        self._describe()

    # --- the data -------------------------------------------------------------------------------
    def grid(self) -> SlotGrid:
        return tuple(tuple(row) for row in self._cells)

    def set_grid(self, grid: SlotGrid) -> None:
        """Show these cells (no signal is emitted)."""
        assert len(grid) == 7 and all(len(row) == HOURS for row in grid), "a 7 x 24 grid"
        self._cells = [list(row) for row in grid]
        self._describe()
        self.update()

    def focus_cell(self) -> tuple[int, int]:
        return self._focus

    # --- geometry -------------------------------------------------------------------------------
    def _label_w(self) -> int:
        fm = self.fontMetrics()
        return max(fm.horizontalAdvance(d) for d in DAY_LABELS) + 10

    def _header_h(self) -> int:
        return self.fontMetrics().height() + 4

    def _row_h(self) -> int:
        return max(20, self.fontMetrics().height() + 6)

    def _cell_w(self) -> float:
        return (self.width() - self._label_w() - 1) / HOURS

    def sizeHint(self) -> QSize:
        return QSize(self._label_w() + CELL_W * HOURS + 1, self._header_h() + 7 * self._row_h() + 1)

    def minimumSizeHint(self) -> QSize:
        return QSize(self._label_w() + MIN_CELL_W * HOURS + 1, self.sizeHint().height())

    def _x(self, hour: int) -> int:
        """The left edge of an hour's column, in whole pixels so neighbouring cells leave no gap."""
        return self._label_w() + round(hour * self._cell_w())

    def cell_rect(self, day: int, hour: int) -> QRectF:
        return QRectF(
            self._x(hour), self._header_h() + day * self._row_h(), self._x(hour + 1) - self._x(hour), self._row_h()
        )

    def _cell_at(self, pos: QPoint, clamp: bool = False) -> tuple[int, int] | None:
        hour = bisect_right([self._x(h) for h in range(1, HOURS)], pos.x())  # the edges as painted
        if not self._label_w() <= pos.x() < self._x(HOURS):
            hour = -1 if pos.x() < self._label_w() else HOURS
        day = (pos.y() - self._header_h()) // self._row_h()
        if clamp:
            return min(max(day, 0), 6), min(max(hour, 0), HOURS - 1)
        return (day, hour) if 0 <= day < 7 and 0 <= hour < HOURS else None

    # --- painting -------------------------------------------------------------------------------
    def paintEvent(self, _event) -> None:
        pal = self.palette()
        text = pal.color(QPalette.ColorRole.WindowText)
        base = pal.color(QPalette.ColorRole.Base)
        on = pal.color(QPalette.ColorRole.Highlight)
        thin, thick = QColor(mix(base, text, 0.18)), QColor(mix(base, text, 0.5))
        p = QPainter(self)
        p.setRenderHint(QPainter.RenderHint.Antialiasing, False)
        label_w, header_h, row_h = self._label_w(), self._header_h(), self._row_h()
        right, bottom = self._x(HOURS), header_h + 7 * row_h
        p.fillRect(QRectF(label_w, header_h, right - label_w, 7 * row_h), base)
        for d in range(7):
            for h in range(HOURS):
                if self._cells[d][h]:
                    p.fillRect(self.cell_rect(d, h), on)
        p.setPen(text)
        for d, name in enumerate(DAY_LABELS):
            p.drawText(
                QRectF(0, header_h + d * row_h, label_w - 6, row_h),
                Qt.AlignmentFlag.AlignRight | Qt.AlignmentFlag.AlignVCenter,
                name,
            )
        fm = self.fontMetrics()
        for h in range(0, HOURS + 1, LABEL_EVERY):
            label = f"{h:02d}:00"
            x = self._x(h) - fm.horizontalAdvance(label) / 2
            x = min(max(x, label_w), self.width() - fm.horizontalAdvance(label))
            p.drawText(QRectF(x, 0, fm.horizontalAdvance(label) + 2, header_h), Qt.AlignmentFlag.AlignVCenter, label)
        for h in range(HOURS + 1):  # stronger lines every six hours: night, morning, afternoon, evening
            p.setPen(QPen(thick if h % 6 == 0 else thin, 1))
            x = self._x(h)
            p.drawLine(x, header_h - (3 if h % LABEL_EVERY == 0 else 0), x, bottom)
        for d in range(8):
            p.setPen(QPen(thick if d in (0, 5, 7) else thin, 1))  # weekends set apart
            y = header_h + d * row_h
            p.drawLine(label_w, y, right, y)
        if self.hasFocus():
            p.setPen(QPen(text, 2))
            p.drawRect(self.cell_rect(*self._focus).adjusted(1, 1, -1, -1))
        p.end()

    # --- mouse: the first cell decides paint or erase -----------------------------------------
    def mousePressEvent(self, event: QMouseEvent) -> None:
        cell = self._cell_at(event.position().toPoint())
        if event.button() != Qt.MouseButton.LeftButton or cell is None:
            return super().mousePressEvent(event)
        day, hour = cell
        self._drag = (day, hour, not self._cells[day][hour], [row[:] for row in self._cells])
        self._paint_to(cell)

    def mouseMoveEvent(self, event: QMouseEvent) -> None:
        if self._drag is not None:
            self._paint_to(self._cell_at(event.position().toPoint(), clamp=True))

    def mouseReleaseEvent(self, event: QMouseEvent) -> None:
        if self._drag is not None and event.button() == Qt.MouseButton.LeftButton:
            self._paint_to(self._cell_at(event.position().toPoint(), clamp=True))
            self._drag = None

    def _paint_to(self, cell: tuple[int, int]) -> None:
        day0, hour0, value, before = self._drag
        cells = [row[:] for row in before]
        for d in range(min(day0, cell[0]), max(day0, cell[0]) + 1):
            for h in range(min(hour0, cell[1]), max(hour0, cell[1]) + 1):
                cells[d][h] = value
        self._focus = cell
        self._commit(cells)

    def _commit(self, cells: list[list[bool]]) -> None:
        changed = cells != self._cells
        self._cells = cells
        self._describe()
        self.update()
        if changed:
            self.grid_edited.emit(self.grid())

    # --- keyboard -------------------------------------------------------------------------------
    def keyPressEvent(self, event: QKeyEvent) -> None:
        key, day, hour = event.key(), *self._focus
        if key in _MOVES:
            dd, dh = _MOVES[key]
            target = (min(max(day + dd, 0), 6), min(max(hour + dh, 0), HOURS - 1))
        elif key in (Qt.Key.Key_Home, Qt.Key.Key_End):
            target = (day, 0 if key == Qt.Key.Key_Home else HOURS - 1)
        elif key == Qt.Key.Key_Space:
            cells = [row[:] for row in self._cells]
            cells[day][hour] = not cells[day][hour]
            return self._commit(cells)
        else:
            return super().keyPressEvent(event)
        if event.modifiers() & Qt.KeyboardModifier.ShiftModifier:  # carry the value along
            cells = [row[:] for row in self._cells]
            value = cells[day][hour]
            for d in range(min(day, target[0]), max(day, target[0]) + 1):
                for h in range(min(hour, target[1]), max(hour, target[1]) + 1):
                    cells[d][h] = value
            self._focus = target
            return self._commit(cells)
        self._focus = target
        self._describe()
        self.update()

    def focusInEvent(self, event) -> None:
        super().focusInEvent(event)
        self.update()

    def focusOutEvent(self, event) -> None:
        super().focusOutEvent(event)
        self.update()

    # --- what assistive technology and tooltips read --------------------------------------------
    def _describe(self) -> None:
        day, hour = self._focus
        hours = sum(map(sum, self._cells))
        self.setAccessibleDescription(
            f"{cell_text(day, hour, self._cells[day][hour])}. {hours} of {7 * HOURS} hours of the week allowed. "
            f"Arrow keys move, Space toggles, Shift+arrow paints along."
        )
        if self.isVisible():
            QAccessible.updateAccessibility(QAccessibleEvent(self, QAccessible.Event.DescriptionChanged))

    def event(self, event: QEvent) -> bool:
        if event.type() == QEvent.Type.ToolTip:
            cell = self._cell_at(event.pos())
            if cell is None:
                QToolTip.hideText()
            else:
                QToolTip.showText(event.globalPos(), cell_text(*cell, self._cells[cell[0]][cell[1]]), self)
            return True
        return super().event(event)


__all__ = ["ScheduleGrid", "HOURS", "cell_text"]
