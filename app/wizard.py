"""The first-run setup: this computer and the model that fits, the swarm, the share; then Join.

Three short pages. The hardware scan runs in a child process (hardware_scan.py) while the
user reads; the recommended model is preselected with the reason, the others are marked
fits / slow / doesn't fit. `apply_choices` turns the answers into a NodeConfig (a pure
function, tested without a display); the window saves it as node.toml and starts the node.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass

from PySide6.QtCore import Qt, Signal
from PySide6.QtGui import QBrush, QColor, QFont
from PySide6.QtWidgets import (QButtonGroup, QCheckBox, QDialog, QFormLayout, QHBoxLayout, QLabel, QLineEdit,
                               QProgressBar, QPushButton, QRadioButton, QSlider, QSpinBox, QStackedWidget,
                               QTreeWidget, QTreeWidgetItem, QVBoxLayout, QWidget)

from sapo_core.catalog import FITS, NO_FIT, SLOW
from sapo_core.config import NodeConfig, RoundConfig

from app.hardware_scan import HardwareReport, HardwareScan
from app.theme import status_colours, style_sheet

JOIN, HOST, ALONE = "join", "host", "alone"
def verdict_colours() -> dict[str, str]:
    c = status_colours()
    return {FITS: c["ok"], SLOW: c["warning"], NO_FIT: c["error"]}


@dataclass(frozen=True)
class SetupChoices:
    model: str = "auto"
    swarm: str = HOST  # join, host, alone
    address: str = ""  # the multiaddr to join through
    throttle: float = 0.5
    threads: int = 0
    pause_on_battery: bool = True
    only_when_idle: bool = False


def address_problem(text: str) -> str:
    """'' if `text` is a multiaddr a node can join through, else what is wrong with it."""
    text = text.strip()
    if not text:
        return "Paste the invite address another volunteer's Swarm tab shows."
    if not text.startswith("/") or "/p2p/" not in text:
        return "An invite address looks like /ip4/203.0.113.5/tcp/31337/p2p/Qm… (it ends in /p2p/ and a peer id)."
    return ""


def apply_choices(base: NodeConfig, c: SetupChoices) -> NodeConfig:
    """The config the node runs with after the setup (other settings of `base` are kept)."""
    external = base.round.external_groups or RoundConfig().external_groups
    changes = {"model.name": c.model, "control.throttle": c.throttle, "sampler.threads": c.threads,
               "control.pause_on_battery": c.pause_on_battery, "control.only_when_idle": c.only_when_idle}
    if c.swarm == ALONE:
        changes.update({"swarm.enabled": False, "round.external_groups": 0})
    else:
        peers = [c.address.strip()] if c.swarm == JOIN else []
        changes.update({"swarm.enabled": True, "swarm.initial_peers": peers, "round.external_groups": external})
    return base.replace(**changes)


def choices_from_config(cfg: NodeConfig) -> SetupChoices:
    """Start a repeated setup from what the node runs with now."""
    swarm = ALONE if not cfg.swarm.enabled or cfg.round.external_groups == 0 else JOIN if cfg.swarm.initial_peers \
        else HOST
    return SetupChoices(model=cfg.model.name, swarm=swarm, address=(cfg.swarm.initial_peers or [""])[0],
                        throttle=cfg.control.throttle, threads=cfg.sampler.threads,
                        pause_on_battery=cfg.control.pause_on_battery, only_when_idle=cfg.control.only_when_idle)


def _heading(text: str, sub: str) -> QLabel:
    muted = status_colours()["muted"]  # from the palette: a fixed grey vanished on a dark desktop
    label = QLabel(f"<h2 style='margin-bottom:2px'>{text}</h2><div style='color:{muted}'>{sub}</div>", wordWrap=True)
    return label


class SetupWizard(QDialog):
    joined = Signal(object)
    """The user pressed Join: the NodeConfig to save and run."""

    def __init__(self, base: NodeConfig | None = None, parent: QWidget | None = None, scan: bool = True) -> None:
        super().__init__(parent)
        self.setStyleSheet(style_sheet())  # inline errors (#errorText) in red, colours from the palette
        self.setWindowTitle("Set up SAPO Swarm")
        self.base = base or NodeConfig()
        self.choices = choices_from_config(self.base) if base is not None else SetupChoices()
        self.report: HardwareReport | None = None
        self.scanner = HardwareScan(self)
        self.scanner.finished.connect(self._on_scanner_finished)
        self.scanner.failed.connect(self._on_scanner_failed)

        self.pages = QStackedWidget()
        self.pages.addWidget(self._machine_page())
        self.pages.addWidget(self._swarm_page())
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
        col.addWidget(_heading("This computer", "What it has, and the model it can train. The node trains in "
                                                "the background; you stay in control of how much it takes."))
        self.scan_busy = QProgressBar(textVisible=False, maximumHeight=6)
        self.scan_busy.setRange(0, 0)
        self.scan_label = QLabel("Scanning this computer…", wordWrap=True)
        self.machine_form = QFormLayout()
        self.models = QTreeWidget()
        self.models.setHeaderLabels(["Model", "Verdict", "Parameters", "Download", "Rounds / h", "Memory",
                                     "Licence"])
        self.models.setAccessibleName("Models this computer can train")
        self.models.setRootIsDecorated(False)
        self.models.currentItemChanged.connect(self._on_models_current_item_changed)
        self.model_note = QLabel(wordWrap=True)  # the whole "why" of the chosen model, never cut
        self.model_note.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        col.addWidget(self.scan_busy)
        col.addWidget(self.scan_label)
        col.addLayout(self.machine_form)
        col.addWidget(self.models, 1)
        col.addWidget(self.model_note)
        return page

    def _on_scanner_finished(self, report: HardwareReport) -> None:
        self.report = report
        self.scan_busy.hide()
        self.scan_label.setText(f"<b>Recommended:</b> {report.recommended_reason}")
        for what, value, how in report.machine:
            label = QLabel(value)
            label.setToolTip(f"found by: {how}")
            self.machine_form.addRow(f"{what}:", label)
        preferred = self.choices.model if report.option(self.choices.model) else report.recommended
        bold = QFont()
        bold.setBold(True)
        for m in sorted(report.models, key=lambda m: m.usefulness()):
            star = "  ★" if m.id == report.recommended else ""
            size = (f"{m.download_gb * 1000:,.0f} MB" if m.download_gb < 1 else f"{m.download_gb:.1f} GB") \
                if m.download_gb else ""
            here = ("✓ here" if size else "included") if m.downloaded else size or "?"
            item = QTreeWidgetItem([m.id + star, m.status, f"{m.params / 1e6:,.0f} M" if m.params else "?",
                                    f"{size} {here}".strip() if m.downloaded and size else here,
                                    f"{m.rounds_per_hour:.0f}", f"{m.memory_gb:.1f} GB", m.license or "?"])
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
        self.scan_label.setText(f"Could not scan this computer ({why}). The node picks the largest model that "
                                "fits when it starts.")
        self.choices = dataclasses.replace(self.choices, model="auto")

    def _on_models_current_item_changed(self, item: QTreeWidgetItem | None, _old: QTreeWidgetItem | None) -> None:
        if item is None or self.report is None:
            return
        model_id = item.data(0, Qt.ItemDataRole.UserRole)
        self.choices = dataclasses.replace(self.choices, model=model_id)
        m = self.report.option(model_id)
        note = f"<b>{model_id}</b> — {m.reason}<br>{m.details()}" if m else model_id
        if m is not None and m.status == NO_FIT:
            note += (f". <span style='color:{status_colours()['error']}'>It will not fit: the node will refuse to "
                     "start.</span>")
        elif m is not None and m.status == SLOW:
            note += ". It fits, but rounds will be long on this computer."
        self.model_note.setText(note)

    # --- page 2: the swarm -------------------------------------------------------------------------
    def _swarm_page(self) -> QWidget:
        page = QWidget()
        col = QVBoxLayout(page)
        col.addWidget(_heading("The swarm", "In a swarm, every computer shares the answers it generates and "
                                            "learns from the others' (SAPO). Alone, it learns only from its own."))
        self.swarm_group = QButtonGroup(self)
        self.join_radio = QRadioButton("Join a swarm through a volunteer's invite address")
        self.host_radio = QRadioButton("Host a new swarm (others join through this computer)")
        self.alone_radio = QRadioButton("Train alone (nothing is shared)")
        self.address_edit = QLineEdit(self.choices.address, placeholderText="/ip4/203.0.113.5/tcp/31337/p2p/Qm…")
        self.address_problem = QLabel(wordWrap=True)
        self.address_problem.setObjectName("errorText")
        for i, r in enumerate((self.join_radio, self.host_radio, self.alone_radio)):
            self.swarm_group.addButton(r, i)
        {JOIN: self.join_radio, HOST: self.host_radio, ALONE: self.alone_radio}[self.choices.swarm].setChecked(True)
        self.swarm_group.idToggled.connect(self._on_swarm_group_id_toggled)
        self.address_edit.textChanged.connect(self._on_address_edit_text_changed)
        col.addWidget(self.join_radio)
        indent = QHBoxLayout()
        indent.addSpacing(24)
        address = QVBoxLayout()
        address.addWidget(self.address_edit)
        address.addWidget(self.address_problem)
        indent.addLayout(address)
        col.addLayout(indent)
        col.addWidget(self.host_radio)
        col.addWidget(self.alone_radio)
        col.addStretch(1)
        return page

    def _swarm_choice(self) -> str:
        return {0: JOIN, 1: HOST, 2: ALONE}[self.swarm_group.checkedId()]

    def _on_swarm_group_id_toggled(self, _id: int, _checked: bool) -> None:
        self._update_buttons()

    def _on_address_edit_text_changed(self, _text: str) -> None:
        self._update_buttons()

    # --- page 3: the share -------------------------------------------------------------------------
    def _share_page(self) -> QWidget:
        page = QWidget()
        col = QVBoxLayout(page)
        col.addWidget(_heading("Your share", "How much of this computer the node may use. You can pause, snooze "
                                             "or change this at any time from the window or the tray icon."))
        form = QFormLayout()
        self.throttle_slider = QSlider(Qt.Orientation.Horizontal, minimum=5, maximum=100, singleStep=5, pageStep=10)
        self.throttle_slider.setValue(round(self.choices.throttle * 100))
        self.throttle_label = QLabel()
        self.throttle_slider.valueChanged.connect(self._on_throttle_slider_value_changed)
        row = QHBoxLayout()
        row.addWidget(self.throttle_slider, 1)
        row.addWidget(self.throttle_label)
        form.addRow("CPU time:", row)
        self.threads_spin = QSpinBox(minimum=0, maximum=max(1, os.cpu_count() or 1), specialValueText="all cores",
                                     value=self.choices.threads, maximumWidth=160)
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
        where = {JOIN: "join the swarm at the address you gave", HOST: "host a new swarm others can join",
                 ALONE: "train alone"}[c.swarm]
        model = "the model that fits" if c.model == "auto" else c.model
        self.summary_label.setText(f"The node will train <b>{model}</b>, {where}, and use at most "
                                   f"<b>{c.throttle:.0%}</b> of the CPU time.")

    # --- navigation --------------------------------------------------------------------------------
    def current_choices(self) -> SetupChoices:
        return dataclasses.replace(
            self.choices, swarm=self._swarm_choice(), address=self.address_edit.text().strip(),
            throttle=self.throttle_slider.value() / 100, threads=self.threads_spin.value(),
            pause_on_battery=self.battery_check.isChecked(), only_when_idle=self.idle_check.isChecked())

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
        problem = address_problem(self.address_edit.text()) if self._swarm_choice() == JOIN else ""
        self.address_problem.setText(problem)
        self.next_button.setEnabled(not (index == 1 and problem))
        self.join_button.setText("Start training" if self._swarm_choice() == ALONE else "Join")
        self._update_summary()

    def _on_back_button_clicked(self) -> None:
        self._show_page(max(0, self.pages.currentIndex() - 1))

    def _on_next_button_clicked(self) -> None:
        self._show_page(min(self.pages.count() - 1, self.pages.currentIndex() + 1))

    def _on_join_button_clicked(self) -> None:
        c = self.current_choices()
        if c.swarm == JOIN and address_problem(c.address):
            self._show_page(1)
            return
        self.scanner.cancel()
        self.joined.emit(apply_choices(self.base, c))
        self.accept()

    def done(self, result: int) -> None:  # closing the dialog in any way ends the scan
        self.scanner.cancel()
        super().done(result)


__all__ = ["SetupWizard", "SetupChoices", "apply_choices", "choices_from_config", "address_problem",
           "JOIN", "HOST", "ALONE"]
