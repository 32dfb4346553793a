"""The Swarm tab's joining area: reachability in words, the invitation built from the node's
config (with the private-address warning), its QR code, and the network check run as a real
child process (`sapo-node doctor --network`, on loopback only)."""

from __future__ import annotations

import pytest

from app.joining import JoiningBox, doctor_lines, invitation_text, qr_pixmap, reachability_words
from sapo_core.config import NodeConfig, save_config
from sapo_core.swarm.invitations import parse_invitation

PEER_ID = "QmWNtPYCUJ4LV4MDEU5FAnrJAPSZ1M6uGfCiDHasECE6ha"
PRIVATE = f"/ip4/192.168.1.20/tcp/31337/p2p/{PEER_ID}"
PUBLIC = f"/ip4/203.0.113.5/tcp/31337/p2p/{PEER_ID}"


def test_reachability_in_words():
    assert "alone" in reachability_words({}, True)
    assert "Not known yet" in reachability_words({}, False)
    assert reachability_words({"swarm/reachable": 1.0}, False).startswith("Reachable")
    assert "DHT client" in reachability_words({"swarm/reachable": 0.0}, False)
    assert "through a relay" in reachability_words({"swarm/reachable": 0.0, "swarm/relayed": 1.0}, False)
    assert "3 peer(s) found on this network" in reachability_words(
        {"swarm/reachable": -1.0, "swarm/lan_peers": 3}, False
    )


def test_the_invitation_carries_the_swarm_and_warns_when_private():
    cfg = NodeConfig().replace(**{"swarm.swarm_name": "class-7b", "swarm.shards": 4})
    text, warning = invitation_text(cfg, PRIVATE)
    inv = parse_invitation(text)
    assert inv.swarm.name == "class-7b" and inv.swarm.shards == 4 and inv.peers == [PRIVATE] and "private" in warning
    assert invitation_text(cfg, PUBLIC)[1] == ""
    assert invitation_text(None, PUBLIC) == (PUBLIC, "") and invitation_text(cfg, "") == ("", "")


def test_doctor_lines():
    text = doctor_lines(
        '{"ok": false, "checks": [{"name": "clock", "status": "fail", "detail": "+42 s", "fix": "NTP"}]}'
    )
    assert "✗ <b>clock</b>: +42 s" in text and "fix: NTP" in text
    assert "did not finish" in doctor_lines("Traceback ...\nRuntimeError: boom") and "boom" in doctor_lines("x\nboom")


@pytest.mark.gui
def test_the_joining_box_shows_the_invitation_and_its_qr_code(qtbot):
    cfg = NodeConfig().replace(**{"swarm.swarm_name": "class-7b"})
    box = JoiningBox(lambda: cfg)
    qtbot.addWidget(box)
    box.show()
    box.show_state("", {}, None)
    assert not box.copy_button.isEnabled() and not box.qr_button.isEnabled()
    box.show_state(PRIVATE, {"swarm/reachable": 0.0}, False)
    assert box.invite_edit.text().startswith("sapo://join/class-7b?") and box.invite_warning.isVisible()
    assert "Behind NAT" in box.reach_label.text()
    box.qr_button.setChecked(True)
    assert box.qr_label.isVisible() and not box.qr_label.pixmap().isNull()
    assert qr_pixmap(box.invite_edit.text()).width() > 100
    with qtbot.waitSignal(box.invite_copied) as copied:
        box.copy_button.click()
    assert copied.args[0] == box.invite_edit.text()


@pytest.mark.gui
@pytest.mark.network
def test_the_network_check_runs_the_doctor_in_a_child(qtbot, tmp_path, monkeypatch):
    monkeypatch.setenv("SAPO_DATA_DIR", str(tmp_path))
    # loopback only, no LAN discovery: the check must never send on a real interface in a test
    save_config(
        NodeConfig().replace(**{"swarm.host_maddrs": ["/ip4/127.0.0.1/tcp/0"], "swarm.lan_discovery": False}),
        tmp_path / "node.toml",
    )
    box = JoiningBox(lambda: None)
    qtbot.addWidget(box)
    with qtbot.waitSignal(box.check_done, timeout=120_000) as done:
        box.check_button.click()
        assert not box.check_button.isEnabled()
    assert "✓ <b>daemon</b>" in done.args[0] and "listening on /ip4/127.0.0.1/tcp/" in done.args[0]
    assert "no bootstrap peers configured" in done.args[0] and box.check_button.isEnabled()


def test_the_swarm_tab_links_to_the_swarm_s_page(qtbot):
    from app.models import SwarmModel
    from app.swarm_view import SwarmView

    cfg = NodeConfig().replace(**{"swarm.page_port": 31399})
    view = SwarmView(SwarmModel(), config_loader=lambda: cfg)
    qtbot.addWidget(view)
    assert view.page_url == "http://127.0.0.1:31399/"
    assert 'href="http://127.0.0.1:31399/"' in view.page_label.text() and view.page_label.openExternalLinks()
    alone = SwarmView(SwarmModel(), config_loader=lambda: NodeConfig())
    qtbot.addWidget(alone)
    assert alone.page_url == "" and "none" in alone.page_label.text()


def test_the_swarm_tab_says_when_peers_run_a_newer_version(qtbot):
    from app.models import SwarmModel
    from app.swarm_view import SwarmView

    model = SwarmModel()
    model.alone = False
    view = SwarmView(model, config_loader=lambda: None)
    qtbot.addWidget(view)
    assert "newer" not in view.notice.text()
    model.add_round(3, {"swarm/peers_newer": 2.0, "swarm/published": 1.0})
    view.refresh()
    assert "Peers run a newer SAPO Swarm" in view.notice.text() and "update" in view.notice.text()
