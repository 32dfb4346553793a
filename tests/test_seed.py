"""`sapo-node seed` as its operator runs it: a real process on loopback that two real nodes join
through, which keeps its identity and address across a restart and stops cleanly on SIGTERM, and
whose /metrics Prometheus' own parser reads, agreeing with its /api/status."""

from __future__ import annotations

import json
import random
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from sapo_core.config import SwarmConfig, TaskConfig
from sapo_core.swarm.source import open_swarm
from sapo_core.tasks import TaskSet

from helpers import altered_groups, honest_groups, scrape_metrics

pytestmark = pytest.mark.network

SWARM = ["--set", "swarm.swarm_name=seed-test", "--set", "swarm.window_seconds=60"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _start(data: Path, port: int, page_port: int = 0) -> tuple[subprocess.Popen, str, list[str]]:
    """The seed's process and the address it says to join with (read from its stdout)."""
    cmd = [sys.executable, "-m", "sapo_core.cli", "seed", "--data-dir", str(data), "--host", "127.0.0.1"]
    cmd += ["--port", str(port), "--page-port", str(page_port), "--status-every", "1", *SWARM]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines: list[str] = []
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        lines.append(line)
        if "join with: --initial-peers " in line:
            return proc, line.split("--initial-peers ", 1)[1].strip(), lines
    proc.kill()
    raise AssertionError("the seed never said how to join:\n" + "".join(lines))


def _stop(proc: subprocess.Popen, lines: list[str]) -> str:
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=30)
    text = "".join(lines) + out
    assert proc.returncode == 0, text
    assert "seed stopped" in text
    return text


def test_nodes_join_a_swarm_through_the_seed_and_it_restarts_as_itself(tmp_path):
    data, port = tmp_path / "seed", _free_port()
    proc, address, lines = _start(data, port)
    nodes = []
    try:
        info = json.loads((data / "seed.json").read_text())
        assert address == f"/ip4/127.0.0.1/tcp/{port}/p2p/{info['peer_id']}" and info["swarm"] == "seed-test"
        # hivemind's DHT without torch (swarm/leandht.py): no libtorch mapped into the seed
        assert "libtorch" not in Path(f"/proc/{proc.pid}/maps").read_text()
        cfg = _node_config(address)
        tasks = TaskSet(TaskConfig(), seed=0)
        nodes = [open_swarm(cfg, tasks, tmp_path / name) for name in ("a", "b")]
        nodes[0].publish(1, honest_groups(seed=7, round=1))
        got = []
        for _ in range(10):  # b may need a moment to learn of a through the seed
            got = nodes[1].gather(1, 3, random.Random(0))
            if got:
                break
            time.sleep(1)
        assert {g.source for g in got} == {nodes[0].node_id} and len(got) == 3
    finally:
        for n in nodes:
            n.close()
        text = _stop(proc, lines)
    assert "peers; values refused so far: none; memory" in text  # its status line
    # the same identity and the same address after a restart: what every node's list holds
    again, address_again, lines = _start(data, port)
    try:
        assert address_again == address
    finally:
        _stop(again, lines)


def _node_config(address: str) -> SwarmConfig:
    return SwarmConfig(
        swarm_name="seed-test",
        window_seconds=60.0,
        host_maddrs=["/ip4/127.0.0.1/tcp/0"],
        initial_peers=[address],
        lan_discovery=False,
        gather_timeout=20.0,
        publish_timeout=20.0,
    )


def test_a_live_seed_s_metrics_parse_and_agree_with_its_status(tmp_path):
    import urllib.request

    data, port, page_port = tmp_path / "seed", _free_port(), _free_port()
    proc, address, lines = _start(data, port, page_port)
    url, nodes = f"http://127.0.0.1:{page_port}/", []
    try:
        tasks = TaskSet(TaskConfig(), seed=0)
        nodes = [open_swarm(_node_config(address), tasks, tmp_path / name) for name in ("honest", "liar")]
        honest, liar = nodes
        honest.describe(model="smollm2-135m-instruct", held_out=(40, 0.3125, 384))
        honest.publish(3, honest_groups(seed=7, round=3))
        liar.publish(2, altered_groups(honest_groups(seed=9, round=2)))
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        for _ in range(90):  # the seed polls every quarter window (15 s)
            with opener.open(url + "api/status", timeout=10) as r:
                status = json.loads(r.read())
            if status["groups_verified"] == 3 and status["groups_refused"]:
                break
            time.sleep(1)
        kind, got, text = scrape_metrics(url + "metrics")
        assert kind.startswith("text/plain; version=0.0.4")
        one = {name: series.get((), None) for name, series in got.items()}
        assert one["sapo_swarm_groups_verified_total"] == status["groups_verified"] == 3
        refused = {dict(k)["reason"]: v for k, v in got["sapo_swarm_groups_refused_total"].items()}
        assert refused == status["groups_refused"] == {"text_mismatch": 3}
        assert one["sapo_swarm_nodes_recent"] == status["nodes_recent"] == 2
        assert (one["sapo_swarm_rounds_seen_total"], one["sapo_swarm_groups_seen_total"]) == (2, 6)
        assert (one["sapo_swarm_rounds_per_window"], one["sapo_swarm_groups_per_window"]) == (2, 6)
        assert one["sapo_swarm_held_out_median_self_reported"] == 0.312 and one["sapo_swarm_window_seconds"] == 60
        assert one["sapo_dht_peers"] >= 2
        assert one["sapo_dht_records_held"] >= 1  # the two nodes' records and index entries, replicated to it
        # the seed and its p2pd: more than the Python process alone
        assert one["sapo_process_tree_resident_memory_bytes"] > one["process_resident_memory_bytes"] > 20e6
        assert one["sapo_process_tree_cpu_seconds_total"] >= one["process_cpu_seconds_total"] > 0
        assert not any(name.startswith("sapo_node_") for name in got)  # a seed trains nothing
        for node in nodes:  # no peer as a label, and nothing a peer said about itself
            assert node.node_id not in text and node.node_name not in text and "smollm2" not in text
    finally:
        for n in nodes:
            n.close()
        _stop(proc, lines)


@pytest.mark.parametrize(
    "args, says",
    [
        (["--port", "0"], "--port 0: must be 1..65535"),
        (["--announce", "not a host"], "neither an IP address nor a DNS name"),
        (["--set", "swarm.window_seconds=-1"], "bad config"),
    ],
)
def test_a_bad_setting_stops_the_seed_with_what_to_change(tmp_path, args, says):
    cmd = [sys.executable, "-m", "sapo_core.cli", "seed", "--data-dir", str(tmp_path), *args]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and says in done.stderr, done.stderr
    assert not (tmp_path / "identity.key").exists()  # nothing started, nothing written
