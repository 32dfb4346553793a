"""`sapo-node doctor --network`: the judging of made-up probe results (each failure gets a fix),
and the real probe against a real node on loopback with one live and one dead bootstrap peer."""

from __future__ import annotations

import json
import socket

import pytest

from sapo_core.commands import doctor
from sapo_core.commands.doctor import Check
from sapo_core.config import SwarmConfig, TaskConfig
from sapo_core.swarm.netcheck import judge_network
from sapo_core.tasks import TaskSet

PEER = "/ip4/127.0.0.1/tcp/4001/p2p/QmWNtPYCUJ4LV4MDEU5FAnrJAPSZ1M6uGfCiDHasECE6ha"


def _by_name(checks: list[Check]) -> dict[str, Check]:
    return {c.name: c for c in checks}


def test_a_daemon_that_does_not_start_is_one_failed_check_with_a_fix():
    checks = judge_network(
        {"started": False, "error": "P2PDaemonError: Daemon failed to start in 10.0 seconds"},
        None,
        SwarmConfig(),
        Check,
    )
    assert [c.name for c in checks] == ["daemon"] and checks[0].status == "fail"
    assert "Daemon failed to start" in checks[0].detail and "reinstall hivemind" in checks[0].fix
    assert judge_network(None, "crashed with SIGSEGV", SwarmConfig(), Check)[0].detail.endswith("SIGSEGV")


def test_the_judging_of_a_probe_behind_nat_with_a_skewed_clock():
    payload = {
        "started": True,
        "start_s": 0.4,
        "maddrs": [],
        "peers": [
            {"maddr": PEER, "ok": True, "rtt": 0.05, "offset": -42.0},
            {"maddr": PEER.replace("4001", "4002"), "ok": False, "error": "TimeoutError: "},
        ],
        "reachability": {"status": "unreachable", "detail": "1 peer(s) saw us at 198.51.100.7"},
        "lan": {"enabled": True, "ok": False, "error": "mDNS could not start: [Errno 19]"},
    }
    c = _by_name(judge_network(payload, None, SwarmConfig(initial_peers=[PEER, PEER]), Check))
    assert c["daemon"].status == "ok" and c["addresses"].status == "warn" and "DHT client" in c["addresses"].detail
    assert c["bootstrap"].status == "warn" and "1 of 2" in c["bootstrap"].detail and "50 ms" in c["bootstrap"].detail
    assert c["reachability"].status == "warn" and "forward a TCP port" in c["reachability"].fix
    assert c["clock"].status == "fail" and "-42.00 s" in c["clock"].detail and "NTP" in c["clock"].fix
    assert c["lan"].status == "warn" and "5353" in c["lan"].fix


def test_no_peer_answering_fails_the_bootstrap_check():
    payload = {
        "started": True,
        "maddrs": ["/ip4/10.0.0.2/tcp/5/p2p/Qm"],
        "peers": [{"maddr": PEER, "ok": False}],
        "reachability": {"status": "unknown"},
        "lan": {"enabled": False},
    }
    c = _by_name(judge_network(payload, None, SwarmConfig(initial_peers=[PEER]), Check))
    assert c["bootstrap"].status == "fail" and "that the peer is running" in c["bootstrap"].fix
    assert c["addresses"].detail == "listening on /ip4/10.0.0.2/tcp/5" and c["clock"].status == "warn"
    assert c["reachability"].status == "warn" and c["lan"].status == "ok"


@pytest.mark.network
def test_the_network_doctor_against_a_real_node(tmp_path, monkeypatch, capsys):
    from sapo_core.swarm.source import open_swarm

    from helpers import RecordingHooks

    host = open_swarm(
        SwarmConfig(swarm_name="doctor-test", host_maddrs=["/ip4/127.0.0.1/tcp/0"], lan_interfaces=["127.0.0.1"]),
        TaskSet(TaskConfig(), seed=0),
        tmp_path / "host",
        RecordingHooks(),
    )
    try:
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        dead = f"/ip4/127.0.0.1/tcp/{s.getsockname()[1]}/p2p/{host.node_id}"
        s.close()
        cfg = SwarmConfig(
            swarm_name="doctor-test",
            host_maddrs=["/ip4/127.0.0.1/tcp/0"],
            lan_interfaces=["127.0.0.1"],
            initial_peers=[
                host.join_address,
                dead.replace(host.node_id, "QmWNtPYCUJ4LV4MDEU5FAnrJAPSZ1M6uGfCiDHasECE6ha"),
            ],
        )
        c = _by_name(doctor.run_network_checks(cfg, timeout=5.0))
        assert c["daemon"].status == "ok" and "listening on /ip4/127.0.0.1/tcp/" in c["addresses"].detail
        assert c["bootstrap"].status == "warn" and "1 of 2" in c["bootstrap"].detail, c["bootstrap"]
        assert c["reachability"].status == "ok" and "reachable at /ip4/127.0.0.1/tcp/" in c["reachability"].detail
        assert c["clock"].status == "ok", c["clock"]
        assert c["lan"].status in ("ok", "warn")  # warn where multicast does not work on loopback
        if c["lan"].status == "ok":
            assert "1 node(s) of 'doctor-test'" in c["lan"].detail, c["lan"]

        # the command itself, with the config from a file, as JSON
        from sapo_core.config import NodeConfig, save_config

        save_config(
            NodeConfig().replace(
                **{
                    "swarm.host_maddrs": ["/ip4/127.0.0.1/tcp/0"],
                    "swarm.initial_peers": [host.join_address],
                    "swarm.lan_discovery": False,
                }
            ),
            tmp_path / "node.toml",
        )
        from sapo_core.cli import main

        assert (
            main(["doctor", "--network", "--json", "--config", str(tmp_path / "node.toml"), "--step-timeout", "5"]) == 0
        )
        report = json.loads(capsys.readouterr().out)
        assert report["ok"] and {c["name"] for c in report["checks"]} == {
            "daemon",
            "addresses",
            "bootstrap",
            "reachability",
            "clock",
            "lan",
        }
    finally:
        host.close()
