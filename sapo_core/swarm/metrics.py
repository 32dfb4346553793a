"""`/metrics` beside the swarm's page: its figures in Prometheus' text format, for operators.

A seed (and a node with `swarm.page_port`) serves them next to `/api/status` (page.py). The
collector reads, at each scrape, what the page's observer built at its last poll (observer.py),
the host's DHT, and, on a node, its own round time and held-out figure; prometheus_client writes
the text. docs/deploy.md lists the series; deploy/grafana-sapo-swarm.json is a dashboard of them.

Label sets are bounded: no peer id, name, model or version a peer announces becomes a label (a
swarm of thousands would make thousands of series, and a hostile peer could make more). Reasons
are labels only from the fixed sets our validators use; anything else is counted as `other`.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from prometheus_client import CollectorRegistry, ProcessCollector, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, InfoMetricFamily, Metric

from sapo_core.swarm.verify import JUNK_REASONS, USELESS_REASONS

# The text format generate_latest writes, as every Prometheus reads it (prometheus_client's own
# server answers so unless a scraper asks for more)
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
# Why a group is refused (verify.py, tasks.UnknownQuestion), and why a record or index entry does
# not decode (records.RecordError, observer.py)
GROUP_REASONS = JUNK_REASONS | USELESS_REASONS | {"over_deadline", "duplicates", "zero_advantage"}
GROUP_REASONS |= {"unknown_task", "unknown_config"}
DECODE_REASONS = frozenset(
    {"malformed", "oversized", "wrong_version", "wrong_swarm", "wrong_key", "verify_error", "index_wrong_key"}
)
DECODE_REASONS |= {f"index_{r}" for r in ("malformed", "oversized", "wrong_version", "wrong_swarm")}
# Why the DHT's validators refuse to store a value (validation.py)
DHT_REASONS = DECODE_REASONS | {"unsigned", "bad_subkey", "bad_expiration", "bad_signature", "wrong_owner"}
CACHE_SECONDS = 1.0  # a scrape at most rebuilds the text once a second, however many ask

OwnFigures = Callable[[], Mapping[str, Any]]  # a node's {"round", "round_seconds", "held_out"}


def bounded(counts: Mapping[str, int], known: frozenset[str] | set[str]) -> dict[str, int]:
    """Counts by reason with every unknown reason folded into `other`."""
    out: dict[str, int] = {}
    for reason, n in counts.items():
        key = reason if reason in known else "other"
        out[key] = out.get(key, 0) + int(n)
    return out


class SwarmCollector:
    """The page's figures as metric families (a prometheus_client collector)."""

    def __init__(self, observer: Any, dht: Any = None, own: OwnFigures | None = None) -> None:
        """`observer`: the page's SwarmObserver; `dht`: the host's SwarmDHT (peers, refusals);
        `own`: the host node's own figures (None on a seed, which trains nothing)."""
        self.observer, self.dht, self.own = observer, dht, own

    def describe(self) -> list[Metric]:
        return []  # the families depend on the swarm: described by collecting

    def collect(self) -> Iterator[Metric]:
        s = self.observer.status()
        if not s:
            return
        about = {"swarm": str(s.get("swarm", "")), "version": str(s.get("version", ""))}
        yield InfoMetricFamily("sapo_swarm", "The swarm served, and this host's SAPO Swarm version", about)
        yield _gauge("sapo_swarm_window_seconds", "Length of the swarm's window", s["window_seconds"])
        yield _gauge("sapo_swarm_nodes_recent", "Nodes seen in the last two windows", s["nodes_recent"])
        yield _gauge("sapo_swarm_nodes_known", "Nodes remembered since the page started", s.get("nodes_known", 0))
        yield _gauge("sapo_swarm_rounds_per_window", "Rounds first seen in the last window", s["rounds_last_window"])
        yield _gauge("sapo_swarm_groups_per_window", "Groups of those rounds", s["groups_last_window"])
        yield _counter("sapo_swarm_rounds_seen", "Rounds of nodes seen since the page started", s["rounds_seen"])
        yield _counter("sapo_swarm_groups_seen", "Groups announced in those rounds", s["groups_seen"])
        yield _counter("sapo_swarm_groups_verified", "Groups the page verified as trainable", s["groups_verified"])
        refused = bounded(s["groups_refused"], GROUP_REASONS)
        yield _by_reason("sapo_swarm_groups_refused", "Groups the page refused, by reason", refused)
        undecodable = bounded(s.get("undecodable", {}), DECODE_REASONS)
        yield _by_reason("sapo_swarm_undecodable", "Records and index entries that did not decode", undecodable)
        hour = (s.get("history") or [{}])[-1]
        if hour.get("held_out_median") is not None:
            yield _gauge(
                "sapo_swarm_held_out_median_self_reported",
                "Median of the held-out solve rates nodes announced this hour (self-reported)",
                hour["held_out_median"],
            )
        yield _counter("sapo_page_polls", "Polls of the swarm by the page", s.get("polls", 0))
        yield _gauge("sapo_page_last_poll_timestamp_seconds", "When the page last polled the swarm", s["generated"])
        yield from self._host()

    def _host(self) -> Iterator[Metric]:
        """The host: its DHT, its process tree (with p2pd and a node's sampler), its own rounds."""
        from sapo_core.cpu import tree_usage

        if self.dht is not None:
            yield _gauge("sapo_dht_peers", "Peers in this host's DHT routing table", self.dht.num_peers())
            refused = bounded(self.dht.dht_rejections.snapshot(), DHT_REASONS)
            yield _by_reason("sapo_dht_values_refused", "Values this host's DHT refused to store, by reason", refused)
        cpu, rss = tree_usage()
        yield _counter("sapo_process_tree_cpu_seconds", "CPU seconds of this process and its children", cpu)
        yield _gauge("sapo_process_tree_resident_memory_bytes", "Resident memory of this process and its children", rss)
        own = dict(self.own()) if self.own is not None else {}
        if own.get("round") is not None:
            yield _gauge("sapo_node_round", "The node's current round", own["round"])
        if own.get("round_seconds") is not None:
            yield _gauge("sapo_node_round_seconds", "Wall time of the node's last round", own["round_seconds"])
        if own.get("held_out") is not None:
            after_round, rate, _n = own["held_out"]
            yield _gauge("sapo_node_held_out_solve_rate", "The node's last held-out solve rate", rate)
            yield _gauge("sapo_node_held_out_round", "The round after which it was measured", after_round)


def _gauge(name: str, doc: str, value: float) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, doc, value=float(value))


def _counter(name: str, doc: str, value: float) -> CounterMetricFamily:
    return CounterMetricFamily(name, doc, value=float(value))


def _by_reason(name: str, doc: str, counts: Mapping[str, int]) -> CounterMetricFamily:
    family = CounterMetricFamily(name, doc, labels=["reason"])
    for reason, n in sorted(counts.items()):
        family.add_metric([reason], float(n))
    return family


class PageMetrics:
    """The text a scrape gets: the collector's families and this process's own (prometheus_client's
    ProcessCollector: `process_cpu_seconds_total`, `process_resident_memory_bytes`, …), rebuilt at
    most once every CACHE_SECONDS."""

    def __init__(self, observer: Any, dht: Any = None, own: OwnFigures | None = None) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.registry.register(SwarmCollector(observer, dht, own))
        ProcessCollector(registry=self.registry)
        self._lock = threading.Lock()
        self._cache: tuple[float, bytes] = (-CACHE_SECONDS, b"")

    def text(self) -> bytes:
        with self._lock:
            now = time.monotonic()
            if now - self._cache[0] >= CACHE_SECONDS:
                self._cache = (now, generate_latest(self.registry))
            return self._cache[1]


__all__ = ["CONTENT_TYPE", "PageMetrics", "SwarmCollector", "bounded"]
