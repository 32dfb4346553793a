"""A node behind a real NAT: three network namespaces made for this test (a public side, a NAT
router doing iptables MASQUERADE, a private side), deleted afterwards. The node behind the NAT
joins the public node, finds by dial-back that nobody can dial it, becomes a DHT client, and
publishes; the public node reads its groups, and it reads the public node's. Nothing here
touches the machine's own interfaces. Skipped (with the reason) where namespaces or iptables
are not available (not root, no `ip`, no `iptables`)."""

from __future__ import annotations

import json
import os
import select
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.network
REPO = Path(__file__).resolve().parent.parent
PUBLIC_IP, NAT_PUBLIC_IP, NAT_PRIVATE_IP, PRIVATE_IP = "198.51.100.2", "198.51.100.1", "10.77.0.1", "10.77.0.2"


def _sh(*args: str) -> None:
    subprocess.run(list(args), check=True, capture_output=True, timeout=30)


@pytest.fixture
def nat():
    """{'pub': ns, 'nat': ns, 'priv': ns}: pub <-> nat (MASQUERADE) <-> priv, removed afterwards."""
    if os.geteuid() != 0 or not shutil.which("ip"):
        pytest.skip("network namespaces need root and iproute2's `ip`")
    if not shutil.which("iptables"):
        pytest.skip("the NAT needs iptables (apt-get install iptables)")
    tag = f"s{os.getpid() % 100000}"
    ns = {side: f"{tag}-{side}" for side in ("pub", "nat", "priv")}
    made: list[str] = []
    try:
        for name in ns.values():
            _sh("ip", "netns", "add", name)
            made.append(name)
        # veth names: at most 15 characters
        _sh("ip", "link", "add", f"{tag}a", "type", "veth", "peer", "name", f"{tag}b")
        _sh("ip", "link", "set", f"{tag}a", "netns", ns["pub"])
        _sh("ip", "link", "set", f"{tag}b", "netns", ns["nat"])
        _sh("ip", "link", "add", f"{tag}c", "type", "veth", "peer", "name", f"{tag}d")
        _sh("ip", "link", "set", f"{tag}c", "netns", ns["nat"])
        _sh("ip", "link", "set", f"{tag}d", "netns", ns["priv"])
        for side, dev, addr in (
            ("pub", "a", PUBLIC_IP),
            ("nat", "b", NAT_PUBLIC_IP),
            ("nat", "c", NAT_PRIVATE_IP),
            ("priv", "d", PRIVATE_IP),
        ):
            prefix = "24"
            _sh("ip", "-n", ns[side], "addr", "add", f"{addr}/{prefix}", "dev", f"{tag}{dev}")
            _sh("ip", "-n", ns[side], "link", "set", f"{tag}{dev}", "up")
        for name in ns.values():
            _sh("ip", "-n", name, "link", "set", "lo", "up")
        _sh("ip", "-n", ns["priv"], "route", "add", "default", "via", NAT_PRIVATE_IP)
        _sh("ip", "netns", "exec", ns["nat"], "sysctl", "-q", "-w", "net.ipv4.ip_forward=1")
        _sh(
            "ip",
            "netns",
            "exec",
            ns["nat"],
            "iptables",
            "-t",
            "nat",
            "-A",
            "POSTROUTING",
            "-o",
            f"{tag}b",
            "-j",
            "MASQUERADE",
        )
    except subprocess.CalledProcessError as e:
        for name in made:
            subprocess.run(["ip", "netns", "del", name], capture_output=True)
        pytest.skip(f"could not build the namespaces: {' '.join(e.cmd)}: {e.stderr.decode(errors='replace')[:200]}")
    yield ns
    for name in made:  # deleting a namespace deletes its veth ends
        subprocess.run(["ip", "netns", "del", name], capture_output=True, timeout=30)


class NsNode:
    """A tests/nat_node.py child inside a namespace, driven line by line."""

    def __init__(self, ns: str, cfg: dict, identity_dir: Path) -> None:
        env = dict(os.environ, PYTHONPATH=str(REPO))
        self.proc = subprocess.Popen(
            ["ip", "netns", "exec", ns, sys.executable, "-m", "tests.nat_node", json.dumps(cfg), str(identity_dir)],
            cwd=REPO,
            env=env,
            text=True,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )

    def read(self, timeout: float = 120) -> dict:
        ready, _, _ = select.select([self.proc.stdout], [], [], timeout)
        line = self.proc.stdout.readline() if ready else ""
        if not line:
            self.proc.kill()
            raise AssertionError(f"node said nothing within {timeout} s; stderr: {self.proc.stderr.read()[-2000:]}")
        return json.loads(line)

    def ask(self, word: str) -> dict:
        self.proc.stdin.write(word + "\n")
        self.proc.stdin.flush()
        return self.read()

    def stop(self) -> None:
        if self.proc.poll() is None:
            try:
                self.ask("quit")
                self.proc.wait(30)
            except Exception:  # noqa: BLE001 - a stuck child is killed
                self.proc.kill()
                self.proc.wait(10)


def test_a_node_behind_nat_joins_as_a_client_and_is_read(nat, tmp_path):
    base = {
        "swarm_name": "nat-test",
        "window_seconds": 60.0,
        "gather_timeout": 20.0,
        "publish_timeout": 20.0,
        "lan_discovery": False,
    }
    public = NsNode(nat["pub"], {**base, "host_maddrs": [f"/ip4/{PUBLIC_IP}/tcp/0"]}, tmp_path / "pub")
    private = None
    try:
        hello = public.read()
        assert hello["address"].startswith(f"/ip4/{PUBLIC_IP}/tcp/"), hello
        private = NsNode(
            nat["priv"],
            {**base, "host_maddrs": ["/ip4/0.0.0.0/tcp/0"], "initial_peers": [hello["address"]]},
            tmp_path / "priv",
        )
        joined = private.read()
        log = joined["log"]
        # the public node saw the NAT's address, could not connect back, and the node became a client
        assert f"saw us at {NAT_PUBLIC_IP}" in log and "restarting it as a DHT client" in log, log
        assert joined["client_mode"] and joined["reachability"] == "unreachable" and joined["peers"] > 0, joined
        assert "behind NAT" in log
        assert private.ask("publish")["stats"]["swarm/publish_failed"] == 0
        assert public.ask("publish")["stats"]["swarm/publish_failed"] == 0
        assert public.ask("gather")["sources"] == [joined["node_id"]]
        got = private.ask("gather")
        assert got["sources"] == [hello["node_id"]] and got["stats"]["swarm/reachable"] == 0.0
    finally:
        if private is not None:
            private.stop()
        public.stop()
