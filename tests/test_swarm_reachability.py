"""Reachability over real p2p daemons on loopback: the dial-back verdicts, a node nobody can dial
(listening nowhere) joining as a DHT client, publishing, and being read by others; the pure
helpers (ports, private addresses, untrusted requests and answers) by tables."""

from __future__ import annotations

import asyncio
import random

import pytest

from sapo_core.config import SwarmConfig, TaskConfig
from sapo_core.swarm import reachability as R
from sapo_core.swarm.source import open_swarm
from sapo_core.tasks import TaskSet

from helpers import RecordingHooks, honest_groups


def _config(**over) -> SwarmConfig:
    base = dict(
        swarm_name="reach-test",
        host_maddrs=["/ip4/127.0.0.1/tcp/0"],
        window_seconds=60.0,
        gather_timeout=20.0,
        publish_timeout=20.0,
        lan_discovery=False,
    )
    base.update(over)
    return SwarmConfig(**base)


@pytest.mark.parametrize(
    "maddrs, ports",
    [
        (["/ip4/127.0.0.1/tcp/4001/p2p/Qm", "/ip6/::1/tcp/4001", "/ip4/10.0.0.2/tcp/4002"], [4001, 4002]),
        (["/ip4/1.2.3.4/udp/4001/quic"], []),
        (["/ip4/1.2.3.4/tcp/5/p2p/Qm/p2p-circuit"], []),
        (["/ip4/1.2.3.4/tcp/0", "/ip4/1.2.3.4/tcp/x", "/ip4/1.2.3.4/tcp"], []),
        ([f"/ip4/1.2.3.4/tcp/{p}" for p in range(1, 10)], [1, 2, 3, 4]),
    ],
)
def test_tcp_ports(maddrs, ports):
    assert R.tcp_ports(maddrs) == ports


@pytest.mark.parametrize(
    "maddr, private",
    [
        ("/ip4/127.0.0.1/tcp/1/p2p/Qm", True),
        ("/ip4/192.168.1.20/tcp/1", True),
        ("/ip4/10.1.2.3/tcp/1", True),
        ("/ip4/172.16.0.1/tcp/1", True),
        ("/ip4/100.64.1.1/tcp/1", True),
        ("/ip4/169.254.1.1/tcp/1", True),
        ("/ip6/fd00::1/tcp/1", True),
        ("/ip6/::1/tcp/1", True),
        ("/ip4/0.0.0.0/tcp/1", True),
        ("/ip4/8.8.8.8/tcp/1", False),
        ("/ip6/2001:4860::8888/tcp/1", False),
        ("/dns4/example.org/tcp/1", False),
        ("/ip4/10.0.0.1/tcp/1/p2p/Qm/p2p-circuit/p2p/Qn", False),
    ],
)
def test_private_addresses(maddr, private):
    assert R.is_private(maddr) is private


@pytest.mark.parametrize(
    "data, ports",
    [
        (b'{"ports": [4001, 4002]}', [4001, 4002]),
        (b'{"ports": [0, 70000, "80", true, 22]}', [22]),
        (b'{"ports": [1, 2, 3, 4, 5, 6]}', [1, 2, 3, 4]),
        (b'{"ports": 5}', []),
        (b"[]", []),
        (b"\xff\xfe", []),
        (b"not json", []),
        (b'{"ports": [1]}' + b" " * 600, []),
    ],
)
def test_dialback_requests_are_parsed_strictly(data, ports):
    assert R.parse_request(data) == ports


def test_dialback_answers_are_parsed_strictly():
    assert R.parse_answer(b'{"seen": "1.2.3.4", "reached": ["/ip4/1.2.3.4/tcp/1"]}') == (
        "1.2.3.4",
        ["/ip4/1.2.3.4/tcp/1"],
    )
    assert R.parse_answer(b'{"seen": 5, "reached": []}') == ("", [])
    assert R.parse_answer(b'{"seen": "x", "reached": [1, "' + b"a" * 300 + b'"]}') == ("x", [])
    assert R.parse_answer(b"x" * 5000) == ("", [])


def test_words():
    assert R.Reachability(R.REACHABLE, "/ip4/1.2.3.4/tcp/1").words() == "reachable at /ip4/1.2.3.4/tcp/1"
    assert "using a relay" in R.Reachability(R.UNREACHABLE, relayed=True).words()
    assert "DHT client" in R.Reachability(R.UNREACHABLE).words()
    assert "unknown" in R.Reachability().words()


@pytest.mark.network
def test_dialback_tells_a_listening_node_from_a_closed_port():
    from hivemind.dht.node import DHTNode

    async def run():
        a = await DHTNode.create(host_maddrs=["/ip4/127.0.0.1/tcp/0"])
        service = R.DialbackService(a.p2p)
        await service.start()
        a_maddrs = [str(m) for m in await a.get_visible_maddrs()]
        b = await DHTNode.create(host_maddrs=["/ip4/127.0.0.1/tcp/0"], initial_peers=a_maddrs)
        try:
            b_maddrs = [str(m) for m in await b.get_visible_maddrs()]
            open_ = await R.check(b.p2p, [a.peer_id], b_maddrs, 10)
            # a port nobody listens on: bind one, note it, close it
            import socket

            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            closed_port = s.getsockname()[1]
            s.close()
            closed = await R.check(b.p2p, [a.peer_id], [f"/ip4/127.0.0.1/tcp/{closed_port}"], 10)
            nobody = await R.check(b.p2p, [], b_maddrs, 10)
            no_handler = await R.check(a.p2p, [b.peer_id], a_maddrs, 3)  # b serves no dial-back: times out
            return open_, closed, nobody, no_handler, b_maddrs, service.answered
        finally:
            await b.shutdown()
            await a.shutdown()

    open_, closed, nobody, no_handler, b_maddrs, answered = asyncio.run(run())
    assert open_.status == R.REACHABLE and b_maddrs[0].startswith(open_.address), open_
    assert closed.status == R.UNREACHABLE and "127.0.0.1" in closed.detail, closed
    assert nobody.status == R.UNKNOWN and no_handler.status == R.UNKNOWN
    assert answered == 2


@pytest.mark.network
def test_a_node_nobody_can_dial_joins_as_a_client_publishes_and_is_read(tmp_path):
    """c listens nowhere: it joins through a as a DHT client, its records are stored on a and b,
    and b reads them; c reads theirs too. Reachable nodes say so and hand out the reached address."""
    verifier = TaskSet(TaskConfig(), seed=0)
    hooks = [RecordingHooks() for _ in range(3)]
    a = open_swarm(_config(), verifier, tmp_path / "a", hooks[0])
    nodes = [a]
    try:
        b = open_swarm(_config(initial_peers=[a.join_address]), verifier, tmp_path / "b", hooks[1])
        nodes.append(b)
        c = open_swarm(_config(initial_peers=[a.join_address], host_maddrs=[]), verifier, tmp_path / "c", hooks[2])
        nodes.append(c)
        assert c.dht.client_mode and c.visible_maddrs == [] and c.dht.num_peers() > 0
        assert b.dht.reachability.status == R.REACHABLE, hooks[1].text()
        assert "reachable at /ip4/127.0.0.1/tcp/" in hooks[1].text()
        assert b.join_address == f"{b.dht.reachability.address}/p2p/{b.node_id}"
        assert "behind NAT" in hooks[2].text()
        for i, node in enumerate(nodes):
            node.publish(1, honest_groups(seed=300 + i, round=1))
        got_b = b.gather(1, 6, random.Random(0))
        assert c.node_id in {g.source for g in got_b}
        got_c = c.gather(1, 6, random.Random(0))
        assert {g.source for g in got_c} == {a.node_id, b.node_id}
        stats_b, stats_c = b.stats(), c.stats()
        assert stats_b["swarm/reachable"] == 1.0 and stats_b["swarm/client_mode"] == 0.0
        assert stats_c["swarm/reachable"] == 0.0 and stats_c["swarm/client_mode"] == 1.0
    finally:
        for node in nodes:
            node.close()


@pytest.mark.network
def test_an_unreachable_server_restarts_as_a_client(tmp_path):
    """b listens, but announces a port nobody listens on: the dial-back fails and, in auto mode,
    it restarts as a DHT client, still joined and still publishing."""
    import socket

    verifier = TaskSet(TaskConfig(), seed=0)
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    dead_port = s.getsockname()[1]
    s.close()
    a = open_swarm(_config(), verifier, tmp_path / "a", RecordingHooks())
    hooks = RecordingHooks()
    b = None
    try:
        # the daemon listens on a port of its own choosing; the only address we tell peers is dead
        b = open_swarm(
            _config(initial_peers=[a.join_address], announce_maddrs=[f"/ip4/127.0.0.1/tcp/{dead_port}"]),
            verifier,
            tmp_path / "b",
            hooks,
        )
        assert "restarting it as a DHT client" in hooks.text(), hooks.text()
        assert b.dht.client_mode and b.dht.num_peers() > 0
        b.publish(1, honest_groups(seed=5, round=1))
        assert {g.source for g in a.gather(1, 3, random.Random(0))} == {b.node_id}
    finally:
        if b is not None:
            b.close()
        a.close()


def test_config_names_a_wrong_reachability_mode():
    from sapo_core.config import ConfigError

    with pytest.raises(ConfigError, match="swarm.reachability: 'sometimes' must be one of auto, reachable"):
        SwarmConfig(reachability="sometimes")
    with pytest.raises(ConfigError, match="swarm.listed_swarm"):
        SwarmConfig(listed_swarm="a b")
    assert SwarmConfig(host_maddrs=[]).host_maddrs == []  # listening nowhere is allowed: a client
