"""What the volunteer gave and what came back, read from a real run store (contributions.py)."""

from __future__ import annotations

import pytest

from sapo_core.contributions import (
    contribution_totals,
    daily_activity,
    from_peers_words,
    held_out_summary,
    receipt_totals,
    start_of_today,
)
from sapo_core.store import RunStore


def _row(s, r, started, secs, **m):
    base = {
        "groups/local": 4.0,
        "round/group_size": 8.0,
        "groups/trained": 3.0,
        "groups/external": 1.0,
        "swarm/published": 4.0,
        "swarm/peers": float(r),
        "tokens/sampled": 100.0,
        "cpu/seconds": 1800.0,
    }
    s.record_round(r, {**base, **m}, started=started, ended=started + secs)


def test_contribution_totals_today_and_this_week(tmp_path):
    s = RunStore(tmp_path / "r.sqlite")
    now = start_of_today(1_800_000_000.0) + 12 * 3600  # noon
    _row(s, 1, now - 10 * 86400, 60)  # older than the week
    _row(s, 2, now - 3 * 86400, 60)  # this week
    _row(s, 3, now - 7200, 120)  # today
    _row(s, 4, now - 3600, 30, **{"groups/external": 0.0, "swarm/published": 0.0})
    _row(s, 5, now - 1800, 30, **{"swarm/adopt_guided": 1.0, "cpu/seconds": 0.0})  # a peer's answer guided
    t = contribution_totals(s, now=now)
    assert t["rounds"] == 5 and t["rounds_week"] == 4 and t["rounds_today"] == 3
    assert t["cpu_hours"] == pytest.approx(2.0) and t["cpu_hours_today"] == pytest.approx(1.0)
    assert t["seconds_today"] == 180 and t["seconds_week"] == 240
    assert t["completions"] == 5 * 32 and t["groups_published"] == 16
    assert (t["groups_own"], t["groups_peers"], t["peer_guided"]) == (2 + 2 + 2 + 3 + 2, 4, 1)
    assert t["peers_max"] == 5
    assert contribution_totals(s, until_round=2, now=now)["rounds"] == 2
    assert [round(e - st) for st, e, _ in daily_activity(s, days=7, now=now)] == [60, 120, 30, 30]
    assert from_peers_words(t) == (
        "4 peers' groups trained here; on 1 question none of this model's answers was right "
        "and a peer's right one guided it"
    )
    assert from_peers_words(contribution_totals(s, until_round=3, now=now)) == "3 peers' groups trained here"
    assert from_peers_words(contribution_totals(s, until_round=0, now=now)) == "no peer's group trained here yet"


def test_receipts_count_once_per_triple_and_skip_garbage_and_ignored_peers(tmp_path):
    s = RunStore(tmp_path / "r.sqlite")
    assert s.record_receipts(5, [("peerA", 4, 0), ("peerA", 4, 1), ("peerB", 4, 0)]) == 3
    # seen again in a later gather: still one receipt each; garbage from peers is dropped
    assert s.record_receipts(6, [("peerA", 4, 0), ("peerC", 5, 2), (None, 1, 1), ("x", "y", 1), (1, 2)]) == 1
    assert receipt_totals(s) == {"receipts": 4, "peers": 3, "groups": 3}
    assert receipt_totals(s, ignored={"peerA"}) == {"receipts": 2, "peers": 2, "groups": 2}
    assert receipt_totals(s, since=s.receipts()[-1][4] + 1) == {"receipts": 0, "peers": 0, "groups": 0}
    s.close()
    ro = RunStore(tmp_path / "r.sqlite", readonly=True)
    assert len(ro.receipts()) == 4


def test_held_out_sentence_from_the_eval_figures(tmp_path):
    s = RunStore(tmp_path / "r.sqlite")
    s.record_round(1, {"reward/mean": 0.1}, 0.0)
    assert held_out_summary(s) is None
    s.record_round(2, {"eval/solve_rate": 0.12, "eval/solve_rate_base": 0.10, "eval/gain": 0.02}, 0.0)
    s.record_round(3, {"reward/mean": 0.2}, 0.0)
    s.record_round(
        4,
        {
            "eval/solve_rate": 0.27,
            "eval/solve_rate_base": 0.10,
            "eval/gain": 0.17,
            "eval/gain_ci_low": 0.10,
            "eval/gain_ci_high": 0.24,
        },
        0.0,
    )
    assert held_out_summary(s).sentence() == "held-out: 0.10 at start -> 0.27 now (+0.17, ±0.07)"
    assert held_out_summary(s, until_round=3).sentence() == "held-out: 0.10 at start -> 0.12 now (+0.02)"
