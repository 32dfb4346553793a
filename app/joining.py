"""The Swarm tab's joining area: how reachable this node is, the invitation to hand out (text and
QR code), and a network check (`sapo-node doctor --network`, run as a child process).

Plain data in, widgets out: `reachability_words(figures)` and `invitation_text(cfg, address)` are
pure functions (tested without a display); the QR code is drawn by segno (pure Python).
"""

from __future__ import annotations

import io
import json
import sys
from collections.abc import Callable, Mapping

from PySide6.QtCore import QProcess, Qt, Signal
from PySide6.QtGui import QGuiApplication, QPixmap
from PySide6.QtWidgets import QFormLayout, QGroupBox, QHBoxLayout, QLabel, QLineEdit, QPushButton, QVBoxLayout, QWidget

from sapo_core.config import NodeConfig
from sapo_core.control.vocabulary import SWARM_LAN_PEERS, SWARM_REACHABLE, SWARM_RELAYED
from sapo_core.swarm.invitations import InvitationError, invitation_for, parse_invitation

CHECK_TIMEOUT_MS = 120_000


def reachability_words(figures: Mapping[str, float], alone: bool | None) -> str:
    """What the last round's swarm/... figures say about joining, in the user's words."""
    if alone:
        return "Training alone: not in a swarm."
    if SWARM_REACHABLE not in figures:
        return "Not known yet: the node says after its first round in the swarm."
    reachable = figures[SWARM_REACHABLE]
    lan = int(figures.get(SWARM_LAN_PEERS, 0))
    lan_words = f" · {lan} peer(s) found on this network" if lan else ""
    if reachable > 0:
        return "Reachable: peers can connect to this computer; it serves the swarm and relays for others." + lan_words
    if reachable == 0:
        how = "through a relay" if figures.get(SWARM_RELAYED) else "as a DHT client (peers store its answers)"
        return f"Behind NAT: peers cannot connect to this computer; it takes part {how}." + lan_words
    return "Not checked yet: no peer has answered to dial back (checked again as peers join)." + lan_words


def invitation_text(cfg: NodeConfig | None, address: str) -> tuple[str, str]:
    """(invitation, warning) for this node's swarm through `address`; ('', why) if there is none."""
    if not address:
        return "", ""
    if cfg is None or not cfg.swarm.enabled:
        return address, ""
    try:
        invitation = parse_invitation(invitation_for(cfg, [address]))
    except InvitationError as e:
        return address, f"no invitation: {e}"
    return invitation.to_url(), " ".join(invitation.warnings())


def qr_pixmap(text: str, scale: int = 4) -> QPixmap:
    import segno

    buf = io.BytesIO()
    segno.make(text, error="m").save(buf, kind="png", scale=scale, border=2)
    pixmap = QPixmap()
    pixmap.loadFromData(buf.getvalue(), "PNG")
    return pixmap


def doctor_lines(output: str) -> str:
    """The network doctor's JSON as short lines, or what went wrong."""
    try:
        report = json.loads(output)
        checks = report["checks"]
    except (ValueError, KeyError, TypeError):
        return "The network check did not finish: " + (output.strip().splitlines() or ["no output"])[-1][:200]
    marks = {"ok": "✓", "warn": "⚠", "fail": "✗"}
    lines = []
    for c in checks:
        line = f"{marks.get(c.get('status'), '?')} <b>{c.get('name')}</b>: {c.get('detail')}"
        if c.get("status") != "ok" and c.get("fix"):
            line += f"<br>&nbsp;&nbsp;&nbsp;fix: {c['fix']}"
        lines.append(line)
    return "<br>".join(lines)


class JoiningBox(QGroupBox):
    invite_copied = Signal(str)
    """The invitation went to the clipboard."""
    check_done = Signal(str)
    """The network check finished; its report as shown."""

    def __init__(self, config_loader: Callable[[], NodeConfig | None], parent: QWidget | None = None) -> None:
        super().__init__("Joining", parent)
        self.config_loader = config_loader
        self.reach_label = QLabel("—", wordWrap=True)
        self.reach_label.setObjectName("reachability")
        self.invite_edit = QLineEdit(readOnly=True, placeholderText="known once the node has joined its swarm")
        self.copy_button = QPushButton("Copy")
        self.copy_button.setToolTip("Copy the invitation others paste into their setup (or open) to join this swarm")
        self.qr_button = QPushButton("QR code", checkable=True)
        self.qr_label = QLabel()
        self.qr_label.setAlignment(Qt.AlignmentFlag.AlignLeft)
        self.qr_label.hide()
        self.invite_warning = QLabel(wordWrap=True)
        self.invite_warning.setObjectName("warningText")
        self.check_button = QPushButton("Check network")
        self.check_button.setToolTip(
            "sapo-node doctor --network: the p2p daemon, addresses, peers, reachability, clock offset, LAN discovery"
        )
        self.check_label = QLabel(wordWrap=True)
        self.check_label.setTextFormat(Qt.TextFormat.RichText)
        self.copy_button.clicked.connect(self._on_copy_button_clicked)
        self.qr_button.toggled.connect(self._on_qr_button_toggled)
        self.check_button.clicked.connect(self._on_check_button_clicked)
        self.process: QProcess | None = None
        invite = QHBoxLayout()
        invite.addWidget(self.invite_edit, 1)
        invite.addWidget(self.copy_button)
        invite.addWidget(self.qr_button)
        check = QVBoxLayout()
        check.addWidget(self.check_button, 0, Qt.AlignmentFlag.AlignLeft)
        check.addWidget(self.check_label)
        form = QFormLayout(self)
        form.addRow("This computer:", self.reach_label)
        form.addRow("Invite others with:", invite)
        form.addRow("", self.invite_warning)
        form.addRow("", self.qr_label)
        form.addRow("Network:", check)
        self.address = ""

    def show_state(self, address: str, figures: Mapping[str, float], alone: bool | None) -> None:
        self.reach_label.setText(reachability_words(figures, alone))
        if address != self.address or not self.invite_edit.text():
            self.address = address
            try:
                cfg = self.config_loader()
            except Exception:  # noqa: BLE001 - a broken node.toml: the bare address still helps
                cfg = None
            text, warning = invitation_text(cfg, address)
            self.invite_edit.setText(text)
            self.invite_edit.setCursorPosition(0)
            self.invite_warning.setText(f"⚠ {warning[:1].upper()}{warning[1:]}" if warning else "")
            self.invite_warning.setVisible(bool(warning))
            self._draw_qr()
        self.copy_button.setEnabled(bool(self.invite_edit.text()))
        self.qr_button.setEnabled(bool(self.invite_edit.text()))

    def _draw_qr(self) -> None:
        text = self.invite_edit.text()
        if self.qr_button.isChecked() and text:
            self.qr_label.setPixmap(qr_pixmap(text))
            self.qr_label.show()
        else:
            self.qr_label.hide()

    def _on_copy_button_clicked(self) -> None:
        text = self.invite_edit.text()
        if text:
            QGuiApplication.clipboard().setText(text)
            self.invite_copied.emit(text)

    def _on_qr_button_toggled(self, _checked: bool) -> None:
        self._draw_qr()

    def _on_check_button_clicked(self) -> None:
        if self.process is not None:
            return
        self.check_button.setEnabled(False)
        self.check_label.setText("Checking (up to a minute)…")
        self.process = QProcess(self)
        self.process.finished.connect(self._on_process_finished)
        self.process.start(sys.executable, ["-m", "sapo_core.cli", "doctor", "--network", "--json"])

    def _on_process_finished(self, _code: int, _status: QProcess.ExitStatus) -> None:
        process, self.process = self.process, None
        if process is None:
            return
        out = bytes(process.readAllStandardOutput()).decode(errors="replace")
        err = bytes(process.readAllStandardError()).decode(errors="replace")
        text = doctor_lines(out or err)
        self.check_label.setText(text)
        self.check_button.setEnabled(True)
        self.check_done.emit(text)


__all__ = ["JoiningBox", "reachability_words", "invitation_text", "qr_pixmap", "doctor_lines"]
