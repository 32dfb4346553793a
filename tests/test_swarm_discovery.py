"""LAN discovery: announcements parsed strictly (tables), and two real nodes finding each other by
mDNS on loopback only (never a real interface), then exchanging groups with no address typed."""

from __future__ import annotations

import random
import socket
import struct
import time

import pytest

from sapo_core.config import SwarmConfig, TaskConfig
from sapo_core.swarm.discovery import addresses_to_announce, announcement, discovery_interfaces, parse_announcement
from sapo_core.swarm.source import open_swarm
from sapo_core.tasks import TaskSet

from helpers import RecordingHooks, honest_groups

PEER = "12D3KooWAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA"
OTHER = "12D3KooWBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBB"


def test_an_announcement_round_trips():
    props = announcement("s1", PEER, [f"/ip4/10.0.0.{i}/tcp/4001/p2p/{PEER}" for i in range(5)])
    assert set(props) == {"v", "swarm", "peer", "a0", "a1", "a2"}
    raw = {k.encode(): v.encode() for k, v in props.items()}
    assert parse_announcement(raw, "s1", OTHER) == (PEER, [f"/ip4/10.0.0.{i}/tcp/4001" for i in range(3)])


@pytest.mark.parametrize(
    "props, why",
    [
        ({"v": "1", "swarm": "s2", "peer": PEER, "a0": "/ip4/1.2.3.4/tcp/1"}, "another swarm"),
        ({"v": "2", "swarm": "s1", "peer": PEER, "a0": "/ip4/1.2.3.4/tcp/1"}, "another version"),
        ({"v": "1", "swarm": "s1", "peer": OTHER, "a0": "/ip4/1.2.3.4/tcp/1"}, "ourselves"),
        ({"v": "1", "swarm": "s1", "peer": "0OIl" * 10, "a0": "/ip4/1.2.3.4/tcp/1"}, "not base58"),
        ({"v": "1", "swarm": "s1", "peer": "short", "a0": "/ip4/1.2.3.4/tcp/1"}, "too short"),
        ({"v": "1", "swarm": "s1", "peer": PEER}, "no address"),
        ({"v": "1", "swarm": "s1", "peer": PEER, "a0": "ip4/1.2.3.4"}, "not a multiaddr"),
        ({"v": "1", "swarm": "s1", "peer": PEER, "a0": "/ip4/1.2.3.4/tcp/1/p2p/X/p2p-circuit"}, "relayed"),
        ({"v": "1", "swarm": "s1", "peer": PEER, "a0": "/ip4/1.2.3.4/tcp/1;rm -rf"}, "odd characters"),
        ({"v": "1", "swarm": "s1", "peer": PEER, "a0": "/" + "a" * 300}, "too long"),
        ({b"v": b"1", b"swarm": b"s1", b"peer": b"\xff" * 40, b"a0": b"/ip4/1.2.3.4/tcp/1"}, "not ascii"),
    ],
)
def test_bad_announcements_are_dropped(props, why):
    assert parse_announcement(props, "s1", OTHER) is None, why


def test_discovery_runs_where_the_node_listens():
    assert discovery_interfaces(SwarmConfig(host_maddrs=["/ip4/127.0.0.1/tcp/0"])) is None  # tests: off
    assert discovery_interfaces(SwarmConfig(host_maddrs=["/ip4/127.0.0.1/tcp/0", "/ip4/10.1.2.3/tcp/0"])) == [
        "10.1.2.3"
    ]
    assert discovery_interfaces(SwarmConfig(host_maddrs=["/ip4/0.0.0.0/tcp/0"])) == []
    assert discovery_interfaces(SwarmConfig(host_maddrs=[])) == []
    assert discovery_interfaces(SwarmConfig(host_maddrs=["/ip4/0.0.0.0/tcp/0"], lan_interfaces=["127.0.0.1"])) == [
        "127.0.0.1"
    ]


def test_loopback_addresses_are_announced_only_on_loopback():
    mine = ["/ip4/127.0.0.1/tcp/1/p2p/Qm", "/ip4/10.0.0.5/tcp/1/p2p/Qm", "/ip4/9.9.9.9/tcp/1/p2p/R/p2p-circuit/p2p/Qm"]
    assert addresses_to_announce(mine, []) == ["/ip4/10.0.0.5/tcp/1/p2p/Qm"]
    assert addresses_to_announce(mine, ["127.0.0.1"]) == mine[:2]
    assert addresses_to_announce(mine[:1], []) == mine[:1]


def _loopback_multicast_works() -> str:
    """'' if a multicast datagram sent out of 127.0.0.1 comes back on loopback, else why not."""
    group, port = "224.0.0.251", 0
    try:
        recv = socket.socket(socket.AF_INET, socket.SOCK_DGRAM, socket.IPPROTO_UDP)
        recv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        recv.bind(("", 0))
        port = recv.getsockname()[1]
        recv.setsockopt(
            socket.IPPROTO_IP,
            socket.IP_ADD_MEMBERSHIP,
            struct.pack("4s4s", socket.inet_aton(group), socket.inet_aton("127.0.0.1")),
        )
        recv.settimeout(2)
        send = socket.socket(socket.AF_INET, socket.SOCK_DGRAM, socket.IPPROTO_UDP)
        send.setsockopt(socket.IPPROTO_IP, socket.IP_MULTICAST_IF, socket.inet_aton("127.0.0.1"))
        send.setsockopt(socket.IPPROTO_IP, socket.IP_MULTICAST_TTL, 1)
        send.sendto(b"sapo-probe", (group, port))
        data = recv.recv(64)
        send.close()
        recv.close()
    except OSError as e:
        return f"multicast on loopback does not work here: {e}"
    return "" if data == b"sapo-probe" else "multicast on loopback returned something else"


@pytest.mark.network
def test_two_nodes_find_each_other_on_loopback_by_mdns(tmp_path):
    why = _loopback_multicast_works()
    if why:
        pytest.skip(why)
    verifier = TaskSet(TaskConfig(), seed=0)
    name = f"lan-{random.randrange(1 << 30):x}"  # no other test's nodes in this swarm
    cfg = SwarmConfig(
        swarm_name=name,
        host_maddrs=["/ip4/127.0.0.1/tcp/0"],
        lan_interfaces=["127.0.0.1"],
        window_seconds=60.0,
        gather_timeout=20.0,
        publish_timeout=20.0,
    )
    hooks = [RecordingHooks(), RecordingHooks()]
    a = open_swarm(cfg, verifier, tmp_path / "a", hooks[0])
    b = None
    try:
        b = open_swarm(cfg, verifier, tmp_path / "b", hooks[1])  # no initial peers: both would host alone
        deadline = time.monotonic() + 30
        while (a.dht.num_peers() == 0 or b.dht.num_peers() == 0) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert a.dht.num_peers() > 0 and b.dht.num_peers() > 0, hooks[0].text() + hooks[1].text()
        assert "found on the local network" in hooks[0].text() + hooks[1].text()
        assert b.stats()["swarm/lan_peers"] + a.stats()["swarm/lan_peers"] >= 1
        a.publish(1, honest_groups(seed=1, round=1))
        b.publish(1, honest_groups(seed=2, round=1))
        assert {g.source for g in a.gather(1, 3, random.Random(0))} == {b.node_id}
        assert {g.source for g in b.gather(1, 3, random.Random(0))} == {a.node_id}
    finally:
        if b is not None:
            b.close()
        a.close()


@pytest.mark.network
@pytest.mark.parametrize("over", [dict(lan_discovery=False, lan_interfaces=["127.0.0.1"]), {}])
def test_discovery_off_sends_nothing(tmp_path, over):
    """Off by the setting, and off for a node listening on loopback only unless it asks."""
    cfg = SwarmConfig(swarm_name="lan-off", host_maddrs=["/ip4/127.0.0.1/tcp/0"], **over)
    a = open_swarm(cfg, TaskSet(TaskConfig(), seed=0), tmp_path / "a", RecordingHooks())
    try:
        assert a.dht.discovery is None
    finally:
        a.close()
