"""The swarm's page: what the observer counts in a live loopback swarm, what the page shows of
it in a real browser (Debian's headless Chromium), and that nothing a peer sends breaks it."""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from html.parser import HTMLParser
from pathlib import Path

import pytest

from sapo_core.config import SwarmConfig, TaskConfig
from sapo_core.swarm.observer import SwarmObserver
from sapo_core.swarm.page import render_page
from sapo_core.swarm.source import open_swarm
from sapo_core.tasks import TaskSet

from helpers import altered_groups, honest_groups, scrape_metrics

pytestmark = pytest.mark.network

WINDOW = 20.0


def _cfg(**changes) -> SwarmConfig:
    base = dict(
        swarm_name="page-test",
        window_seconds=WINDOW,
        host_maddrs=["/ip4/127.0.0.1/tcp/0"],
        lan_discovery=False,
        gather_timeout=20.0,
        publish_timeout=20.0,
    )
    return SwarmConfig(**{**base, **changes})


def _swarm_of_three(tmp_path: Path, initial_peers: list[str]):
    """Nodes b (honest, says its model and held-out figure), c (honest, trains on two of b's
    groups: its record's receipts name them) and d (sends questions it changed)."""
    tasks = TaskSet(TaskConfig(), seed=0)
    nodes = []
    for name in "bcd":
        nodes.append(open_swarm(_cfg(initial_peers=initial_peers), tasks, tmp_path / name))
        initial_peers = initial_peers or [nodes[0].join_address]
    b, c, d = nodes
    b.describe(model="smollm2-135m-instruct", held_out=(40, 0.3125, 384))
    b.publish(3, honest_groups(seed=7, round=3))
    c.publish(5, honest_groups(seed=8, round=5, n=2), receipts=[(b.node_id, 3, 0), (b.node_id, 3, 2)])
    d.publish(2, altered_groups(honest_groups(seed=9, round=2)))
    return nodes


def test_the_observer_counts_nodes_groups_receipts_and_refusals(tmp_path):
    seed = open_swarm(_cfg(), TaskSet(TaskConfig(), seed=0), tmp_path / "seed")
    nodes = []
    try:
        nodes = _swarm_of_three(tmp_path, [seed.join_address])
        b, c, d = nodes
        about = {"swarm": "page-test", "name": seed.node_name, "peer_id": seed.node_id, "join": [], "version": "x"}
        history = tmp_path / "history.json"
        observer = SwarmObserver(seed.dht, seed.keyspace, TaskSet(TaskConfig(), seed=0), about, history_path=history)
        for _ in range(20):  # values replicate within a second or two on loopback
            observer.poll()
            s = observer.status()
            if s["nodes_recent"] == 3 and s["board"] and s["groups_refused"] and s["groups_verified"] >= 5:
                break
            time.sleep(1)
        rows = {n["peer_id"]: n for n in s["nodes"]}
        assert set(rows) == {b.node_id, c.node_id, d.node_id}
        assert rows[b.node_id]["model"] == "smollm2-135m-instruct"
        said = {"after_round": 40, "solve_rate": 0.312, "completions": 384, "self_reported": True}
        assert rows[b.node_id]["held_out"] == said
        assert rows[c.node_id]["held_out"] is None and rows[c.node_id]["last_round"] == 5
        assert (rows[b.node_id]["groups_verified"], rows[c.node_id]["groups_verified"]) == (3, 2)
        assert rows[d.node_id]["groups_verified"] == 0 and rows[d.node_id]["groups_refused"] == 3
        assert s["groups_refused"] == {"text_mismatch": 3} and s["junk_reasons"] == ["text_mismatch"]
        assert s["board"] == [{"name": b.node_name, "peer_id": b.node_id, "trained_on": 2, "by_nodes": 1}]
        assert s["models"] == {"smollm2-135m-instruct": 1, "unknown": 2}
        assert s["history"][-1]["nodes"] == 3 and s["history"][-1]["rounds"] == 3
        assert (s["rounds_last_hour"], s["groups_last_hour"]) == (3, 8)
        assert s["history"][-1]["held_out_median"] == 0.312
        # a round seen twice counts once; a restart keeps the closed hours (none yet: an empty list)
        polls = s["polls"]
        observer.poll()
        assert observer.status()["history"][-1]["rounds"] == 3 and observer.status()["polls"] == polls + 1
        observer._save_history()
        assert json.loads(history.read_text()) == []
        page = render_page(observer.status())
        assert b.node_name in page and "text_mismatch" in page and "self-reported" in page
    finally:
        for n in [*nodes, seed]:
            n.close()


def test_a_broken_history_file_starts_a_new_one_and_hostile_strings_are_escaped(tmp_path):
    history = tmp_path / "history.json"
    good = {"hour": 2, "nodes": 1, "rounds": 1, "groups": 1, "verified": 0, "refused": 0}
    history.write_text(json.dumps([{"hour": 1, "nodes": "many"}, good])[:-1])  # cut short: not JSON

    class NoDht:
        def get_many(self, keys, timeout):
            return {}

    from sapo_core.swarm.keys import KeySpace

    about = {"swarm": "<script>alert(1)</script>", "name": "n", "peer_id": "p", "join": ["<b>"], "version": "1"}
    observer = SwarmObserver(NoDht(), KeySpace("s", WINDOW, 4), None, about, history_path=history, dht_clock=time.time)
    observer.poll()
    assert observer.status()["history"][:-1] == []  # unreadable: a new history, the seed goes on
    page = render_page(observer.status())
    assert "<script>" not in page and "&lt;script&gt;" in page and "<b>" not in page


# --- the page in a real browser ------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _chromium() -> str:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        if shutil.which(name):
            return shutil.which(name)
    pytest.skip("no Chromium here (Debian: apt-get install chromium; .ci/run installs it)")


def _browser(url: str, *args: str) -> subprocess.CompletedProcess:
    cmd = [_chromium(), "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--hide-scrollbars"]
    cmd += [*args, url]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120)


class _Figures(HTMLParser):
    """The figures the page shows: elements with an id, and per table row its data-figure cells."""

    def __init__(self) -> None:
        super().__init__()
        self.by_id: dict[str, str] = {}
        self.rows: dict[str, dict[str, dict[str, str]]] = {}  # table id -> peer -> figure -> text
        self._stack: list[tuple[str, str | None]] = []  # (what is being read, into which key)
        self._table = self._peer = None

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag == "table":
            self._table = a.get("id")
        if tag == "tr" and "data-peer" in a:
            self._peer = a["data-peer"]
            self.rows.setdefault(self._table, {})[self._peer] = {}
        if "data-figure" in a and self._peer:
            self._stack.append(("cell", a["data-figure"]))
        elif "id" in a:
            self._stack.append(("id", a["id"]))
        else:
            self._stack.append(("", None))

    def handle_endtag(self, tag):
        if self._stack:
            self._stack.pop()

    def handle_data(self, data):
        for kind, key in reversed(self._stack):
            if kind == "cell":
                cell = self.rows[self._table][self._peer]
                cell[key] = (cell.get(key, "") + data).strip()
                return
            if kind == "id":
                self.by_id[key] = (self.by_id.get(key, "") + data).strip()
                return


_NO_PROXY = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # loopback, whatever the environment says


def _get(url: str) -> dict:
    with _NO_PROXY.open(url, timeout=10) as r:
        return json.loads(r.read())


@pytest.mark.slow
def test_a_seed_serves_its_swarm_s_page_and_a_browser_shows_the_swarm(tmp_path):
    port, page_port = _free_port(), _free_port()
    cmd = [sys.executable, "-m", "sapo_core.cli", "seed", "--data-dir", str(tmp_path / "seed"), "--host", "127.0.0.1"]
    cmd += ["--port", str(port), "--page-port", str(page_port), "--set", "swarm.swarm_name=page-test"]
    cmd += ["--set", f"swarm.window_seconds={WINDOW:g}"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines, address, nodes = [], None, []
    try:
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline and address is None:
            line = proc.stdout.readline()
            lines.append(line)
            if "join with: --initial-peers " in line:
                address = line.split("--initial-peers ", 1)[1].strip()
        assert address, "".join(lines)
        url = f"http://127.0.0.1:{page_port}/"
        nodes = _swarm_of_three(tmp_path, [address])
        b, c, d = nodes
        s = {}
        for _ in range(60):  # the seed polls every quarter window (5 s)
            s = _get(url + "api/status")
            if s["nodes_recent"] == 3 and s["board"] and s["groups_verified"] >= 5 and s["groups_refused"]:
                break
            time.sleep(1)
        assert s["nodes_recent"] == 3 and s["groups_verified"] == 5, s
        assert s["swarm"] == "page-test" and s["join"] == [address]

        done = _browser(url, "--dump-dom")
        assert done.returncode == 0, done.stderr[-2000:]
        seen = _Figures()
        seen.feed(done.stdout)
        s = _get(url + "api/status")  # the figures of the same poll (nothing new is published)
        assert seen.by_id["swarm-name"] == "page-test"
        assert seen.by_id["nodes-recent"] == "3"
        assert seen.by_id["groups-verified"] == str(s["groups_verified"]) == "5"
        assert seen.by_id["groups-refused"] == "3"
        assert (seen.by_id["rounds-last-hour"], seen.by_id["groups-last-hour"]) == ("3", "8")
        table = seen.rows["nodes"]
        assert set(table) == {b.node_id, c.node_id, d.node_id}
        assert table[b.node_id]["held_out"].startswith("0.312") and "after round 40" in table[b.node_id]["held_out"]
        assert table[c.node_id]["last_round"] == "5" and table[d.node_id]["groups_refused"] == "3"
        assert seen.rows["board"] == {b.node_id: {"trained_on": "2", "by_nodes": "1"}}
        assert "smollm2-135m-instruct × 1" in seen.by_id["models"]

        # how a person sees it: light and dark at 1000 px, and a phone's width
        shots = tmp_path / "shots"
        shots.mkdir()
        for name, args in [
            ("light", ["--window-size=1000,1500"]),
            ("dark", ["--window-size=1000,1500", "--force-dark-mode", "--blink-settings=preferredColorScheme=0"]),
            ("phone", ["--window-size=390,1600"]),
        ]:
            done = _browser(url, f"--screenshot={shots / name}.png", *args)
            assert done.returncode == 0 and (shots / f"{name}.png").stat().st_size > 10_000, done.stderr[-2000:]
        from PIL import Image

        corner = {n: Image.open(shots / f"{n}.png").convert("RGB").getpixel((5, 5)) for n in ("light", "dark")}
        assert sum(corner["light"]) > 600 and sum(corner["dark"]) < 150, corner  # the page follows the system
        keep = os.environ.get("SAPO_KEEP_SHOTS")  # a directory to look at them in
        if keep and Path(keep).is_dir():
            for f in shots.iterdir():
                shutil.copy(f, Path(keep) / f.name)
        with pytest.raises(urllib.error.HTTPError) as e:
            _NO_PROXY.open(url + "anything-else", timeout=10)
        assert e.value.code == 404
    finally:
        for n in nodes:
            n.close()
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=30)
    assert proc.returncode == 0, "".join(lines) + out
    assert (tmp_path / "seed" / "page-history.json").exists()  # saved as it stopped


def test_random_bytes_in_a_status_never_break_the_page():
    rng = random.Random(0)
    s = {
        "swarm": "x",
        "name": "n",
        "version": "v",
        "generated": 0.0,
        "watching_since": 0.0,
        "window_seconds": 300.0,
        "nodes_recent": 0,
        "rounds_last_hour": 0,
        "groups_last_hour": 0,
        "groups_verified": 0,
        "groups_refused": {},
        "models": {},
        "versions": {},
        "nodes": [],
        "nodes_not_shown": 0,
        "board": [],
        "history": [],
    }
    for _ in range(50):
        junk = "".join(chr(rng.randrange(1, 0x2FFF)) for _ in range(40))
        page = render_page({**s, "swarm": junk, "models": {junk: 1}, "groups_refused": {junk: 2}})
        assert "<script" not in page.lower().replace("&lt;script", "")


def test_a_node_that_opts_in_serves_the_page_of_what_it_sees(tmp_path):
    port = _free_port()
    host = open_swarm(_cfg(page_port=port), TaskSet(TaskConfig(), seed=0), tmp_path / "host")
    peer = None
    try:
        assert host.page is not None and host.page.url == f"http://127.0.0.1:{port}/"
        peer = open_swarm(_cfg(initial_peers=[host.join_address]), TaskSet(TaskConfig(), seed=0), tmp_path / "peer")
        peer.describe(model="smollm2-135m-instruct")
        peer.publish(4, honest_groups(seed=3, round=4))
        host.page.observer.poll()  # as its thread does every quarter window
        for _ in range(10):
            s = _get(host.page.url + "api/status")
            if s["groups_verified"] == 3:
                break
            host.page.observer.poll()
            time.sleep(1)
        assert [n["name"] for n in s["nodes"]] == [peer.node_name] and s["groups_verified"] == 3
        assert s["swarm"] == "page-test" and s["join"] == [host.join_address]
        # its /metrics: the swarm as it sees it, and its own rounds and held-out figure
        host.publish(1, honest_groups(seed=4, round=1))
        time.sleep(0.5)  # a round of half a second
        host.publish(2, honest_groups(seed=4, round=2))
        host.describe(held_out=(2, 0.25, 64))
        _, got, text = scrape_metrics(host.page.url + "metrics")
        one = {name: series.get(()) for name, series in got.items()}
        assert one["sapo_node_round"] == 2 and 0.5 <= one["sapo_node_round_seconds"] < 30
        assert (one["sapo_node_held_out_solve_rate"], one["sapo_node_held_out_round"]) == (0.25, 2)
        assert one["sapo_swarm_groups_verified_total"] == 3 and peer.node_id not in text
    finally:
        for n in (peer, host):
            if n is not None:
                n.close()
    assert (tmp_path / "host" / "page-history.json").exists()
    with pytest.raises(OSError):  # closed with the node
        _get(f"http://127.0.0.1:{port}/api/status")
