"""The page's /metrics (swarm/metrics.py) without a network: the text prometheus_client's own
parser reads, reasons folded into a bounded label set whatever peers send, a node's own figures,
the host's process, and the example Grafana dashboard naming only series that exist. A live
seed is scraped in tests/test_seed.py, a node's page in tests/test_swarm_page.py."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import psutil
import pytest
from prometheus_client.parser import text_string_to_metric_families

from sapo_core.swarm.keys import KeySpace
from sapo_core.swarm.metrics import PageMetrics, bounded
from sapo_core.swarm.observer import SwarmObserver

DASHBOARD = Path(__file__).resolve().parent.parent / "deploy" / "grafana-sapo-swarm.json"


class NoDht:
    """A DHT that holds nothing (the observer's reads come back empty)."""

    def get_many(self, keys, timeout):
        return {}


def scrape(text: bytes) -> dict[str, dict[tuple, float]]:
    """{sample name: {labels as sorted tuple: value}}, as Prometheus reads the text."""
    out: dict[str, dict[tuple, float]] = {}
    for family in text_string_to_metric_families(text.decode()):
        for s in family.samples:
            out.setdefault(s.name, {})[tuple(sorted(s.labels.items()))] = s.value
    return out


def _observer() -> SwarmObserver:
    about = {"swarm": "metrics-test", "name": "n", "peer_id": "QmHost", "join": [], "version": "9.9.9"}
    return SwarmObserver(NoDht(), KeySpace("metrics-test", 20.0, 4), None, about, dht_clock=time.time)


@pytest.mark.parametrize(
    "counts, expected",
    [
        ({}, {}),
        ({"text_mismatch": 3}, {"text_mismatch": 3}),
        ({"text_mismatch": 3, "QmSomePeer": 2, "<b>": 1}, {"text_mismatch": 3, "other": 3}),
    ],
)
def test_unknown_reasons_fold_into_other(counts, expected):
    assert bounded(counts, {"text_mismatch"}) == expected


def test_metrics_parse_with_bounded_labels_and_the_node_s_own_figures():
    observer = _observer()
    hostile = {f"QmPeer{i}": 1 for i in range(500)}  # a reason we never produce, 500 ways
    observer.refused.update({"text_mismatch": 3, "zero_advantage": 2, **hostile})
    observer.undecodable.update({"index_malformed": 4, "<script>": 1})
    observer.verified = 7
    observer.poll()
    own = {"round": 12, "round_seconds": 93.5, "held_out": (10, 0.3125, 384)}
    metrics = PageMetrics(observer, own=lambda: own)
    # this process's resident memory before the scrape: the tree's figure, read later in the same
    # scrape, counts it (prometheus_client's own reading comes after ours, and a growing process
    # made it 40 KB larger than the tree's in one CI run)
    rss_before = psutil.Process().memory_info().rss
    text = metrics.text()
    got = scrape(text)
    refused = {dict(k)["reason"]: v for k, v in got["sapo_swarm_groups_refused_total"].items()}
    assert refused == {"text_mismatch": 3, "zero_advantage": 2, "other": 500}
    undecodable = {dict(k)["reason"]: v for k, v in got["sapo_swarm_undecodable_total"].items()}
    assert undecodable == {"index_malformed": 4, "other": 1}
    assert got["sapo_swarm_groups_verified_total"][()] == 7
    assert got["sapo_swarm_info"] == {(("swarm", "metrics-test"), ("version", "9.9.9")): 1.0}
    assert got["sapo_swarm_window_seconds"][()] == 20.0 and got["sapo_page_polls_total"][()] == 1
    assert got["sapo_node_round"][()] == 12 and got["sapo_node_round_seconds"][()] == 93.5
    assert got["sapo_node_held_out_solve_rate"][()] == 0.3125 and got["sapo_node_held_out_round"][()] == 10
    assert got["process_resident_memory_bytes"][()] > 10e6 and got["process_cpu_seconds_total"][()] > 0
    assert got["sapo_process_tree_resident_memory_bytes"][()] >= rss_before
    labels = {name for series in got.values() for key in series for name, _ in key}
    assert labels <= {"reason", "swarm", "version"} and "QmHost" not in text.decode()
    assert metrics.text() is text  # a second scrape within a second is the same text, not rebuilt


def test_a_seed_serves_no_node_figures():
    observer = _observer()
    observer.poll()
    got = scrape(PageMetrics(observer).text())
    assert "sapo_swarm_nodes_recent" in got and not any(name.startswith("sapo_node_") for name in got)


def test_the_grafana_dashboard_queries_series_the_page_serves():
    dashboard = json.loads(DASHBOARD.read_text())
    exprs = [t["expr"] for p in dashboard["panels"] for t in p["targets"]]
    named = {m for e in exprs for m in re.findall(r"\b((?:sapo|process)_[a-z_]+)\b", e)}
    observer = _observer()
    observer.refused.update({"text_mismatch": 1})
    observer.poll()
    own = {"round": 1, "round_seconds": 1.0, "held_out": (1, 0.5, 8)}
    served = set(scrape(PageMetrics(observer, own=lambda: own).text()))
    # and what only a live swarm has (tests/test_seed.py scrapes them)
    served |= {"sapo_dht_peers", "sapo_dht_values_refused_total", "sapo_swarm_held_out_median_self_reported"}
    assert named and named <= served, named - served
    assert len(dashboard["panels"]) >= 8 and dashboard["templating"]["list"][0]["type"] == "datasource"
