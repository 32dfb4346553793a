"""The controls: the status panel on top of every tab, and the share-and-rules settings.

`StatusPanel` shows the node's state and its reason at all times, the round's phase (or, on a
first start, the model's download: MB, per cent, time left, on the same line and bar), and
the buttons that change it: Pause now, Pause after this round, Resume, Snooze 1 h, Start.
`ShareSettings` holds what the volunteer gives: the CPU share (throttle), threads, and the
power rules of `ControlConfig` (battery, idle, schedule, temperature, free memory). The
schedule is a text field and a weekly grid (app/schedule_grid.py) kept in step both ways:
painting rewrites the text, valid text redraws the grid, invalid text says why and leaves it.
Both only emit requests; the window sends them to the node and saves them.
"""

from __future__ import annotations

import dataclasses
import os

from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import (
    QCheckBox,
    QDoubleSpinBox,
    QFormLayout,
    QFrame,
    QGroupBox,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QMenu,
    QProgressBar,
    QPushButton,
    QSlider,
    QSpinBox,
    QVBoxLayout,
    QWidget,
)

from app.models import NodeStatus
from app.schedule_grid import HOURS, ScheduleGrid
from sapo_core.config import ConfigError, ControlConfig, field_help
from sapo_core.control import protocol as P
from sapo_core.control.schedule import (
    Schedule,
    ScheduleError,
    SlotGrid,
    fits_grid,
    grid_text,
    parse_schedule,
    schedule_grid,
)

SNOOZE_SECONDS = 3600.0
SNOOZE_CHOICES = (("15 minutes", 900.0), ("1 hour", 3600.0), ("3 hours", 3 * 3600.0), ("8 hours", 8 * 3600.0))
RUN_ANYWAY_SECONDS = 3600.0


def held_by_rule(s: NodeStatus) -> bool:
    """Paused by one of the volunteer's rules (battery, schedule, idle...), not by a click."""
    return s.state == P.PAUSED and not s.reason.startswith("paused by you")


class StatusPanel(QFrame):
    pause_requested = Signal(bool)
    """Pause: now (False) or after this round (True)."""
    resume_requested = Signal()
    """Undo a pause or a snooze."""
    snooze_requested = Signal(float)
    """Pause for this many seconds, then resume by itself."""
    start_requested = Signal()
    """Start the node (it is not running)."""
    run_anyway_requested = Signal(float)
    """Set the rules aside for this many seconds (a rule holds the node)."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.typical_round_s = 0.0  # recent rounds' mean length (the window sets it): the end estimate
        self.setObjectName("statusPanel")
        self.setFrameShape(QFrame.Shape.StyledPanel)
        self.state_label = QLabel()
        self.state_label.setObjectName("stateLabel")
        self.reason_label = QLabel(wordWrap=True)
        self.reason_label.setObjectName("reasonLabel")
        self.reason_label.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.progress = QProgressBar(textVisible=False, maximumHeight=6)
        self.resources_label = QLabel(wordWrap=True)  # a long line must not widen the window past 1000 px
        self.resources_label.setObjectName("resourcesLabel")

        self.pause_button = QPushButton("Pause now")
        self.pause_button.setToolTip("Pause within a couple of seconds, mid-round; the node keeps its state")
        self.pause_after_button = QPushButton("Pause after this round")
        self.pause_after_button.setToolTip("Finish the round in progress, then pause")
        self.resume_button = QPushButton("Resume")
        self.snooze_button = QPushButton("Snooze")
        self.snooze_button.setToolTip("Pause for a while, then resume by itself")
        snooze_menu = QMenu(self.snooze_button)
        for text, seconds in SNOOZE_CHOICES:
            snooze_menu.addAction(f"Snooze {text}", lambda s=seconds: self.snooze_requested.emit(s))
        self.snooze_button.setMenu(snooze_menu)
        self.run_anyway_button = QPushButton("Run anyway for 1 h")
        self.run_anyway_button.setToolTip("Set your rules (schedule, battery, idle, temperature) aside for an hour")
        self.run_anyway_button.clicked.connect(self._on_run_anyway_button_clicked)
        self.start_button = QPushButton("Start")
        self.start_button.setToolTip("Start the node with the saved settings")
        for b, name in (
            (self.pause_button, "Pause now"),
            (self.pause_after_button, "Pause after this round"),
            (self.resume_button, "Resume"),
            (self.snooze_button, "Snooze"),
            (self.start_button, "Start the node"),
            (self.run_anyway_button, "Run anyway for one hour"),
        ):
            b.setAccessibleName(name)
        self.pause_button.clicked.connect(self._on_pause_button_clicked)
        self.pause_after_button.clicked.connect(self._on_pause_after_button_clicked)
        self.resume_button.clicked.connect(self.resume_requested)
        self.start_button.clicked.connect(self.start_requested)

        text = QVBoxLayout()
        text.setSpacing(2)
        text.addWidget(self.state_label)
        text.addWidget(self.reason_label)
        text.addWidget(self.resources_label)
        buttons = QHBoxLayout()
        for b in (
            self.start_button,
            self.run_anyway_button,
            self.pause_button,
            self.pause_after_button,
            self.resume_button,
            self.snooze_button,
        ):
            buttons.addWidget(b)
        top = QHBoxLayout()
        top.addLayout(text, 1)
        top.addLayout(buttons)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(10, 8, 10, 6)
        layout.addLayout(top)
        layout.addWidget(self.progress)
        self.refresh(NodeStatus())

    def refresh(self, s: NodeStatus) -> None:
        from app.theme import status_colours

        c = status_colours()
        color = {
            P.RUNNING: c["ok"],
            P.PAUSED: c["warning"],
            P.SNOOZED: c["warning"],
            P.PAUSING: c["warning"],
            P.CRASHED: c["error"],
            P.STARTING: c["info"],
        }.get(s.state, c["muted"])
        self.state_label.setText(f"<span style='color:{color}; font-size:15pt; font-weight:600'>● {s.title}</span>")
        self.state_label.setProperty("state", s.state)  # tests and style sheets read it
        detail = s.detail or " "
        self.reason_label.setText(detail if len(detail) <= 160 else detail[:157] + "…")
        self.reason_label.setToolTip(detail if len(detail) > 160 else "")
        extras = []
        if s.model_id:
            extras.append(f"model {s.model_id} ({s.sampler})")
        eta = s.round_eta(self.typical_round_s)
        if eta is not None:
            extras.append(f"round ends in ~{eta:.0f} s" if eta >= 1 else "round ending")
        if s.alive and s.rss_bytes:
            extras.append(f"node memory {s.rss_bytes / 2**20:,.0f} MB")
        if s.alive:
            extras.append(f"CPU share {s.throttle:.0%}")
        self.resources_label.setText(" · ".join(extras))
        by_you = s.state == P.PAUSED and s.reason.startswith("paused by you")
        alive = s.alive and s.state != P.STOPPING
        rule = alive and held_by_rule(s)
        self.start_button.setVisible(not s.alive)
        self.run_anyway_button.setVisible(rule)  # Resume cannot lift a rule: this can
        self.pause_button.setEnabled(alive and s.state not in (P.PAUSED, P.SNOOZED))
        self.pause_after_button.setEnabled(s.state == P.RUNNING)
        self.resume_button.setEnabled(alive and (by_you or s.state in (P.SNOOZED, P.PAUSING)))
        self.snooze_button.setEnabled(alive and s.state != P.SNOOZED)
        fraction = s.download_fraction
        if fraction is not None:  # first start: the model's download (bytes overflow the bar's int)
            self.progress.setRange(0, 1000)
            self.progress.setValue(round(fraction * 1000))
        elif s.state == P.RUNNING and s.total:
            self.progress.setRange(0, s.total)
            self.progress.setValue(min(s.done, s.total))
        elif s.state in (P.STARTING, P.STOPPING) or (s.state == P.RUNNING and s.phase):
            self.progress.setRange(0, 0)  # busy, length unknown
        else:
            self.progress.setRange(0, 1)
            self.progress.setValue(0)
        # the bar is 6 px and textless: its name and description say what it measures
        self.progress.setAccessibleName("Model download progress" if s.downloading else "Round progress")
        self.progress.setAccessibleDescription(s.detail)

    def _on_pause_button_clicked(self) -> None:
        self.pause_requested.emit(False)

    def _on_pause_after_button_clicked(self) -> None:
        self.pause_requested.emit(True)

    def _on_run_anyway_button_clicked(self) -> None:
        self.run_anyway_requested.emit(RUN_ANYWAY_SECONDS)


class ShareSettings(QWidget):
    throttle_changed = Signal(float)
    """The CPU share the node may use, 0.05..1 (sent when the slider is released)."""
    threads_changed = Signal(int)
    """Threads for sampling and training; 0 = all physical cores."""
    rules_changed = Signal(object)
    """A whole new ControlConfig (the power rules and the throttle), after Apply."""
    setup_requested = Signal()
    """Run the first-run setup again (model, swarm)."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        helps = field_help(ControlConfig)
        self.control = ControlConfig()
        self.threads = 0
        self._grid_empty = False  # painted empty: no text says "never", so Apply refuses
        self._writing_schedule = False  # the grid is rewriting the text: no redraw back
        layout = QVBoxLayout(self)
        layout.setContentsMargins(8, 8, 8, 8)
        layout.addWidget(self._share_box(helps))
        layout.addWidget(self._rules_box(helps))
        layout.addWidget(self._node_box())
        layout.addStretch(1)
        self.set_control(self.control, 0)

    def _share_box(self, helps: dict[str, str]) -> QGroupBox:
        """How much: the CPU time and the threads."""
        share = QGroupBox("Share of this computer")
        form = QFormLayout(share)
        self.throttle_slider = QSlider(Qt.Orientation.Horizontal, minimum=5, maximum=100, singleStep=5, pageStep=10)
        self.throttle_slider.setToolTip(helps["throttle"])
        self.throttle_value = QLabel()
        self.throttle_value.setMinimumWidth(48)
        self.throttle_slider.valueChanged.connect(self._on_throttle_slider_value_changed)
        self.throttle_slider.sliderReleased.connect(self._on_throttle_slider_released)
        row = QHBoxLayout()
        row.addWidget(self.throttle_slider, 1)
        row.addWidget(self.throttle_value)
        form.addRow("CPU time:", row)
        self.threads_spin = QSpinBox(minimum=0, maximum=max(1, os.cpu_count() or 1), specialValueText="all cores")
        self.threads_spin.setToolTip("Threads for sampling and training; fewer leaves cores free for you")
        self.threads_spin.editingFinished.connect(self._on_threads_spin_editing_finished)
        form.addRow("Threads:", self.threads_spin)
        self.threads_spin.setMaximumWidth(160)
        return share

    def _rules_box(self, helps: dict[str, str]) -> QGroupBox:
        """When: battery, idle, the schedule (text and grid), temperature, free memory; Apply."""
        rules = QGroupBox("When to run")
        form = QFormLayout(rules)
        self.battery_check = QCheckBox("Pause while on battery", toolTip=helps["pause_on_battery"])
        self.idle_check = QCheckBox("Run only while I am away", toolTip=helps["only_when_idle"])
        self.idle_minutes = QDoubleSpinBox(
            minimum=0, maximum=240, decimals=0, suffix=" min without input", toolTip=helps["idle_minutes"]
        )
        self.schedule_edit = QLineEdit(
            placeholderText="any time, e.g. mon-fri 18:00-08:00; sat-sun 00:00-24:00", toolTip=helps["schedule"]
        )
        self.schedule_edit.setAccessibleName("Schedule as text")
        self.schedule_edit.textChanged.connect(self._on_schedule_edit_text_changed)
        self.schedule_grid = ScheduleGrid()
        self.schedule_grid.grid_edited.connect(self._on_schedule_grid_edited)
        self.schedule_error = QLabel(wordWrap=True, visible=False)
        self.schedule_error.setObjectName("errorText")
        self.schedule_note = QLabel(wordWrap=True)
        self.temperature_spin = QDoubleSpinBox(
            minimum=0,
            maximum=120,
            decimals=0,
            suffix=" °C",
            specialValueText="no limit",
            toolTip=helps["max_temperature_c"],
        )
        self.memory_spin = QDoubleSpinBox(
            minimum=0,
            maximum=1024,
            decimals=1,
            singleStep=0.5,
            suffix=" GB",
            specialValueText="no limit",
            toolTip=helps["min_free_memory_gb"],
        )
        for spin in (self.temperature_spin, self.memory_spin):
            spin.setMaximumWidth(160)
        form.addRow(self.battery_check)
        idle = QHBoxLayout()
        idle.addWidget(self.idle_check)
        idle.addWidget(self.idle_minutes)
        idle.addStretch(1)
        form.addRow(idle)
        schedule = QVBoxLayout()
        schedule.setSpacing(4)
        for w in (self.schedule_edit, self.schedule_grid, self.schedule_error, self.schedule_note):
            schedule.addWidget(w)
        form.addRow("Schedule:", schedule)
        form.addRow("Pause above CPU temperature:", self.temperature_spin)
        form.addRow("Pause when free memory is below:", self.memory_spin)
        self.rules_error = QLabel(wordWrap=True)
        self.rules_error.setObjectName("errorText")
        self.apply_button = QPushButton("Apply rules")
        self.apply_button.clicked.connect(self._on_apply_button_clicked)
        apply_row = QHBoxLayout()
        apply_row.addWidget(self.rules_error, 1)
        apply_row.addWidget(self.apply_button)
        form.addRow(apply_row)
        return rules

    def _node_box(self) -> QGroupBox:
        """What: the model and swarm (the setup again), and starting at login."""
        node = QGroupBox("Model and swarm")
        col = QVBoxLayout(node)
        self.node_label = QLabel(wordWrap=True)
        self.node_label.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.setup_button = QPushButton("Setup again…")
        self.setup_button.setToolTip("Choose the model, the swarm and the share again; the node restarts")
        self.setup_button.clicked.connect(self.setup_requested)
        col.addWidget(self.node_label)
        col.addWidget(self.setup_button, 0, Qt.AlignmentFlag.AlignLeft)
        from app import autostart

        self.autostart_box = QCheckBox("Start SAPO Swarm when I log in (in the tray, training as set above)")
        self.autostart_box.setAccessibleName("Start at login")
        try:
            self.autostart_box.setChecked(autostart.is_enabled())
        except OSError:
            pass
        self.autostart_box.toggled.connect(self._on_autostart_box_toggled)
        col.addWidget(self.autostart_box)
        return node

    def set_control(self, control: ControlConfig, threads: int) -> None:
        """Show these values (no signal is emitted)."""
        self.control, self.threads = control, threads
        widgets = (
            self.throttle_slider,
            self.threads_spin,
            self.battery_check,
            self.idle_check,
            self.idle_minutes,
            self.schedule_edit,
            self.temperature_spin,
            self.memory_spin,
        )
        for w in widgets:
            w.blockSignals(True)
        self.throttle_slider.setValue(round(control.throttle * 100))
        self.throttle_value.setText(f"{round(control.throttle * 100)} %")
        self.threads_spin.setValue(threads)
        self.battery_check.setChecked(control.pause_on_battery)
        self.idle_check.setChecked(control.only_when_idle)
        self.idle_minutes.setValue(control.idle_minutes)
        self.schedule_edit.setText(control.schedule)
        self._show_schedule(parse_schedule(control.schedule))  # ControlConfig checked it
        self.temperature_spin.setValue(control.max_temperature_c)
        self.memory_spin.setValue(control.min_free_memory_gb)
        for w in widgets:
            w.blockSignals(False)
        self.rules_error.clear()

    def _show_schedule(self, schedule: Schedule) -> None:
        """Draw the grid from a parsed schedule and clear the schedule's error."""
        self._grid_empty = False
        self.schedule_grid.set_grid(schedule_grid(schedule, HOURS))
        self._set_schedule_error("")
        self._set_schedule_note(fits_grid(schedule, HOURS))

    def _set_schedule_error(self, text: str) -> None:
        self.schedule_error.setText(text)
        self.schedule_error.setVisible(bool(text))

    def _set_schedule_note(self, fits: bool) -> None:
        from app.theme import status_colours

        note = (
            "Drag across the grid to paint the hours the node may run; start on a painted hour to clear instead."
            if fits
            else "The text has minutes off the hour: the grid shows the hours they touch, and "
            "painting rounds them to whole hours."
        )
        self.schedule_note.setText(f"<span style='color:{status_colours()['muted']}'>{note}</span>")

    def _on_schedule_edit_text_changed(self, text: str) -> None:
        if self._writing_schedule:
            return
        try:
            schedule = parse_schedule(text.strip())
        except ScheduleError as e:
            self._set_schedule_error(str(e))  # the grid keeps what it showed
            return
        self._show_schedule(schedule)

    def _on_schedule_grid_edited(self, grid: SlotGrid) -> None:
        try:
            text = grid_text(grid)
        except ScheduleError as e:
            self._grid_empty = True
            self._set_schedule_error(str(e)[:1].upper() + str(e)[1:])
            return
        self._grid_empty = False
        self._writing_schedule = True
        try:
            self.schedule_edit.setText(text)
        finally:
            self._writing_schedule = False
        self._set_schedule_error("")
        self._set_schedule_note(True)

    def _on_autostart_box_toggled(self, on: bool) -> None:
        from app import autostart

        try:
            autostart.set_enabled(on)
            self.rules_error.setText("")
        except OSError as e:
            self.rules_error.setText(f"Could not change starting at login: {e}")

    def set_node_text(self, text: str) -> None:
        self.node_label.setText(text)

    def edited_control(self) -> ControlConfig:
        """The rules as the widgets show them; ConfigError says which one is wrong."""
        if self._grid_empty:
            raise ConfigError(f"control.schedule: {self.schedule_error.text()}")
        return dataclasses.replace(
            self.control,
            throttle=self.throttle_slider.value() / 100,
            pause_on_battery=self.battery_check.isChecked(),
            only_when_idle=self.idle_check.isChecked(),
            idle_minutes=self.idle_minutes.value(),
            schedule=self.schedule_edit.text().strip(),
            max_temperature_c=self.temperature_spin.value(),
            min_free_memory_gb=self.memory_spin.value(),
        )

    def _on_throttle_slider_value_changed(self, value: int) -> None:
        self.throttle_value.setText(f"{value} %")
        if not self.throttle_slider.isSliderDown():  # keyboard, wheel, setValue from a test
            self._on_throttle_slider_released()

    def _on_throttle_slider_released(self) -> None:
        share = self.throttle_slider.value() / 100
        if abs(share - self.control.throttle) > 1e-9:
            self.control = dataclasses.replace(self.control, throttle=share)
            self.throttle_changed.emit(share)

    def _on_threads_spin_editing_finished(self) -> None:
        if self.threads_spin.value() != self.threads:
            self.threads = self.threads_spin.value()
            self.threads_changed.emit(self.threads)

    def _on_apply_button_clicked(self) -> None:
        try:
            control = self.edited_control()
        except ConfigError as e:
            self.rules_error.setText(str(e))
            return
        self.rules_error.setText("")
        self.control = control
        self.rules_changed.emit(control)


__all__ = ["StatusPanel", "ShareSettings", "SNOOZE_SECONDS"]
