"""The whole topology in network namespaces this test makes (never any outside address): a seed
on a "public" segment, two homes behind NAT routers (iptables MASQUERADE), three nodes: one in
each home, one on the public segment. The homes' nodes find peers cannot dial them and rejoin as
DHT clients; everyone exchanges verified groups through the swarm's DHT; receipts name whose
groups were used; the seed's page lists all three; with the seed stopped the nodes go on sharing
through the public node, and they are back on the seed's page when it returns.

The nodes are light (the swarm bench's kind: real p2pd, DHT, validators and verifier, groups
from ReasoningGYM questions with right and wrong answers, no model): the topology is what is
under test here; the real model shares real rollouts in tests/test_swarm_training.py.
Skipped with the reason where namespaces or iptables are not available (root in a container)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
import uuid

import pytest

from helpers import self_signed_tls

pytestmark = [pytest.mark.network, pytest.mark.slow]

SWARM = "topology-test"
PUBLIC = "10.199.0.{}"  # the "internet": a bridge in its own namespace
HOME = "192.168.{}.{}"  # each home's LAN behind its router


def _sh(*args: str, ns: str | None = None, check: bool = True) -> subprocess.CompletedProcess:
    cmd = (["ip", "netns", "exec", ns] if ns else []) + list(args)
    return subprocess.run(cmd, capture_output=True, text=True, check=check)


class Topology:
    def __init__(self) -> None:
        tag = uuid.uuid4().hex[:6]
        self.ns = {k: f"sapo-{k}-{tag}" for k in ("pub", "seed", "c", "r1", "h1", "r2", "h2")}
        self.made: list[str] = []

    def build(self) -> None:
        n = self.ns
        for name in n.values():
            _sh("ip", "netns", "add", name)
            self.made.append(name)
            _sh("ip", "link", "set", "lo", "up", ns=name)
        _sh("ip", "link", "add", "br0", "type", "bridge", ns=n["pub"])
        _sh("ip", "link", "set", "br0", "up", ns=n["pub"])
        # the public segment: the seed, node C, both routers' WAN sides
        for k, (who, host) in enumerate([("seed", 10), ("c", 20), ("r1", 1), ("r2", 2)]):
            self._wire(n[who], "wan0", n["pub"], f"p{k}", f"{PUBLIC.format(host)}/24", bridge="br0")
        for home in (1, 2):
            router, node = n[f"r{home}"], n[f"h{home}"]
            self._wire(
                node, "eth0", router, "lan0", f"{HOME.format(home, 2)}/24", peer_addr=f"{HOME.format(home, 1)}/24"
            )
            _sh("ip", "route", "add", "default", "via", HOME.format(home, 1), ns=node)
            _sh("sysctl", "-qw", "net.ipv4.ip_forward=1", ns=router)
            _sh("iptables", "-t", "nat", "-A", "POSTROUTING", "-o", "wan0", "-j", "MASQUERADE", ns=router)
            # a home router: nothing from outside gets in unless it belongs to a connection from inside
            _sh(
                "iptables",
                "-A",
                "FORWARD",
                "-i",
                "wan0",
                "-m",
                "conntrack",
                "--ctstate",
                "ESTABLISHED,RELATED",
                "-j",
                "ACCEPT",
                ns=router,
            )
            _sh("iptables", "-A", "FORWARD", "-i", "wan0", "-j", "DROP", ns=router)

    def _wire(self, a: str, a_if: str, b: str, b_if: str, addr: str, peer_addr: str = "", bridge: str = "") -> None:
        tmp_a, tmp_b = f"v{uuid.uuid4().hex[:8]}", f"v{uuid.uuid4().hex[:8]}"
        _sh("ip", "link", "add", tmp_a, "type", "veth", "peer", "name", tmp_b)
        _sh("ip", "link", "set", tmp_a, "netns", a)
        _sh("ip", "link", "set", tmp_b, "netns", b)
        _sh("ip", "link", "set", tmp_a, "name", a_if, ns=a)
        _sh("ip", "link", "set", tmp_b, "name", b_if, ns=b)
        _sh("ip", "addr", "add", addr, "dev", a_if, ns=a)
        _sh("ip", "link", "set", a_if, "up", ns=a)
        if peer_addr:
            _sh("ip", "addr", "add", peer_addr, "dev", b_if, ns=b)
        if bridge:
            _sh("ip", "link", "set", b_if, "master", bridge, ns=b)
        _sh("ip", "link", "set", b_if, "up", ns=b)

    def close(self) -> None:
        for name in self.made:
            _sh("ip", "netns", "pids", name, check=False)
            for pid in _sh("ip", "netns", "pids", name, check=False).stdout.split():
                try:
                    os.kill(int(pid), signal.SIGKILL)
                except (ProcessLookupError, ValueError):
                    pass
            _sh("ip", "netns", "del", name, check=False)


@pytest.fixture
def topology():
    if not shutil.which("iptables") or os.geteuid() != 0:
        pytest.skip("needs root and iptables to make network namespaces with NAT (.ci/run installs iptables)")
    probe = subprocess.run(["ip", "netns", "add", f"sapo-probe-{os.getpid()}"], capture_output=True, text=True)
    if probe.returncode != 0:
        pytest.skip(f"network namespaces are not available here: {probe.stderr.strip()}")
    subprocess.run(["ip", "netns", "del", f"sapo-probe-{os.getpid()}"], capture_output=True)
    t = Topology()
    try:
        t.build()
        yield t
    finally:
        t.close()


# a node joins by the swarm's name: it fetches the signed list over HTTPS, accepts it only signed
# by the key it trusts, finds the swarm in it and takes its settings and bootstrap peers from it
_NODE = textwrap.dedent(
    """
    import dataclasses, json, random, ssl, sys, time
    from pathlib import Path
    sys.path.insert(0, {tests!r})
    from sapo_core.config import NodeConfig, TaskConfig
    from sapo_core.swarm.signedlist import parse_keys, update
    from sapo_core.swarm.source import open_swarm
    from sapo_core.swarm.swarmlist import apply_swarm, parse_swarms
    from sapo_core.tasks import TaskSet
    from helpers import honest_groups
    Path({where!r}).mkdir(parents=True, exist_ok=True)
    got = update([{url!r}], parse_keys({key_line!r}), Path({where!r}) / "swarms-signed.toml",
                 context=ssl.create_default_context(cafile={cert!r}), check=parse_swarms)
    assert got.accepted is not None, got.lines()
    entry = next(e for e in got.accepted.entries if e.name == {swarm!r})
    node = apply_swarm(NodeConfig(), entry)
    cfg = dataclasses.replace(node.swarm, host_maddrs=["/ip4/0.0.0.0/tcp/0"], lan_discovery=False,
                              nat_port_map=False, gather_timeout=15.0, publish_timeout=15.0)
    me = open_swarm(cfg, TaskSet(TaskConfig(), seed=0), {where!r})
    print(json.dumps({{"id": me.node_id, "reachable": me.stats().get("swarm/reachable")}}), flush=True)
    used = []
    for r in range(1, 10_000):
        me.publish(r, honest_groups(seed={seed_n} * 1000 + r, round=r, n=2), receipts=used)
        got = me.gather(r, 4, random.Random(r))
        used = [(g.source, g.round, g.index) for g in got]
        print(json.dumps({{"round": r, "from": sorted({{g.source for g in got}})}}), flush=True)
        time.sleep(2.0)
    """
)


def _start(ns: str, code: str) -> subprocess.Popen:
    return subprocess.Popen(
        ["ip", "netns", "exec", ns, sys.executable, "-c", code],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _read_until(proc: subprocess.Popen, match, timeout: float) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            raise AssertionError("a node exited: " + proc.stderr.read()[-3000:])
        try:
            obj = json.loads(line)
        except ValueError:
            continue
        if match(obj):
            return obj
    raise AssertionError("timed out")


def _status(t: Topology) -> dict:
    """The seed's /api/status, read from the public node's namespace."""
    url = f"http://{PUBLIC.format(10)}:31331/api/status"
    code = f"import urllib.request, sys; sys.stdout.write(urllib.request.urlopen({url!r}, timeout=10).read().decode())"
    return json.loads(_sh(sys.executable, "-c", code, ns=t.ns["c"]).stdout)


_HTTPS = textwrap.dedent(
    """
    import http.server, ssl
    class Quiet(http.server.SimpleHTTPRequestHandler):
        def __init__(self, *a, **kw):
            super().__init__(*a, directory={root!r}, **kw)
        def log_message(self, *a):
            pass
    httpd = http.server.ThreadingHTTPServer(({host!r}, 8443), Quiet)
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain({cert!r}, {key!r})
    httpd.socket = ctx.wrap_socket(httpd.socket, server_side=True)
    print("serving", flush=True)
    httpd.serve_forever()
    """
)


def test_a_seed_two_homes_behind_nat_and_a_public_node_share_through_the_swarm(topology, tmp_path):
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    from sapo_core.swarm.signedlist import public_key_line, sign_list

    t, tests = topology, os.path.dirname(__file__)
    seed_cmd = [
        sys.executable,
        "-m",
        "sapo_core.cli",
        "seed",
        "--data-dir",
        str(tmp_path / "seed"),
        "--host",
        PUBLIC.format(10),
    ]
    seed_cmd += ["--set", f"swarm.swarm_name={SWARM}", "--set", "swarm.window_seconds=60"]

    def start_seed() -> tuple[subprocess.Popen, str]:
        proc = subprocess.Popen(
            ["ip", "netns", "exec", t.ns["seed"], *seed_cmd],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        while True:
            line = proc.stdout.readline()
            assert line, "the seed did not start"
            if "join with: --initial-peers " in line:
                return proc, line.split("--initial-peers ", 1)[1].strip()

    seed, address = start_seed()
    assert f"/ip4/{PUBLIC.format(10)}/tcp/31330/p2p/" in address
    # the swarm list, signed by the maintainers' key and served over HTTPS on the public segment
    www = tmp_path / "www"
    www.mkdir()
    signer = Ed25519PrivateKey.generate()
    body = (
        f'version = 1\n\n[[swarm]]\nname = "{SWARM}"\ndescription = "in namespaces"\n'
        f'bootstrap = ["{address}"]\nwindow_seconds = 60.0\nshards = 16\npage = "http://{PUBLIC.format(10)}:31331/"\n'
    )
    (www / "swarms.toml").write_text(sign_list(body, signer))
    cert, key = map(str, self_signed_tls(tmp_path, PUBLIC.format(10)))
    https = _start(t.ns["seed"], _HTTPS.format(root=str(www), host=PUBLIC.format(10), cert=cert, key=key))
    assert https.stdout.readline().strip() == "serving"
    url = f"https://{PUBLIC.format(10)}:8443/swarms.toml"
    nodes = {"https": https}
    try:
        for k, ns in (("c", "c"), ("a", "h1"), ("b", "h2")):
            where = str(tmp_path / k)
            code = _NODE.format(
                tests=tests,
                swarm=SWARM,
                url=url,
                key_line=public_key_line(signer),
                cert=cert,
                where=where,
                seed_n=ord(k),
            )
            nodes[k] = _start(t.ns[ns], code)
        ids = {k: _read_until(p, lambda o: "id" in o, 120) for k, p in nodes.items() if k != "https"}
        assert ids["c"]["reachable"] == 1.0  # the public node is dialled back
        assert ids["a"]["reachable"] == 0.0 and ids["b"]["reachable"] == 0.0  # the homes are not: DHT clients
        peer = {k: v["id"] for k, v in ids.items()}
        nodes.pop("https").kill()  # the nodes have the list; the rest needs only the swarm
        # each home's node trains on groups of the other home's node, through the swarm
        for k, other in (("a", "b"), ("b", "a")):
            _read_until(nodes[k], lambda o, other=other: peer[other] in o.get("from", []), 120)
        status = {}
        for _ in range(30):  # the seed's page: all three, and receipts on the board
            status = _status(t)
            board = {b["peer_id"] for b in status.get("board", [])}
            if status.get("nodes_recent") == 3 and {peer["a"], peer["b"]} <= board:
                break
            time.sleep(2)
        assert {n["peer_id"] for n in status["nodes"]} == set(peer.values()), status
        assert {peer["a"], peer["b"]} <= {b["peer_id"] for b in status["board"]}, status["board"]

        seed.send_signal(signal.SIGTERM)
        seed.wait(30)
        # without the seed, the homes keep sharing through the public node's DHT
        for k, other in (("a", "b"), ("b", "a")):
            _read_until(nodes[k], lambda o, other=other: peer[other] in o.get("from", []), 120)
        seed, again = start_seed()
        assert again == address  # the same identity and address: every node's list still holds
        for _ in range(40):  # the nodes' records reach the returned seed
            status = _status(t)
            if status.get("nodes_recent") == 3:
                break
            time.sleep(2)
        assert status["nodes_recent"] == 3, status
    finally:
        for p in nodes.values():
            p.kill()
        seed.kill()
