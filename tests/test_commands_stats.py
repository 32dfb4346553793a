"""`sapo-node stats`: the contribution and receipt figures from a run store, as text and JSON."""

from __future__ import annotations

import json
import time

from sapo_core.cli import main
from sapo_core.store import STORE_NAME, RunStore


def test_stats_prints_what_was_given_and_what_came_back(tmp_path, capsys):
    s = RunStore(tmp_path / STORE_NAME)
    t = time.time() - 300
    for r in (1, 2):
        s.record_round(
            r,
            {
                "groups/local": 2.0,
                "round/group_size": 4.0,
                "cpu/seconds": 3600.0,
                "groups/trained": 2.0,
                "groups/external": 1.0,
                "swarm/published": 2.0,
            },
            started=t + 100 * r,
            ended=t + 100 * r + 60,
        )
    s.record_receipts(2, [("peerA", 1, 0), ("peerB", 1, 1), ("peerB", 1, 0)])
    s.close()
    assert main(["stats", "--run-dir", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "CPU given: 2.00 CPU-hours" in out
    assert "completions sampled: 16" in out
    assert "your groups were trained on 3 times by 2 peers this week" in out
    assert "held-out: no evaluation yet" in out
    assert main(["stats", "--run-dir", str(tmp_path), "--json"]) == 0
    body = json.loads(capsys.readouterr().out)
    assert body["receipts_week"] == {"receipts": 3, "peers": 2, "groups": 2}
    assert body["contribution"]["groups_published"] == 4 and body["held_out"] is None


def test_stats_without_a_run_says_so(tmp_path, capsys):
    assert main(["stats", "--run-dir", str(tmp_path / "none")]) == 2
    assert "has the node finished a round?" in capsys.readouterr().err
