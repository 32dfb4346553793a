"""Churn (issue 24): a node process killed with SIGKILL leaves no p2p daemon running, the next
start sweeps the daemon socket it left and rejoins; peers that join, leave and die around a node
(some killed with SIGKILL, some joined as DHT clients) never break its gathers.

All on loopback; every node and peer is real (p2pd, DHT, validators)."""

from __future__ import annotations

import glob
import os
import random
import signal
import subprocess
import sys
import textwrap
import time

import psutil
import pytest

from sapo_core.config import SwarmConfig, TaskConfig
from sapo_core.control import protocol as P
from sapo_core.control.client import NodeClient
from sapo_core.swarm.p2pd import sweep_stale_sockets
from sapo_core.swarm.source import open_swarm
from sapo_core.tasks import TaskSet

from helpers import honest_groups, light_config

pytestmark = [pytest.mark.network, pytest.mark.node_process]

SOCKETS = "/tmp/hivemind-p2p*.sock"


def _swarm(**changes) -> SwarmConfig:
    base = dict(swarm_name="churn-test", window_seconds=60.0, host_maddrs=["/ip4/127.0.0.1/tcp/0"], lan_discovery=False)
    return SwarmConfig(**{**base, **changes})


def _alive(pids) -> list[int]:
    out = []
    for pid in pids:
        try:
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                out.append(pid)
        except psutil.NoSuchProcess:
            pass
    return out


def _daemon(client: NodeClient) -> tuple[int, str]:
    """The node's p2p daemon: its pid and the unix socket it listens on (its -listen argument)."""
    for p in psutil.Process(client.pid).children(recursive=True):
        if "p2pd" in p.name():
            args = p.cmdline()
            listen = next(a.split("=", 1)[1] for a in args if a.startswith("-listen="))
            return p.pid, listen.removeprefix("/unix")
    raise AssertionError("the node runs no p2p daemon")


def _gone(pid: int, timeout: float = 20.0) -> bool:
    deadline = time.monotonic() + timeout
    while _alive([pid]) and time.monotonic() < deadline:
        time.sleep(0.2)
    return not _alive([pid])


def test_a_killed_node_leaves_no_daemon_and_the_next_start_sweeps_its_socket_and_rejoins(tmp_path, env):
    host = open_swarm(_swarm(), TaskSet(TaskConfig(), seed=0), tmp_path / "host")
    swarm = {
        "swarm.enabled": True,
        "swarm.swarm_name": "churn-test",
        "swarm.window_seconds": 60.0,
        "swarm.host_maddrs": ["/ip4/127.0.0.1/tcp/0"],
        "swarm.lan_discovery": False,
        "swarm.initial_peers": [host.join_address],
        "round.external_groups": 1,
    }
    cfg = light_config(tmp_path / "run", **swarm)
    os.environ.update(env)  # the node process's data directory and model cache
    client = NodeClient(heartbeat_timeout=300)
    try:
        client.start(cfg)
        client.wait_for(lambda e: isinstance(e, P.RoundDone), 300)
        pid, _ = _daemon(client)
        os.kill(client.pid, signal.SIGKILL)  # the node alone: its daemon must follow it
        assert _gone(pid), "the killed node's p2p daemon outlived it"
        client.close()

        client = NodeClient(heartbeat_timeout=300)
        client.start(cfg)
        client.wait_for(lambda e: isinstance(e, P.RoundDone), 300)
        pid, sock = _daemon(client)
        client.kill()  # the whole tree, daemon included, as the app does to a hung node
        assert _gone(pid)
        client.close()
        assert os.path.exists(sock), "a SIGKILLed daemon leaves its socket file (the case the sweep is for)"
        os.utime(sock, (time.time() - 60, time.time() - 60))  # the sweep leaves sockets younger than 10 s

        client = NodeClient(heartbeat_timeout=300)
        client.start(cfg)  # the same identity and run: it rejoins where it was
        done = client.wait_for(lambda e: isinstance(e, P.RoundDone), 300)
        assert done.round >= 2 and done.metrics["swarm/dht_peers"] >= 1
        assert not os.path.exists(sock), "the stale socket was not swept"
        pid, sock = _daemon(client)
        client.stop(timeout=60)
        assert _gone(pid) and not os.path.exists(sock)  # a clean stop leaves nothing
    finally:
        client.close()
        host.close()


def test_the_sweep_leaves_live_and_young_sockets_alone(tmp_path):
    live = open_swarm(_swarm(), TaskSet(TaskConfig(), seed=0), tmp_path / "live")
    try:
        mine = set(glob.glob(SOCKETS))
        old = time.time() - 3600
        for s in mine:
            os.utime(s, (old, old))
        import socket

        dead = tmp_path / "hivemind-p2pd-deadbeef.sock"
        with socket.socket(socket.AF_UNIX) as s:
            s.bind(str(dead))  # bound, never listening, then closed: as a killed daemon leaves it
        young = tmp_path / "hivemind-p2pd-young.sock"
        with socket.socket(socket.AF_UNIX) as s:
            s.bind(str(young))
        os.utime(dead, (old, old))
        not_a_socket = tmp_path / "hivemind-p2pd-file.sock"
        not_a_socket.write_text("x")
        os.utime(not_a_socket, (old, old))
        assert sweep_stale_sockets(str(tmp_path)) == 1
        assert not dead.exists() and young.exists() and not_a_socket.exists()
        assert sweep_stale_sockets("/tmp") >= 0 and all(os.path.exists(s) for s in mine)  # live: kept
        assert live.dht.num_peers() >= 0 and live.gather(1, 1, random.Random(0)) == []  # still works
    finally:
        live.close()


_PEER = textwrap.dedent(
    """
    import random, sys, time
    sys.path.insert(0, {tests!r})
    from sapo_core.config import SwarmConfig, TaskConfig
    from sapo_core.swarm.source import open_swarm
    from sapo_core.tasks import TaskSet
    from helpers import honest_groups
    cfg = SwarmConfig(swarm_name="churn-test", window_seconds=60.0, host_maddrs=["/ip4/127.0.0.1/tcp/0"],
                      lan_discovery=False, initial_peers=[{address!r}], client_mode={client})
    me = open_swarm(cfg, TaskSet(TaskConfig(), seed=0), {where!r})
    print("up", flush=True)
    r = 0
    while True:
        r += 1
        me.publish(r, honest_groups(seed={seed} * 1000 + r, round=r, n=2))
        me.gather(r, 1, random.Random(r))
        time.sleep(1.0)
    """
)


@pytest.mark.slow
def test_peers_that_join_leave_and_die_never_break_a_node_s_gathers(tmp_path):
    node = open_swarm(_swarm(gather_timeout=10.0), TaskSet(TaskConfig(), seed=0), tmp_path / "node")
    tests = os.path.dirname(__file__)
    procs: list[subprocess.Popen] = []

    def peer(k: int, client: bool) -> subprocess.Popen:
        code = _PEER.format(
            tests=tests, address=node.join_address, client=client, where=str(tmp_path / f"p{k}"), seed=k
        )
        p = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        assert p.stdout.readline().strip() == "up"
        procs.append(p)
        return p

    try:
        peers = [peer(k, client=k % 4 == 3) for k in range(8)]  # 2 of them DHT clients
        rss0 = psutil.Process().memory_info().rss
        rng = random.Random(0)
        got_each, killed, stopped = [], 0, 0
        for r in range(1, 13):
            node.publish(r, honest_groups(seed=r, round=r, n=2))
            got = node.gather(r, 4, random.Random(r))
            got_each.append(len(got))
            assert node.stats()["swarm/gather_s"] < 30
            if r % 3 == 0:  # one dies without a word, one leaves cleanly, two new ones join
                victim = rng.choice([p for p in peers if p.poll() is None])
                victim.kill()
                killed += 1
                leaver = rng.choice([p for p in peers if p.poll() is None])
                leaver.send_signal(signal.SIGTERM)
                stopped += 1
                peers += [peer(100 + r, client=False), peer(200 + r, client=True)]
            time.sleep(1.0)
        grown = (psutil.Process().memory_info().rss - rss0) / 1e6
        assert sum(g > 0 for g in got_each[2:]) >= len(got_each[2:]) - 1, got_each  # found groups nearly every time
        assert node.dht.num_peers() <= len(procs) + 1  # the dead are not piling up in the table
        assert grown < 150, f"the node's memory grew {grown:.0f} MB over 12 gathers"
        assert killed == 4 and stopped == 4
    finally:
        for p in procs:
            p.kill()
            p.wait()
        node.close()


def test_a_node_on_loopback_never_asks_a_router_for_a_port(tmp_path):
    """p2pd's NAT port mapping (UPnP / NAT-PMP) sends discovery to the local network: a node that
    listens on loopback only (every test and benchmark) runs its daemon without it."""
    from sapo_core.swarm.p2pd import listens_beyond_loopback

    assert not listens_beyond_loopback(["/ip4/127.0.0.1/tcp/0", "/ip6/::1/tcp/0", "/ip4/127.8.9.1/tcp/5"])
    assert listens_beyond_loopback(["/ip4/0.0.0.0/tcp/0"]) and listens_beyond_loopback(["/ip6/::/tcp/1"])
    assert listens_beyond_loopback(["/ip4/127.0.0.1/tcp/0", "/ip4/192.168.1.2/tcp/0"])
    assert listens_beyond_loopback(["/dns/seed.example.org/tcp/31330"])
    node = open_swarm(_swarm(), TaskSet(TaskConfig(), seed=0), tmp_path / "n")
    try:
        daemons = [p.cmdline() for p in psutil.Process().children(recursive=True) if "p2pd" in p.name()]
        (args,) = [a for a in daemons if any(str(tmp_path) in x for x in a)]  # its -id is in tmp_path
        assert "-natPortMap=0" in args, args
    finally:
        node.close()
