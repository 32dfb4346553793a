"""Invitations and the swarm list: round trips, strict parsing of untrusted text (tables of bad
input -> the error that names the problem), the private-address warning, `sapo-node run --join`
and `--swarm` building the config, and a node joining a real swarm through an invitation."""

from __future__ import annotations

import argparse
import random

import pytest

from sapo_core.commands import run as run_cmd
from sapo_core.config import NodeConfig, TaskConfig
from sapo_core.swarm.invitations import (
    MAX_CHARS,
    InvitationError,
    apply_invitation,
    invitation_for,
    make_invitation,
    parse_invitation,
)
from sapo_core.swarm.source import open_swarm
from sapo_core.swarm.swarmlist import (
    SwarmEntry,
    SwarmListError,
    add_user_swarm,
    apply_swarm,
    find_swarm,
    load_swarms,
    page_url,
    parse_swarms,
)
from sapo_core.tasks import TaskSet

PEER_ID = "QmWNtPYCUJ4LV4MDEU5FAnrJAPSZ1M6uGfCiDHasECE6ha"
PUBLIC = f"/ip4/203.0.113.5/tcp/31337/p2p/{PEER_ID}"
PRIVATE = f"/ip4/192.168.1.20/tcp/31337/p2p/{PEER_ID}"


def test_an_invitation_round_trips():
    entry = SwarmEntry(
        name="class-7b", window_seconds=120.0, shards=4, tasks={"basic_arithmetic": 1.0, "calendar_arithmetic": 0.5}
    )
    url = make_invitation(entry, [PUBLIC, PRIVATE, PUBLIC])
    assert url.startswith(
        "sapo://join/class-7b?v=1&window=120&shards=4&tasks=basic_arithmetic:1,calendar_arithmetic:0.5"
    )
    assert f"peer={PUBLIC}" in url  # readable: slashes stay slashes
    inv = parse_invitation(f"  {url}\n")
    assert inv.peers == [PUBLIC, PRIVATE] and inv.swarm.name == "class-7b"
    assert (inv.swarm.window_seconds, inv.swarm.shards, inv.swarm.tasks) == (120.0, 4, entry.tasks)
    assert inv.to_url() == url and not inv.private_only and inv.warnings() == []


def test_only_private_addresses_are_warned_about():
    inv = parse_invitation(make_invitation(SwarmEntry(name="home"), [PRIVATE, f"/ip4/127.0.0.1/tcp/1/p2p/{PEER_ID}"]))
    assert inv.private_only and "private" in inv.warnings()[0] and "same network" in inv.warnings()[0]


@pytest.mark.parametrize(
    "text, error",
    [
        ("", "starts with sapo://join/"),
        (PUBLIC, "a bare address"),
        ("https://join/x?peer=" + PUBLIC, "starts with sapo://join/"),
        ("sapo://leave/x?peer=" + PUBLIC, "starts with sapo://join/"),
        ("sapo://join/?peer=" + PUBLIC, "name is missing"),
        ("sapo://join/a/b?peer=" + PUBLIC, "name is missing"),
        ("sapo://join/bad name?peer=" + PUBLIC, "no spaces"),
        ("sapo://join/bad*name?peer=" + PUBLIC, "must be 1..64 letters"),
        ("sapo://join/x", "names no peer"),
        ("sapo://join/x?peer=/ip4/1.2.3.4/tcp/1", "/p2p/<peer id>"),
        ("sapo://join/x?peer=" + PUBLIC + "&evil=1", "unknown part 'evil'"),
        ("sapo://join/x?peer=" + PUBLIC + "&shards=2&shards=3", "given twice"),
        ("sapo://join/x?peer=" + PUBLIC + "&shards=many", "whole number"),
        ("sapo://join/x?peer=" + PUBLIC + "&shards=0", "shards"),
        ("sapo://join/x?peer=" + PUBLIC + "&window=1", "window"),
        ("sapo://join/x?peer=" + PUBLIC + "&tasks=rm_rf:1", "unknown task"),
        ("sapo://join/x?peer=" + PUBLIC + "&tasks=bf:x", "name:number"),
        ("sapo://join/x?peer=" + PUBLIC + "&v=2", "version"),
        ("sapo://join/x?" + "&".join(["peer=" + PUBLIC] * 9), "at most 8"),
        ("sapo://join/x?peer=" + PUBLIC + "#frag", "no '#'"),
        ("sapo://join/x?peer=" + PUBLIC + "&" + "a" * MAX_CHARS, "too long"),
        ("sapo://join/x?peer=" + PUBLIC.replace("203", "２０３"), "no spaces or special characters"),
        ("sapo://join/x?peer=" + PUBLIC + "&&&", "malformed"),
    ],
)
def test_bad_invitations_say_what_is_wrong(text, error):
    with pytest.raises(InvitationError, match=None) as e:
        parse_invitation(text)
    assert error in str(e.value), str(e.value)


def test_swarm_list_ships_an_honest_example_and_takes_the_users(tmp_path):
    shipped = load_swarms(tmp_path / "none.toml")
    assert [e.name for e in shipped] == ["local-example"] and shipped[0].bootstrap == []
    user = tmp_path / "swarms.toml"
    add_user_swarm(SwarmEntry(name="lab", description="our lab", bootstrap=[PUBLIC], shards=4), user)
    add_user_swarm(SwarmEntry(name="local-example", window_seconds=60.0), user)  # replaces the shipped one
    entries = {e.name: e for e in load_swarms(user)}
    assert set(entries) == {"local-example", "lab"} and entries["local-example"].window_seconds == 60.0
    assert find_swarm("lab", user).bootstrap == [PUBLIC]
    with pytest.raises(SwarmListError, match="no listed swarm is called 'nope'; listed: local-example, lab"):
        find_swarm("nope", user)


@pytest.mark.parametrize(
    "text, error",
    [
        ("[[swarm]]\nname = 'a b'\n", "name: 'a b' must be"),
        ("[[swarm]]\nname = 'a'\nport = 1\n", "unknown key(s) port"),
        ("[[swarm]]\nname = 'a'\nbootstrap = ['/ip4/1.2.3.4/tcp/1']\n", "bootstrap: '/ip4/1.2.3.4/tcp/1'"),
        ("[[swarm]]\nname = 'a'\n[swarm.tasks]\nbf = -1\n", "tasks.bf: weight"),
        ("[[swarm]]\nname = 'a'\npage = 'javascript:alert(1)'\n", "page: an http:// or https://"),
        ("[[swarm]]\nname = 'a'\npage = 'https://x.org/\"><b>'\n", "page: an http:// or https://"),
        ("swarm = 3\n", "[[swarm]] table"),
        ("[[swarm]\n", "not valid TOML"),
    ],
)
def test_bad_swarm_lists_name_the_entry(text, error):
    with pytest.raises(SwarmListError) as e:
        parse_swarms(text, "x.toml")
    assert error in str(e.value) and "x.toml" in str(e.value), str(e.value)


def test_a_listed_swarm_fixes_the_swarm_wide_settings():
    entry = SwarmEntry(name="lab", bootstrap=[PUBLIC], window_seconds=60.0, shards=1, tasks={"bf": 2.0}, source="x")
    base = NodeConfig().replace(**{"swarm.initial_peers": [PRIVATE], "train.learning_rate": 1e-4})
    cfg = apply_swarm(base, entry, extra_peers=list(base.swarm.initial_peers))
    s = cfg.swarm
    assert (s.swarm_name, s.window_seconds, s.shards, s.shards_read, s.listed_swarm) == ("lab", 60.0, 1, 1, "lab")
    assert s.initial_peers == [PUBLIC, PRIVATE] and cfg.tasks.weights == {"bf": 2.0}
    assert cfg.train.learning_rate == 1e-4


def _run_args(**over) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    run_cmd.configure(p)
    args = p.parse_args([])
    for k, v in over.items():
        setattr(args, k, v)
    return args


def test_run_join_and_swarm_flags_build_the_config(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("SAPO_DATA_DIR", str(tmp_path))
    url = invitation_for(NodeConfig().replace(**{"swarm.swarm_name": "class-7b", "swarm.shards": 4}), [PRIVATE])
    cfg = run_cmd.build_config(_run_args(join=url))
    assert cfg.swarm.swarm_name == "class-7b" and cfg.swarm.shards == 4 and cfg.swarm.initial_peers == [PRIVATE]
    assert "private" in capsys.readouterr().err
    cfg = run_cmd.build_config(_run_args(swarm="local-example"))
    assert cfg.swarm.swarm_name == "local-example" and cfg.swarm.listed_swarm == "local-example"
    assert run_cmd.main(_run_args(join="sapo://join/x")) == 2
    assert "cannot join: the invitation names no peer" in capsys.readouterr().err
    assert run_cmd.main(_run_args(swarm="nope")) == 2


@pytest.mark.network
def test_a_node_joins_a_swarm_through_an_invitation(tmp_path):
    from helpers import RecordingHooks, honest_groups

    verifier = TaskSet(TaskConfig(), seed=0)
    base = NodeConfig().replace(
        **{
            "swarm.swarm_name": "invited",
            "swarm.host_maddrs": ["/ip4/127.0.0.1/tcp/0"],
            "swarm.window_seconds": 60.0,
            "swarm.shards": 2,
            "swarm.shards_read": 2,
            "swarm.lan_discovery": False,
            "swarm.gather_timeout": 20.0,
        }
    )
    host = open_swarm(base.swarm, verifier, tmp_path / "host", RecordingHooks())
    guest = None
    try:
        url = invitation_for(base, [host.join_address])
        joiner = NodeConfig().replace(**{"swarm.host_maddrs": ["/ip4/127.0.0.1/tcp/0"], "swarm.lan_discovery": False})
        cfg = apply_invitation(joiner, parse_invitation(url))
        assert (cfg.swarm.swarm_name, cfg.swarm.window_seconds, cfg.swarm.shards) == ("invited", 60.0, 2)
        hooks = RecordingHooks()
        guest = open_swarm(cfg.swarm, verifier, tmp_path / "guest", hooks)
        assert "joined swarm 'invited'" in hooks.text()
        guest.publish(1, honest_groups(seed=9, round=1))
        assert {g.source for g in host.gather(1, 3, random.Random(0))} == {guest.node_id}
    finally:
        if guest is not None:
            guest.close()
        host.close()


@pytest.mark.network
def test_a_dead_bootstrap_list_trains_alone_and_retries(tmp_path):
    """A listed swarm whose only bootstrap peer is gone: the node starts, says it trains alone,
    keeps publishing without raising, and its retry loop runs."""
    import socket
    import time

    from helpers import RecordingHooks, honest_groups

    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    dead = f"/ip4/127.0.0.1/tcp/{s.getsockname()[1]}/p2p/{PEER_ID}"
    s.close()
    user = tmp_path / "swarms.toml"
    add_user_swarm(SwarmEntry(name="gone", bootstrap=[dead], window_seconds=60.0), user)
    cfg = apply_swarm(NodeConfig(), find_swarm("gone", user)).replace(
        **{
            "swarm.host_maddrs": ["/ip4/127.0.0.1/tcp/0"],
            "swarm.lan_discovery": False,
            "swarm.join_timeout": 1.0,
            "swarm.join_attempts": 1,
            "swarm.rejoin_min_seconds": 0.3,
            "swarm.rejoin_max_seconds": 1.0,
        }
    )
    hooks = RecordingHooks()
    node = open_swarm(cfg.swarm, TaskSet(TaskConfig(), seed=0), tmp_path / "n", hooks)
    try:
        assert "Training alone meanwhile; retrying" in hooks.text()
        node.publish(0, honest_groups(1, 0))
        assert node.gather(0, 4, random.Random(0)) == []
        deadline = time.monotonic() + 20
        while "still no peer answers" not in hooks.text() and time.monotonic() < deadline:
            time.sleep(0.2)
        assert "still no peer answers" in hooks.text()
        assert node.stats()["swarm/reachable"] == -1.0  # nobody to ask: unknown, and it says so
    finally:
        node.close()


def test_sapo_node_swarms_lists_and_adds(tmp_path, monkeypatch, capsys):
    from sapo_core.cli import main

    monkeypatch.setenv("SAPO_DATA_DIR", str(tmp_path))
    assert main(["swarms"]) == 0
    out = capsys.readouterr().out
    assert "local-example" in out and "no bootstrap peers" in out and str(tmp_path / "swarms.toml") in out
    url = make_invitation(SwarmEntry(name="lab", shards=4), [PRIVATE])
    assert main(["swarms", "add", url, "--description", "our lab"]) == 0
    captured = capsys.readouterr()
    assert "added swarm 'lab'" in captured.out and "private" in captured.err
    assert find_swarm("lab", tmp_path / "swarms.toml").bootstrap == [PRIVATE]
    assert main(["swarms"]) == 0 and "our lab" in capsys.readouterr().out
    assert main(["swarms", "add", "sapo://join/x"]) == 2 and "names no peer" in capsys.readouterr().err
    # a listed swarm's page, where its entry has one: in the list, and as this node's when it joins it
    add_user_swarm(SwarmEntry(name="lab", shards=4, page="https://swarm.example.org/"), tmp_path / "swarms.toml")
    (tmp_path / "node.toml").write_text("[swarm]\nlisted_swarm = 'lab'\n")
    assert main(["swarms"]) == 0
    out = capsys.readouterr().out
    assert "the swarm's page: https://swarm.example.org/" in out
    assert "This node's swarm: lab; its page: https://swarm.example.org/" in out
    assert page_url(NodeConfig().replace(**{"swarm.page_port": 31331})) == "http://127.0.0.1:31331/"
    assert page_url(NodeConfig()) == ""  # the default swarm has no page
