"""`sapo-bench swarm --peers N`: publish and gather latency and bytes per round on loopback.

N light peers (no model) in this process, each a full swarm node: its own identity, p2pd
daemon, DHT thread, validators and verifier. Every round each peer publishes a record of
realistic size (by default 4 groups × 8 completions × ~128 tokens of text, right and wrong
answers mixed so some groups carry signal), then each peer gathers J groups, which means
reading the index, fetching up to `records_per_gather` records and verifying every group
(regenerating its question with ReasoningGYM and re-scoring it). Peers act one at a time in
a shuffled order, so a latency is one node's call while all the others serve the DHT; the
first round warms caches and is not counted.

The comparison is the unsharded scheme of the reference code (one key per round holding
every node's record): the summary names how many bytes such a gather would read here,
against what ours read. That scheme fails outright at 32 nodes with large records
(docs/environment.md, 'hivemind: 4 MiB per key').

Ends with one line: `swarm: peers N, gather p50 … p95 …, publish p95 …, … KB/round/node`.
"""

from __future__ import annotations

import argparse
import dataclasses
import random
import statistics
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from sapo_core.config import SwarmConfig, TaskConfig
from sapo_core.control import vocabulary as K
from sapo_core.rollouts import Completion, Group

_WORDS = (
    "first",
    "we",
    "add",
    "the",
    "numbers",
    "then",
    "subtract",
    "carry",
    "one",
    "so",
    "result",
    "is",
    "step",
    "next",
    "check",
    "value",
    "total",
    "equals",
    "because",
    "multiply",
    "divide",
    "remainder",
    "digit",
    "sum",
    "difference",
    "therefore",
    "and",
    "of",
    "to",
    "this",
)


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--peers", type=int, default=8, help="light peers on loopback")
    parser.add_argument("--rounds", type=int, default=5, help="measured rounds (after one warm-up round)")
    parser.add_argument("--groups", type=int, default=4, help="groups each peer publishes per round (I)")
    parser.add_argument("--completions", type=int, default=8, help="completions per group (G)")
    parser.add_argument("--chars", type=int, default=560, help="characters per completion (~128 tokens)")
    parser.add_argument("--want", type=int, default=4, help="groups each peer gathers per round (J)")
    parser.add_argument("--shards", type=int, default=SwarmConfig.shards)
    parser.add_argument("--records-per-gather", type=int, default=SwarmConfig.records_per_gather)
    parser.add_argument("--seed", type=int, default=0)


def _completion(rng: random.Random, chars: int, answer: str) -> str:
    words: list[str] = []
    while sum(len(w) + 1 for w in words) < chars - 20 - len(answer):
        words.append(rng.choice(_WORDS))
    return " ".join(words) + f".\nAnswer: {answer}"


def _groups(tasks, round: int, args: argparse.Namespace, rng: random.Random) -> list[Group]:
    out = []
    for q in tasks.sample_questions(round, args.groups):
        right = rng.randint(0, args.completions)  # 0 or G right: a group without signal
        texts = [_completion(rng, args.chars, q.answer if k < right else "0.123") for k in range(args.completions)]
        rewards = tasks.score(q, texts)
        out.append(Group(q, [Completion(text=t, reward=r) for t, r in zip(texts, rewards)], round=round))
    return out


def _pct(xs: list[float], p: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, max(0, round(p / 100 * (len(xs) - 1))))] if xs else float("nan")


def _open_peers(cfg: SwarmConfig, n: int, tmp: Path) -> list:
    """n light peers on loopback: the first hosts the swarm, the others join through it."""
    from sapo_core.swarm.source import open_swarm
    from sapo_core.tasks import TaskSet

    verifier = TaskSet(TaskConfig(), seed=0)  # regenerates any peer's questions; its seed is irrelevant
    host = open_swarm(cfg, verifier, tmp / "peer0")
    joined = dataclasses.replace(cfg, initial_peers=[host.join_address])
    with ThreadPoolExecutor(4) as pool:  # p2pd start-ups overlap; each node is still its own
        rest = list(pool.map(lambda i: open_swarm(joined, verifier, tmp / f"peer{i}"), range(1, n)))
    return [host] + rest


def _round_line(r: int, s: list[dict]) -> str:
    """One measured round, from every peer's swarm figures."""
    zero = sum(x.get(K.swarm_rejected("zero_advantage"), 0) for x in s)
    return (
        f"round {r}: gather p50 {_pct([x[K.SWARM_GATHER_S] for x in s], 50):.3f} s "
        f"max {max(x[K.SWARM_GATHER_S] for x in s):.3f} s, publish max "
        f"{max(x[K.SWARM_PUBLISH_S] for x in s):.3f} s, records read/peer "
        f"{statistics.mean(x[K.SWARM_RECORDS] for x in s):.1f}, groups used/peer "
        f"{statistics.mean(x[K.SWARM_USED] for x in s):.1f}, rejected "
        f"{sum(x[K.SWARM_REJECTED] for x in s) - zero:.0f} (+{zero:.0f} zero-advantage)"
    )


def run(args: argparse.Namespace) -> int:
    from sapo_core.tasks import TaskSet

    if args.peers < 2:
        raise SystemExit("--peers must be at least 2")
    rng = random.Random(args.seed)
    tmp = Path(tempfile.mkdtemp(prefix="sapo-bench-swarm-"))
    cfg = SwarmConfig(
        swarm_name=f"bench-{rng.randrange(1 << 30):x}",
        host_maddrs=["/ip4/127.0.0.1/tcp/0"],
        window_seconds=600.0,
        shards=args.shards,
        shards_read=min(2, args.shards),
        records_per_gather=args.records_per_gather,
    )
    started = time.perf_counter()
    peers = _open_peers(cfg, args.peers, tmp)
    print(
        f"{args.peers} peers up in {time.perf_counter() - started:.1f} s; "
        f"records of {args.groups} groups × {args.completions} completions × {args.chars} chars"
    )
    own_tasks = [TaskSet(TaskConfig(), seed=1000 + i) for i in range(args.peers)]
    gather_s: list[float] = []
    publish_s: list[float] = []
    bytes_in: list[float] = []
    bytes_out: list[float] = []
    record_bytes: list[float] = []
    used: list[float] = []
    parts: dict[str, list[float]] = {}
    try:
        for r in range(args.rounds + 1):
            order = list(range(args.peers))
            rng.shuffle(order)
            for i in order:
                peers[i].publish(r, _groups(own_tasks[i], r, args, rng))
            stats = {}
            for i in order:
                peers[i].gather(r, args.want, random.Random(rng.random()))
                stats[i] = peers[i].stats()
            if r == 0:
                continue  # warm-up: ReasoningGYM builds each peer's datasets on first use
            s = list(stats.values())
            gather_s += [x[K.SWARM_GATHER_S] for x in s]
            publish_s += [x[K.SWARM_PUBLISH_S] for x in s]
            bytes_in += [x[K.SWARM_BYTES_IN] for x in s]
            bytes_out += [x[K.SWARM_BYTES_OUT] for x in s]
            used += [x[K.SWARM_USED] for x in s]
            record_bytes += [x[K.SWARM_BYTES_OUT] for x in s]
            for part, key in (("index", K.SWARM_INDEX_S), ("fetch", K.SWARM_FETCH_S), ("verify", K.SWARM_VERIFY_S)):
                parts.setdefault(part, []).extend(x.get(key, 0.0) for x in s)
            print(_round_line(r, s))
    finally:
        with ThreadPoolExecutor(4) as pool:
            list(pool.map(lambda p: p.close(), peers))
    kb_in, kb_out = statistics.mean(bytes_in) / 1024, statistics.mean(bytes_out) / 1024
    unsharded = (args.peers - 1) * statistics.mean(record_bytes) / 1024
    print(
        f"bytes per round per node: in {kb_in:.0f} KB (index + records), out {kb_out:.0f} KB "
        f"(stored on {cfg.replicas} replicas); an unsharded gather would read {unsharded:.0f} KB"
    )
    print("gather p50 by step: " + ", ".join(f"{k} {_pct(v, 50):.3f} s" for k, v in parts.items()))
    print(
        f"swarm: peers {args.peers}, gather p50 {_pct(gather_s, 50):.2f} s p95 {_pct(gather_s, 95):.2f} s, "
        f"publish p95 {_pct(publish_s, 95):.2f} s, {kb_in + kb_out:.0f} KB/round/node, "
        f"{statistics.mean(used):.1f}/{args.want} groups gathered"
    )
    return 0
