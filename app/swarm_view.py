"""The swarm view: who this node is, who it met, what it exchanged, how others join it.

The joining area (reachability, invitation with QR code, network check) is app/joining.py.

Drawn from a `SwarmModel`: identity from the node's NodeInfo, exchanges summed from every
round's `swarm/...` figures (history included), peer names from the gather phase's progress.
"""

from __future__ import annotations

import html
from collections.abc import Callable

from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import (
    QFormLayout,
    QFrame,
    QGridLayout,
    QGroupBox,
    QHBoxLayout,
    QHeaderView,
    QLabel,
    QScrollArea,
    QTableWidget,
    QTableWidgetItem,
    QVBoxLayout,
    QWidget,
)

from app.joining import JoiningBox
from app.models import SwarmModel
from sapo_core import __version__
from sapo_core.config import NodeConfig
from sapo_core.control.vocabulary import SWARM_PEERS_NEWER


def _saved_config() -> NodeConfig | None:
    """The config the node runs with (node.toml), for the invitation's swarm settings."""
    from app.settings import has_node_config, load_node_config

    return load_node_config() if has_node_config() else None


def _page_url(loader: Callable[[], NodeConfig | None]) -> str:
    """The page of the swarm the node is in ("" for none, or a config that cannot be read)."""
    from sapo_core.swarm.swarmlist import page_url

    try:
        cfg = loader()
        return page_url(cfg) if cfg is not None else ""
    except Exception:  # a broken config is the settings page's to report, not the swarm tab's
        return ""


TOTAL_WORDS = {
    "published": ("Published", "groups of ours put on the swarm for others"),
    "received": ("Received", "groups in peers' records we fetched"),
    "accepted": ("Accepted", "received groups that passed verification (questions regenerated, answers re-scored)"),
    "used": ("Trained on", "accepted groups picked for our own update"),
    "rejected": ("Rejected", "records or groups refused; the reasons are below"),
}


def _table(headers: list[str]) -> QTableWidget:
    t = QTableWidget(0, len(headers))
    t.setHorizontalHeaderLabels(headers)
    t.verticalHeader().setVisible(False)
    t.horizontalHeader().setSectionResizeMode(QHeaderView.ResizeMode.ResizeToContents)
    t.horizontalHeader().setSectionResizeMode(0, QHeaderView.ResizeMode.Stretch)
    t.setEditTriggers(QTableWidget.EditTrigger.NoEditTriggers)
    t.setSelectionMode(QTableWidget.SelectionMode.NoSelection)
    return t


class SwarmView(QWidget):
    invite_copied = Signal(str)
    """The invitation went to the clipboard."""

    def __init__(
        self,
        model: SwarmModel,
        parent: QWidget | None = None,
        config_loader: Callable[[], NodeConfig | None] | None = None,
    ) -> None:
        super().__init__(parent)
        self.model = model
        self.notice = QLabel(wordWrap=True)
        self.notice.setObjectName("swarmNotice")

        who = QGroupBox("This node")
        form = QFormLayout(who)
        self.name_label = QLabel("—")
        self.peer_label = QLabel("—")
        for label in (self.name_label, self.peer_label):
            label.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.peer_label.setWordWrap(True)
        form.addRow("Name:", self.name_label)
        form.addRow("Peer ID:", self.peer_label)
        # the swarm's own page (its seed's, from the swarm list; or this node's, swarm.page_port)
        self._config_loader = config_loader or _saved_config
        self.page_label = QLabel(openExternalLinks=True, wordWrap=True)
        self.page_label.setObjectName("swarmPage")
        form.addRow("Swarm page:", self.page_label)
        self.reload_page_link()
        # joining: reachability, the invitation (text and QR code), the network check (app/joining.py)
        self.joining = JoiningBox(config_loader or _saved_config)
        self.joining.invite_copied.connect(self.invite_copied)
        self.invite_edit, self.copy_button = self.joining.invite_edit, self.joining.copy_button

        counts = QGroupBox("Groups exchanged (since the run began)")
        grid = QGridLayout(counts)
        self.total_labels: dict[str, QLabel] = {}
        for col, (key, (word, tip)) in enumerate(TOTAL_WORDS.items()):
            value = QLabel("0")
            value.setObjectName("bigNumber")
            value.setToolTip(tip)
            caption = QLabel(word)
            caption.setToolTip(tip)
            grid.addWidget(value, 0, col)
            grid.addWidget(caption, 1, col)
            self.total_labels[key] = value
        self.peers_label = QLabel()
        grid.addWidget(self.peers_label, 2, 0, 1, len(TOTAL_WORDS))

        self.peers_table = _table(["Peer", "Last round"])
        self.peers_table.horizontalHeaderItem(1).setToolTip(
            "The last round whose gather verified a record of this peer"
        )
        self.rejections_table = _table(["Why rejected", "Count"])
        peers_box, rejections_box = QGroupBox("Peers seen"), QGroupBox("Rejections by reason")
        QVBoxLayout(peers_box).addWidget(self.peers_table)
        QVBoxLayout(rejections_box).addWidget(self.rejections_table)
        tables = QHBoxLayout()
        tables.addWidget(peers_box, 1)
        tables.addWidget(rejections_box, 1)

        # the page scrolls: on a 640 px screen (with an error banner above) it must not make the window taller
        page = QWidget()
        layout = QVBoxLayout(page)
        layout.setContentsMargins(8, 8, 8, 8)
        layout.addWidget(self.notice)
        layout.addWidget(who)
        layout.addWidget(self.joining)
        layout.addWidget(counts)
        layout.addLayout(tables, 1)
        scroll = QScrollArea(widgetResizable=True, frameShape=QFrame.Shape.NoFrame)
        scroll.setWidget(page)
        outer = QVBoxLayout(self)
        outer.setContentsMargins(0, 0, 0, 0)
        outer.addWidget(scroll)
        self.refresh()

    def reload_page_link(self) -> None:
        """The page of the swarm the node is in, from its config and the swarm list: read when the
        tab is made and when the node (re)starts (a new config), not on every round's refresh."""
        self.page_url = _page_url(self._config_loader)
        self.page_label.setText(
            f'<a href="{html.escape(self.page_url)}">{html.escape(self.page_url)}</a>'
            if self.page_url
            else "none (this swarm has no seed with a page; any node can serve one: swarm.page_port)"
        )

    def refresh(self) -> None:
        m = self.model
        if m.alone is None:
            self.notice.setText("The swarm identity appears once the node has loaded its model.")
        elif m.alone:
            self.notice.setText(
                "<b>Training alone.</b> Nothing is shared. To learn with others, choose "
                "<i>Setup again…</i> in the menu and join or host a swarm."
            )
        else:
            newer = m.last_figures.get(SWARM_PEERS_NEWER, 0.0)
            self.notice.setText(
                f"<b>In the swarm</b> as {m.node_name or 'this node'}: every round it publishes "
                "its groups and trains on verified groups from peers."
                + (
                    f"<br><b>Peers run a newer SAPO Swarm</b> than this one ({html.escape(__version__)}): update "
                    "when you can (the installer again, or your package manager); the Log tab names the "
                    "version. This one goes on sharing with them meanwhile."
                    if newer > 0
                    else ""
                )
            )
        self.name_label.setText(m.node_name or "—")
        self.peer_label.setText(m.peer_id or "—")
        self.joining.show_state(m.invite, m.last_figures, m.alone)
        for key, label in self.total_labels.items():
            label.setText(f"{m.totals.get(key, 0):,}")
        self.peers_label.setText(
            f"Peers found in the last round: {m.peers_now} · known to the DHT: {m.dht_peers}"
            + (f" · ignored for sending junk: {m.ignored_peers}" if m.ignored_peers else "")
        )
        peers = sorted(m.peers_seen.items(), key=lambda kv: -kv[1])
        self.peers_table.setRowCount(len(peers))
        for row, (name, last) in enumerate(peers):
            self.peers_table.setItem(row, 0, QTableWidgetItem(name))
            self.peers_table.setItem(row, 1, QTableWidgetItem(str(last)))
        reasons = m.rejections.most_common()
        self.rejections_table.setRowCount(len(reasons))
        for row, (reason, n) in enumerate(reasons):
            self.rejections_table.setItem(row, 0, QTableWidgetItem(reason))
            self.rejections_table.setItem(row, 1, QTableWidgetItem(f"{n:,}"))


__all__ = ["SwarmView"]
