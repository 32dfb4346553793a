"""`sapo-bench soak`: its slope and interval (hand-computed), the process accounting, and a
short real soak (a node process, churning peers on loopback) that ends with its summary line
and leaves no process behind."""

from __future__ import annotations

import math
import os
import random
import re
import subprocess
import sys

import pytest

from sapo_core.bench.soak import slope, tree_usage


def test_slope_per_100_rounds_with_its_interval():
    # y = 2 + 0.05 x exactly: 5 per 100 rounds, no spread
    b, lo, hi = slope([1, 2, 3, 4], [2.05, 2.10, 2.15, 2.20])
    assert b == pytest.approx(5.0) and lo == pytest.approx(5.0) and hi == pytest.approx(5.0)
    # x = 0..4, y = 0, 1, 0, 1, 0: slope 0; residual variance 1.2/3 = 0.4, Sxx = 10,
    # half-width 1.96 * sqrt(0.04) = 0.392 per round, 39.2 per 100
    b, lo, hi = slope([0, 1, 2, 3, 4], [0, 1, 0, 1, 0])
    assert b == pytest.approx(0.0, abs=1e-12) and hi == pytest.approx(39.2) and lo == pytest.approx(-39.2)
    assert all(math.isnan(v) for v in slope([1, 2], [1, 2]))
    assert all(math.isnan(v) for v in slope([3, 3, 3], [1, 2, 3]))


def test_tree_usage_counts_a_process_and_its_children():
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        seen: set[int] = set()
        usage = tree_usage(os.getpid(), seen)
        assert child.pid in seen and os.getpid() in seen
        assert usage["rss_mb"] > usage["worker_rss_mb"] > 5 and usage["open_files"] >= 3 and usage["threads"] >= 2
        assert usage["p2pd"] == 0
    finally:
        child.kill()
        child.wait()


@pytest.mark.slow
@pytest.mark.network
@pytest.mark.node_process
def test_a_short_soak_runs_a_real_node_beside_churning_peers(tmp_path):
    cmd = [sys.executable, "-m", "sapo_core.bench.cli", "soak", "--rounds", "4", "--peers", "3"]
    cmd += ["--churn-every", "5", "--threads", "1", "--out", str(tmp_path), "--seed", str(random.randrange(100))]
    cmd += ["--pauses", "2"]  # the controls after warm-up (round 1) and after round 4
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    last = done.stdout.strip().splitlines()[-1]
    assert last.startswith("soak: 4 rounds in ") and "RSS " in last and "round time " in last, last
    assert re.search(r", pause p95 [\d.]+ -> [\d.]+ s, throttle 50% -> \d+ / \d+%, ", last), last  # start, end
    # the app's window followed the node in its own process (app/soakwatch.py): its RSS and redraw time
    assert re.search(r", app RSS \d+ -> \d+ MB, redraw p95 [\d.]+ -> [\d.]+ ms$", last), last
    assert "processes left after stop: 0" in done.stdout
    rows = (tmp_path / "soak.csv").read_text().splitlines()
    assert rows[0].startswith("round,wall_s,round_s,rss_mb") and len(rows) == 5
    first = dict(zip(rows[0].split(","), rows[1].split(",")))
    assert float(first["rss_mb"]) > 300 and int(float(first["p2pd"])) == 1 and float(first["disk_mb"]) > 0
    final = dict(zip(rows[0].split(","), rows[-1].split(",")))
    assert 50 < float(final["app_rss_mb"]) < 1000 and 0 < float(final["app_redraw_ms"]) < 10_000


def test_the_summary_of_a_csv_names_each_slope_and_the_worst(tmp_path, capsys):
    from sapo_core.bench.soak import FIELDS, from_csv

    path = tmp_path / "soak.csv"
    with open(path, "w") as f:
        f.write(",".join(FIELDS) + "\n")
        for r in range(1, 101):  # RSS +2 MB a round after a warm-up jump; disk +0.01 MB a round
            rss = 2000 + 2 * r + (300 if r > 10 else 0)
            f.write(f"{r},{r * 36.0},5.0,{rss},{rss - 500},37,26,1,{100 + 0.01 * r},{0.1 + 0.001 * r},6,0\n")
    line = from_csv(str(path), warmup=10)
    assert line.startswith("soak: 100 rounds in 1.00 h, RSS +200.0 MB/100 rounds (95% CI +200.0..+200.0)"), line
    assert "peak 2.50 GB" in line and "disk +1.00 MB/100 rounds" in line and "round time +0.00 s/100" in line
    assert "store +1.0 kB a round" in capsys.readouterr().out
    assert "app RSS" not in line  # a CSV from before the window was followed


def test_the_summary_compares_the_windows_first_and_last_tenth(tmp_path):
    from sapo_core.bench.soak import FIELDS, from_csv

    path = tmp_path / "soak.csv"
    with open(path, "w") as f:
        f.write(",".join(FIELDS) + "\n")
        for r in range(1, 111):  # after 10 warm-up rounds, 100 rounds: tenths are rounds 11-20 and 101-110
            app_rss = 180 + 0.1 * r  # median of 11..20: 181.55; of 101..110: 190.55
            redraw = 5.0 + (r % 10) / 10 + (2.0 if r > 100 else 0.0)  # p95 of each tenth: its largest
            f.write(f"{r},{r * 36.0},5.0,2000,1500,37,26,1,100,0.1,6,0,{app_rss},{redraw}\n")
    line = from_csv(str(path), warmup=10)
    assert line.endswith(", app RSS 182 -> 191 MB, redraw p95 5.9 -> 7.9 ms"), line


def test_peers_echo_the_nodes_groups_without_its_ids_and_logprobs():
    from sapo_core.bench.soak import echo
    from sapo_core.rollouts import Completion, Group, Question, QuestionId

    q = Question(QuestionId("basic_arithmetic", "ab12", 0, 3), "What is 2 + 3?", "5")
    node = Group(q, [Completion("2 + 3 = 5.\nAnswer: 5", [1, 2], [-0.1, -0.2], True, 1.0), Completion("Answer: 6")])
    node.source, node.round, node.index = "QmNode", 7, 1
    peer = Group(q, [Completion("Answer: 5", reward=1.0)], source="QmPeer")
    (got,) = echo([node, peer], {"QmPeer"})
    assert got.question is q and got.source == "local" and (got.round, got.index) == (0, 0)
    assert [(c.text, c.reward, c.finished) for c in got.completions] == [
        ("2 + 3 = 5.\nAnswer: 5", 1.0, True),
        ("Answer: 6", 0.0, True),
    ]
    assert all(c.token_ids is None and c.sample_logprobs is None for c in got.completions)
