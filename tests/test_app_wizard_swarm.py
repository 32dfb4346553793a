"""The setup's swarm step: what it picks first and why (never a silent swarm of one), the choices
turned into a config (pure functions), the private-address warning, and the step on screen with
an invitation opened from a link (pytest-qt, offscreen)."""

from __future__ import annotations

import pytest
from PySide6.QtCore import QPoint, Qt

from app.setup_choices import (
    ALONE,
    HOST,
    JOIN,
    LISTED,
    SetupChoices,
    address_problem,
    address_warning,
    apply_choices,
    choices_from_config,
    default_swarm_choice,
)
from app.wizard import SetupWizard
from sapo_core.config import NodeConfig
from sapo_core.swarm.invitations import make_invitation
from sapo_core.swarm.swarmlist import SwarmEntry

PEER_ID = "QmWNtPYCUJ4LV4MDEU5FAnrJAPSZ1M6uGfCiDHasECE6ha"
PUBLIC = f"/ip4/203.0.113.5/tcp/31337/p2p/{PEER_ID}"
PRIVATE = f"/ip4/192.168.1.20/tcp/31337/p2p/{PEER_ID}"
EMPTY = SwarmEntry(name="local-example", description="example", source="x")
LAB = SwarmEntry(name="lab", bootstrap=[PUBLIC], shards=4, tasks={"bf": 1.0}, source="x")


def test_the_first_choice_is_explained_and_never_silent():
    choice, listed, why = default_swarm_choice(None, [EMPTY])
    assert choice == HOST and "no public servers" in why and "trains alone" in why
    assert default_swarm_choice(None, [EMPTY, LAB])[:2] == (LISTED, "lab")
    assert default_swarm_choice(None, [LAB], invitation="sapo://join/x")[0] == JOIN
    alone = NodeConfig().replace(**{"swarm.enabled": False})
    assert default_swarm_choice(alone, [LAB]) == (ALONE, "", "Your current setting.")


def test_choices_become_the_config():
    base = NodeConfig()
    listed = apply_choices(base, SetupChoices(swarm=LISTED, listed="lab", lan_discovery=False), [EMPTY, LAB])
    s = listed.swarm
    assert (s.swarm_name, s.initial_peers, s.shards, s.listed_swarm, s.lan_discovery) == (
        "lab",
        [PUBLIC],
        4,
        "lab",
        False,
    )
    assert choices_from_config(listed).swarm == LISTED and choices_from_config(listed).listed == "lab"
    invited = apply_choices(base, SetupChoices(swarm=JOIN, address=make_invitation(LAB, [PRIVATE])))
    assert invited.swarm.swarm_name == "lab" and invited.swarm.initial_peers == [PRIVATE]
    assert apply_choices(base, SetupChoices(swarm=JOIN, address=PUBLIC)).swarm.initial_peers == [PUBLIC]
    host = apply_choices(base, SetupChoices(swarm=HOST))
    assert host.swarm.enabled and host.swarm.initial_peers == [] and host.swarm.lan_discovery
    assert not apply_choices(base, SetupChoices(swarm=ALONE)).swarm.enabled
    with pytest.raises(ValueError, match="no listed swarm"):
        apply_choices(base, SetupChoices(swarm=LISTED, listed="gone"), [EMPTY])


def test_addresses_and_invitations_are_checked_and_private_ones_warned():
    assert "invite address" in address_problem("")
    assert "starts with sapo://join/" in address_problem("203.0.113.5:31337")
    assert "cannot be used" in address_problem("sapo://join/x")
    assert address_problem(PUBLIC) == "" and address_problem(make_invitation(LAB, [PUBLIC])) == ""
    assert address_warning(PUBLIC) == "" and address_warning(make_invitation(LAB, [PUBLIC])) == ""
    assert "private" in address_warning(PRIVATE) and "same network" in address_warning(make_invitation(LAB, [PRIVATE]))


@pytest.mark.gui
def test_the_swarm_step_with_an_opened_invitation(qtbot):
    url = make_invitation(SwarmEntry(name="class-7b", shards=4), [PRIVATE])
    wizard = SetupWizard(scan=False, invitation=url)
    qtbot.addWidget(wizard)
    wizard.show()
    qtbot.mouseClick(wizard.next_button, Qt.MouseButton.LeftButton)
    assert wizard.join_radio.isChecked() and wizard.address_edit.text() == url
    assert "You opened an invitation" in wizard.choice_label.text()
    assert wizard.address_warning.isVisible() and "private" in wizard.address_warning.text()
    assert "IP address" in wizard.shared_label.text() and wizard.next_button.isEnabled()
    qtbot.mouseClick(wizard.alone_radio, Qt.MouseButton.LeftButton, pos=QPoint(8, wizard.alone_radio.height() // 2))
    assert "Trains alone" in wizard.choice_label.text() and not wizard.shared_label.isVisible()
    qtbot.mouseClick(wizard.join_radio, Qt.MouseButton.LeftButton, pos=QPoint(8, wizard.join_radio.height() // 2))
    qtbot.mouseClick(wizard.next_button, Qt.MouseButton.LeftButton)
    with qtbot.waitSignal(wizard.joined) as joined:
        qtbot.mouseClick(wizard.join_button, Qt.MouseButton.LeftButton)
    cfg = joined.args[0]
    assert cfg.swarm.swarm_name == "class-7b" and cfg.swarm.shards == 4 and cfg.swarm.initial_peers == [PRIVATE]
