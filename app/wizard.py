"""The first-run setup: this computer and the model that fits, the swarm, the share; then Join.

Three short pages. The swarm step offers: join a listed swarm, join by invitation, start a
swarm on this network, train alone; it says which it picked first and why, warns when an
invitation holds only private addresses, and says what is shared. The hardware scan runs in a
child process (hardware_scan.py) while the user reads; the recommended model is preselected with
the reason, the others are marked fits / slow / doesn't fit. The answers are `SetupChoices`, which
`apply_choices` turns into a NodeConfig (app/setup_choices.py: pure functions, tested without a
display); the window saves it as node.toml and starts the node.
"""

from __future__ import annotations

import dataclasses
import os

from PySide6.QtCore import Qt, Signal
from PySide6.QtGui import QBrush, QColor, QFont
from PySide6.QtWidgets import (
    QButtonGroup,
    QCheckBox,
    QComboBox,
    QDialog,
    QFormLayout,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QProgressBar,
    QPushButton,
    QRadioButton,
    QScrollArea,
    QSlider,
    QSpinBox,
    QStackedWidget,
    QTreeWidget,
    QTreeWidgetItem,
    QVBoxLayout,
    QWidget,
)

from app.hardware_scan import HardwareReport, HardwareScan
from app.setup_choices import (
    ALONE,
    HOST,
    JOIN,
    LISTED,
    SHARED_WORDS,
    SHARING_MEASURED,
    SetupChoices,
    address_problem,
    address_warning,
    apply_choices,
    choices_from_config,
    default_swarm_choice,
)
from app.theme import status_colours, style_sheet
from sapo_core.catalog import FITS, NO_FIT, SLOW
from sapo_core.config import NodeConfig
from sapo_core.swarm.swarmlist import SwarmEntry, SwarmListError, load_swarms


def verdict_colours() -> dict[str, str]:
    c = status_colours()
    return {FITS: c["ok"], SLOW: c["warning"], NO_FIT: c["error"]}


def _heading(text: str, sub: str) -> QLabel:
    muted = status_colours()["muted"]  # from the palette: a fixed grey vanished on a dark desktop
    label = QLabel(f"<h2 style='margin-bottom:2px'>{text}</h2><div style='color:{muted}'>{sub}</div>", wordWrap=True)
    return label


def _scrolling(page: QWidget) -> QScrollArea:
    """`page` in a frameless scroll area: at the window's default size its words wrap onto more lines
    than fit, and a scroll bar is better than a cut-off sentence."""
    area = QScrollArea(widgetResizable=True, frameShape=QScrollArea.Shape.NoFrame)
    area.setWidget(page)
    return area


class SetupWizard(QDialog):
    joined = Signal(object)
    """The user pressed Join: the NodeConfig to save and run."""

    def __init__(
        self,
        base: NodeConfig | None = None,
        parent: QWidget | None = None,
        scan: bool = True,
        invitation: str = "",
        measure: bool = True,
    ) -> None:
        super().__init__(parent)
        self.setStyleSheet(style_sheet())  # inline errors (#errorText) in red, colours from the palette
        self.setWindowTitle("Set up SAPO Swarm")
        self.base = base or NodeConfig()
        self.choices = choices_from_config(self.base) if base is not None else SetupChoices()
        try:
            self.swarms, self.swarms_problem = load_swarms(), ""
        except (SwarmListError, OSError) as e:
            self.swarms, self.swarms_problem = [], f"The list of swarms could not be read: {e}"
        choice, listed, self.choice_reason = default_swarm_choice(base, self.swarms, invitation)
        self.choices = dataclasses.replace(
            self.choices, swarm=choice, listed=listed or self.choices.listed, address=invitation or self.choices.address
        )
        self.report: HardwareReport | None = None
        self.scanner = HardwareScan(self)
        self.scanner.finished.connect(self._on_scanner_finished)
        self.scanner.failed.connect(self._on_scanner_failed)
        # this machine's real rounds, measured while the first page is read (once: then cached)
        self.measure = measure
        self.measurer = HardwareScan(self)
        self.measurer.finished.connect(self._on_measurer_finished)
        self.measurer.failed.connect(self._on_measurer_failed)

        self.pages = QStackedWidget()
        self.pages.addWidget(self._machine_page())
        self.pages.addWidget(_scrolling(self._swarm_page()))  # its words outgrow a small window
        self.pages.addWidget(self._share_page())
        self.back_button = QPushButton("Back")
        self.next_button = QPushButton("Next")
        self.join_button = QPushButton("Join")
        self.join_button.setDefault(True)
        self.join_button.setObjectName("joinButton")
        self.back_button.clicked.connect(self._on_back_button_clicked)
        self.next_button.clicked.connect(self._on_next_button_clicked)
        self.join_button.clicked.connect(self._on_join_button_clicked)
        self.step_label = QLabel()
        buttons = QHBoxLayout()
        buttons.addWidget(self.step_label, 1)
        for b in (self.back_button, self.next_button, self.join_button):
            buttons.addWidget(b)
        layout = QVBoxLayout(self)
        layout.addWidget(self.pages, 1)
        layout.addLayout(buttons)
        self.resize(760, 560)
        self._show_page(0)
        if scan:
            self.scanner.start()

    # --- page 1: this computer ---------------------------------------------------------------------
    def _machine_page(self) -> QWidget:
        page = QWidget()
        col = QVBoxLayout(page)
        col.addWidget(
            _heading(
                "This computer",
                "What it has, and the model it can train. The node trains in "
                "the background; you stay in control of how much it takes.",
            )
        )
        self.scan_busy = QProgressBar(textVisible=False, maximumHeight=6)
        self.scan_busy.setRange(0, 0)
        self.scan_label = QLabel("Scanning this computer…", wordWrap=True)
        self.measure_label = QLabel(wordWrap=True)
        self.measure_label.hide()
        self.machine_form = QFormLayout()
        self.models = QTreeWidget()
        self.models.setHeaderLabels(["Model", "Verdict", "Parameters", "Download", "Rounds / h", "Memory", "Licence"])
        self.models.setAccessibleName("Models this computer can train")
        self.models.setRootIsDecorated(False)
        self.models.currentItemChanged.connect(self._on_models_current_item_changed)
        self.model_note = QLabel(wordWrap=True)  # the whole "why" of the chosen model, never cut
        self.model_note.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        col.addWidget(self.scan_busy)
        col.addWidget(self.scan_label)
        col.addWidget(self.measure_label)
        col.addLayout(self.machine_form)
        col.addWidget(self.models, 1)
        col.addWidget(self.model_note)
        return page

    def _on_scanner_finished(self, report: HardwareReport) -> None:
        self._show_report(report)
        if report.measured or not self.measure:
            self.scan_busy.hide()
            return
        self.measure_label.setText(
            "Measuring this computer: two real rounds of the built-in model (about a minute, once). "
            "Rounds per hour below are a formula's guess until then."
        )
        self.measure_label.show()
        self.measurer.start(probe=True)

    def _on_measurer_finished(self, report: HardwareReport) -> None:
        self.scan_busy.hide()
        p = report.probe or {}
        self.measure_label.setText(
            f"Measured on this computer: a round of the built-in model ({p.get('threads', '?')} thread(s), "
            f"2 questions × 4 answers) took {float(p.get('round_seconds', 0)):.0f} s; rounds per hour below "
            "are scaled from it."
        )
        self._show_report(report)

    def _on_measurer_failed(self, why: str) -> None:
        self.scan_busy.hide()
        self.measure_label.setText(
            f"Could not measure this computer ({why}); rounds per hour below are a formula's guess "
            "(sapo-node hardware --probe measures it later)."
        )

    def _show_report(self, report: HardwareReport) -> None:
        """The scan's figures on the page (again, when the measured ones replace the guess)."""
        chosen = self.models.currentItem()
        keep = chosen.data(0, Qt.ItemDataRole.UserRole) if chosen is not None and self.report is not None else None
        if self.report is not None and keep == self.report.recommended:
            keep = None  # not the user's pick but the old recommendation: follow the new one
        self.report = report
        self.scan_label.setText(f"<b>Recommended:</b> {report.recommended_reason}")
        while self.machine_form.rowCount():
            self.machine_form.removeRow(0)
        self.models.clear()
        self.model_note.setText("")
        for what, value, how in report.machine:
            label = QLabel(value)
            label.setToolTip(f"found by: {how}")
            self.machine_form.addRow(f"{what}:", label)
        preferred = keep or (self.choices.model if report.option(self.choices.model) else report.recommended)
        bold = QFont()
        bold.setBold(True)
        for m in sorted(report.models, key=lambda m: m.usefulness()):
            item = QTreeWidgetItem(m.row(report.recommended))
            item.setData(0, Qt.ItemDataRole.UserRole, m.id)
            item.setForeground(1, QBrush(QColor(verdict_colours().get(m.status, status_colours()["plain"]))))
            for c in range(7):
                item.setToolTip(c, m.reason)
            if m.id == report.recommended:
                item.setFont(0, bold)
                item.setToolTip(0, f"recommended: {report.recommended_reason}")
            self.models.addTopLevelItem(item)
            if m.id == preferred:
                self.models.setCurrentItem(item)
        self.models.headerItem().setText(5, f"Memory (of {report.budget_gb:.1f} GB)")
        for col in range(7):
            self.models.resizeColumnToContents(col)
        for w in report.warnings:
            self.model_note.setText(self.model_note.text() + f"\n⚠ {w}")

    def _on_scanner_failed(self, why: str) -> None:
        self.scan_busy.hide()
        self.scan_label.setText(
            f"Could not scan this computer ({why}). The node picks the largest model that fits when it starts."
        )
        self.choices = dataclasses.replace(self.choices, model="auto")

    def _on_models_current_item_changed(self, item: QTreeWidgetItem | None, _old: QTreeWidgetItem | None) -> None:
        if item is None or self.report is None:
            return
        model_id = item.data(0, Qt.ItemDataRole.UserRole)
        self.choices = dataclasses.replace(self.choices, model=model_id)
        m = self.report.option(model_id)
        note = f"<b>{model_id}</b> — {m.reason}<br>{m.details()}" if m else model_id
        if m is not None and m.status == NO_FIT:
            note += (
                f". <span style='color:{status_colours()['error']}'>It will not fit: the node will refuse to "
                "start.</span>"
            )
        elif m is not None and m.status == SLOW:
            note += ". It fits, but rounds will be long on this computer."
        self.model_note.setText(note)

    # --- page 2: the swarm -------------------------------------------------------------------------
    def _swarm_page(self) -> QWidget:
        page = QWidget()
        col = QVBoxLayout(page)
        col.addWidget(
            _heading(
                "The swarm",
                "In a swarm, every computer shares the answers it generates and "
                "trains on the others' too (SAPO). Alone, it trains only on its own.",
            )
        )
        self.swarm_group = QButtonGroup(self)
        self.listed_radio = QRadioButton("Join a listed swarm")
        self.join_radio = QRadioButton("Join by invitation (a sapo://join/… link, or an invite address)")
        self.host_radio = QRadioButton("Start a swarm on this network (others join through this computer)")
        self.alone_radio = QRadioButton("Train alone (nothing is shared)")
        self.listed_combo = QComboBox()
        for e in self.swarms:
            peers = f"{len(e.bootstrap)} bootstrap peer(s)" if e.bootstrap else "no bootstrap peers"
            self.listed_combo.addItem(f"{e.name} — {peers}", e.name)
            self.listed_combo.setItemData(self.listed_combo.count() - 1, e.description, Qt.ItemDataRole.ToolTipRole)
        if self.choices.listed:
            self.listed_combo.setCurrentIndex(max(0, self.listed_combo.findData(self.choices.listed)))
        self.listed_note = QLabel(wordWrap=True)
        self.address_edit = QLineEdit(
            self.choices.address, placeholderText="sapo://join/<swarm>?peer=…  or  /ip4/203.0.113.5/tcp/31337/p2p/Qm…"
        )
        self.address_problem = QLabel(wordWrap=True)
        self.address_problem.setObjectName("errorText")
        self.address_warning = QLabel(wordWrap=True)
        self.address_warning.setObjectName("warningText")
        self.lan_check = QCheckBox(
            "Find computers of the same swarm on this network (LAN discovery, mDNS)", checked=self.choices.lan_discovery
        )
        self.lan_check.setToolTip(
            "Announces this node on the local network and looks for others; off sends nothing but to the swarm's peers"
        )
        self.choice_label = QLabel(wordWrap=True)
        self.choice_label.setObjectName("swarmChoiceReason")
        self.shared_label = QLabel(SHARED_WORDS, wordWrap=True)
        self.shared_label.setObjectName("sharedText")
        self.measured_label = QLabel(SHARING_MEASURED, wordWrap=True)
        self.measured_label.setObjectName("sharingMeasured")
        radios = (self.listed_radio, self.join_radio, self.host_radio, self.alone_radio)
        for i, r in enumerate(radios):
            self.swarm_group.addButton(r, i)
        self.listed_radio.setEnabled(bool(self.swarms))
        {LISTED: self.listed_radio, JOIN: self.join_radio, HOST: self.host_radio, ALONE: self.alone_radio}[
            self.choices.swarm
        ].setChecked(True)
        self.swarm_group.idToggled.connect(self._on_swarm_group_id_toggled)
        self.address_edit.textChanged.connect(self._on_address_edit_text_changed)
        self.listed_combo.currentIndexChanged.connect(self._on_listed_combo_current_index_changed)

        def indented(*widgets: QWidget) -> QHBoxLayout:
            row = QHBoxLayout()
            row.addSpacing(24)
            inner = QVBoxLayout()
            for w in widgets:
                inner.addWidget(w)
            row.addLayout(inner)
            return row

        col.addWidget(self.choice_label)
        col.addWidget(self.listed_radio)
        col.addLayout(indented(self.listed_combo, self.listed_note))
        col.addWidget(self.join_radio)
        col.addLayout(indented(self.address_edit, self.address_problem, self.address_warning))
        col.addWidget(self.host_radio)
        col.addWidget(self.alone_radio)
        col.addWidget(self.lan_check)
        col.addStretch(1)
        col.addWidget(self.measured_label)
        col.addWidget(self.shared_label)
        return page

    def _swarm_choice(self) -> str:
        return {0: LISTED, 1: JOIN, 2: HOST, 3: ALONE}[self.swarm_group.checkedId()]

    def _listed_entry(self) -> SwarmEntry | None:
        name = self.listed_combo.currentData()
        return next((e for e in self.swarms if e.name == name), None)

    def _update_swarm_step(self) -> None:
        """The step says what it picked and why, and what the choice means here."""
        choice = self._swarm_choice()
        entry = self._listed_entry()
        if entry is None:
            self.listed_note.setText(self.swarms_problem or "No swarm is listed.")
        else:
            note = entry.description
            if not entry.bootstrap:
                note += " Until another computer of it turns up, this one trains alone."
            self.listed_note.setText(note)
        meaning = {
            LISTED: f"Joins the listed swarm '{entry.name if entry else ''}' with its settings.",
            JOIN: "Joins through the invitation or address below.",
            HOST: "Starts a swarm here: it has no peers until another computer joins (on this network by itself, "
            "from elsewhere with the invitation on the Swarm tab); meanwhile it trains alone.",
            ALONE: "Trains alone: nothing is shared, nothing is received.",
        }[choice]
        self.choice_label.setText(f"<b>Picked first:</b> {self.choice_reason}<br><b>Now:</b> {meaning}")
        self.lan_check.setEnabled(choice != ALONE)
        self.shared_label.setVisible(choice != ALONE)

    def _on_swarm_group_id_toggled(self, _id: int, _checked: bool) -> None:
        self._update_buttons()

    def _on_address_edit_text_changed(self, _text: str) -> None:
        self._update_buttons()

    def _on_listed_combo_current_index_changed(self, _index: int) -> None:
        self._update_buttons()

    # --- page 3: the share -------------------------------------------------------------------------
    def _share_page(self) -> QWidget:
        page = QWidget()
        col = QVBoxLayout(page)
        col.addWidget(
            _heading(
                "Your share",
                "How much of this computer the node may use. You can pause, snooze "
                "or change this at any time from the window or the tray icon.",
            )
        )
        form = QFormLayout()
        self.throttle_slider = QSlider(Qt.Orientation.Horizontal, minimum=5, maximum=100, singleStep=5, pageStep=10)
        self.throttle_slider.setValue(round(self.choices.throttle * 100))
        self.throttle_label = QLabel()
        self.throttle_slider.valueChanged.connect(self._on_throttle_slider_value_changed)
        row = QHBoxLayout()
        row.addWidget(self.throttle_slider, 1)
        row.addWidget(self.throttle_label)
        form.addRow("CPU time:", row)
        self.threads_spin = QSpinBox(
            minimum=0,
            maximum=max(1, os.cpu_count() or 1),
            specialValueText="all cores",
            value=self.choices.threads,
            maximumWidth=160,
        )
        form.addRow("Threads:", self.threads_spin)
        self.battery_check = QCheckBox("Pause while on battery", checked=self.choices.pause_on_battery)
        self.idle_check = QCheckBox("Run only while I am away from the computer", checked=self.choices.only_when_idle)
        form.addRow(self.battery_check)
        form.addRow(self.idle_check)
        col.addLayout(form)
        self.summary_label = QLabel(wordWrap=True)
        col.addWidget(self.summary_label)
        col.addStretch(1)
        self._on_throttle_slider_value_changed(self.throttle_slider.value())
        return page

    def _on_throttle_slider_value_changed(self, value: int) -> None:
        self.throttle_label.setText(f"{value} %")
        self._update_summary()

    def _update_summary(self) -> None:
        if not hasattr(self, "summary_label"):
            return
        c = self.current_choices()
        where = {
            JOIN: "join the swarm of the invitation or address you gave",
            LISTED: f"join the listed swarm '{c.listed}'",
            HOST: "start a swarm on this network that others can join",
            ALONE: "train alone",
        }[c.swarm]
        model = "the model that fits" if c.model == "auto" else c.model
        self.summary_label.setText(
            f"The node will train <b>{model}</b>, {where}, and use at most <b>{c.throttle:.0%}</b> of the CPU time."
        )

    # --- navigation --------------------------------------------------------------------------------
    def current_choices(self) -> SetupChoices:
        return dataclasses.replace(
            self.choices,
            swarm=self._swarm_choice(),
            address=self.address_edit.text().strip(),
            listed=self.listed_combo.currentData() or "",
            lan_discovery=self.lan_check.isChecked(),
            throttle=self.throttle_slider.value() / 100,
            threads=self.threads_spin.value(),
            pause_on_battery=self.battery_check.isChecked(),
            only_when_idle=self.idle_check.isChecked(),
        )

    def _show_page(self, index: int) -> None:
        self.pages.setCurrentIndex(index)
        self.step_label.setText(f"Step {index + 1} of {self.pages.count()}")
        self._update_summary()
        self._update_buttons()

    def _update_buttons(self) -> None:
        index = self.pages.currentIndex()
        last = index == self.pages.count() - 1
        self.back_button.setEnabled(index > 0)
        self.next_button.setVisible(not last)
        self.join_button.setVisible(last)
        joining = self._swarm_choice() == JOIN
        problem = address_problem(self.address_edit.text()) if joining else ""
        if self._swarm_choice() == LISTED and self._listed_entry() is None:
            problem = "Choose a listed swarm."
        self.address_problem.setText(problem)
        self.address_problem.setVisible(bool(problem))
        warning = address_warning(self.address_edit.text()) if joining else ""
        self.address_warning.setText(f"⚠ {warning[:1].upper()}{warning[1:]}" if warning else "")
        self.address_warning.setVisible(bool(warning))
        self.next_button.setEnabled(not (index == 1 and problem))
        self._update_swarm_step()
        self.join_button.setText("Start training" if self._swarm_choice() == ALONE else "Join")
        self._update_summary()

    def _on_back_button_clicked(self) -> None:
        self._show_page(max(0, self.pages.currentIndex() - 1))

    def _on_next_button_clicked(self) -> None:
        self._show_page(min(self.pages.count() - 1, self.pages.currentIndex() + 1))

    def _on_join_button_clicked(self) -> None:
        c = self.current_choices()
        if (c.swarm == JOIN and address_problem(c.address)) or (c.swarm == LISTED and self._listed_entry() is None):
            self._show_page(1)
            return
        self.scanner.cancel()
        self.measurer.cancel()
        self.joined.emit(apply_choices(self.base, c, self.swarms))
        self.accept()

    def done(self, result: int) -> None:  # closing the dialog in any way ends the scan
        self.scanner.cancel()
        self.measurer.cancel()
        super().done(result)


__all__ = ["SetupWizard", "verdict_colours"]
