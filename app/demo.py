"""Made-up round figures with the node's keys, for `sapo-bench gui` and for screenshots when
there is no real run to show. Never shown as real: screenshots taken with them say
"demo data" in the window title.

The shapes follow what a node records (`Node._round_figures` and the swarm's `stats`):
reward rising slowly with noise, three tasks taking turns, about half the groups from peers,
the swarm's counters with an occasional rejection, curriculum levels that rise now and then,
a held-out evaluation every 20 rounds (evaluation.py's `eval/*` keys) and the CPU time of each
round. The store's rounds end now and lie over the last days like a volunteer's week (sessions of a few
hours, short pauses, nights and a day off: the dashboard's "by day" plot has something to show),
with one peer's receipt per round.
"""

from __future__ import annotations

import json
import math
import random
import sqlite3
import time
from collections.abc import Iterator
from pathlib import Path

from sapo_core.control import protocol as P
from sapo_core.control import vocabulary as K
from sapo_core.store import STORE_NAME, RunStore

TASKS = ("basic_arithmetic", "fraction_simplification", "calendar_arithmetic")
DEMO_PEERS = ("brave-otter-3f1a", "calm-heron-9b20", "quick-lynx-07c4", "mild-panda-5e88")


def demo_metrics(r: int, rng: random.Random, swarm: bool = True) -> dict[str, float]:
    progress = 1 - math.exp(-r / 400)
    m: dict[str, float] = {}
    rewards = []
    for k, task in enumerate(TASKS):
        if (r + k) % 3 == 2:
            continue  # two of the three tasks each round
        acc = min(1.0, max(0.0, 0.05 + 0.35 * progress * (1 - 0.3 * k) + rng.gauss(0, 0.08)))
        m[K.accuracy_of(task)], m[K.reward_of(task)] = acc, acc
        rewards.append(acc)
    mean = sum(rewards) / len(rewards)
    m.update(
        {
            K.REWARD_MEAN: mean,
            K.REWARD_SUM: 2 * mean,
            K.ACCURACY_MEAN: mean,
            K.GROUPS_LOCAL: 2.0,
            K.GROUPS_EXTERNAL: 2.0 if swarm else 0.0,
            K.GROUPS_EXTERNAL_SHARE: (0.5 + rng.gauss(0, 0.05)) if swarm else 0.0,
            K.GROUPS_TRAINED: 3.0,
            K.SAMPLER_TOK_PER_S: 190 + rng.gauss(0, 12),
            K.TRAIN_TOK_PER_S: 185 + rng.gauss(0, 10),
            K.LOSS_POLICY: rng.gauss(0, 0.05),
        }
    )
    times = {
        K.SAMPLE: 38.0,
        K.SCORE: 0.2,
        K.SHARE: 0.4,
        K.GATHER: 1.2,
        K.LIKELIHOOD: 6.0,
        K.PREPARE: 0.1,
        K.UPDATE: 52.0,
        K.SYNC: 1.5,
        K.SAVE: 0.6,
    }
    for phase, t in times.items():
        if swarm or phase not in (K.SHARE, K.GATHER, K.LIKELIHOOD):
            m[K.time_of(phase)] = max(0.0, t * (1 + rng.gauss(0, 0.1)))
    m[K.TIME_ROUND] = sum(v for k, v in m.items() if k.startswith(K.TIME_PREFIX))
    m[K.CPU_SECONDS] = 1.8 * m[K.TIME_ROUND]
    for k, task in enumerate(TASKS):
        m[K.curriculum_level_of(task)] = float(min(3, r // (180 + 90 * k)))
    if r == 1 or r % 20 == 0:
        now = 0.10 + 0.17 * progress + rng.gauss(0, 0.015)
        m.update(
            {
                K.EVAL_SOLVE_RATE: now,
                K.EVAL_SOLVE_RATE_BASE: 0.10,
                K.EVAL_GAIN: now - 0.10,
                K.EVAL_GAIN_CI_LOW: now - 0.17,
                K.EVAL_GAIN_CI_HIGH: now - 0.03,
                K.EVAL_QUESTIONS: 96.0,
            }
        )
    if swarm:
        rejected = 1.0 if rng.random() < 0.15 else 0.0
        m.update(
            {
                K.SWARM_PUBLISHED: 2.0,
                K.SWARM_RECEIVED: 6.0,
                K.SWARM_ACCEPTED: 6.0 - rejected,
                K.SWARM_USED: 2.0,
                K.SWARM_REJECTED: rejected,
                K.SWARM_PEERS: 3.0,
                K.SWARM_DHT_PEERS: 4.0,
                K.SWARM_IGNORED_PEERS: 0.0,
            }
        )
        if rejected:
            m[K.swarm_rejected("zero_advantage" if rng.random() < 0.8 else "answer_mismatch")] = rejected
    return m


def demo_rows(n: int, seed: int = 0, swarm: bool = True) -> Iterator[tuple[int, dict[str, float]]]:
    rng = random.Random(seed)
    for r in range(1, n + 1):
        yield r, demo_metrics(r, rng, swarm)


# (hours running, hours paused before that), from now backwards: sessions of a few hours with short
# pauses, nights off, and a whole day off; repeated for long histories
DEMO_WEEK = (
    (2.0, 0.6),
    (1.5, 17.0),
    (2.5, 0.4),
    (1.2, 1.5),
    (1.0, 21.0),
    (3.0, 0.25),
    (0.8, 44.0),
    (2.2, 0.8),
    (1.6, 22.0),
    (2.4, 0.5),
    (1.0, 20.0),
)


def demo_spans(durations: list[float], end: float, seed: int = 0) -> list[tuple[float, float]]:
    """(started, ended) of rounds of the given durations laid out like a volunteer's week
    (`DEMO_WEEK`, each length give or take 15 %), the last round ending at `end`."""
    rng = random.Random(seed + 1)  # not the figures' generator: the rounds' figures stay as they were
    spans: list[tuple[float, float]] = []
    t, k = end, 0
    running_left = DEMO_WEEK[0][0] * 3600
    for d in reversed(durations):
        if running_left <= 0:  # the session began here: before it, a pause
            t -= DEMO_WEEK[k % len(DEMO_WEEK)][1] * 3600 * rng.uniform(0.85, 1.15)
            k += 1
            running_left = DEMO_WEEK[k % len(DEMO_WEEK)][0] * 3600 * rng.uniform(0.85, 1.15)
        spans.append((t - d, t))
        wait = rng.uniform(3.0, 8.0)  # saving, the schedule's check, the next round's set-up
        t -= d + wait
        running_left -= d + wait
    return spans[::-1]


def write_demo_store(run_dir: Path, n: int, seed: int = 0) -> Path:
    """A run store holding n made-up rounds (what the node would have written), the last ending now,
    spread over days like a volunteer's week (`DEMO_WEEK`), and one peer's receipt per round."""
    path = run_dir / STORE_NAME
    RunStore(path).close()  # the schema, as the node creates it
    rows = list(demo_rows(n, seed))
    end = time.time()
    spans = demo_spans([m[K.TIME_ROUND] for _, m in rows], end, seed)
    # RunStore.record_round commits (and fsyncs) each row: 10,000 of them take minutes. One transaction
    # over the same table takes a fraction of a second.
    db = sqlite3.connect(path)
    try:
        with db:
            db.executemany(
                "INSERT OR REPLACE INTO rounds (round, started, ended, metrics) VALUES (?, ?, ?, ?)",
                ((r, started, ended, json.dumps(m, sort_keys=True)) for (r, m), (started, ended) in zip(rows, spans)),
            )
            # a receipt naming round r comes with a peer's next record, seen at the end of our next round
            db.executemany(
                "INSERT OR IGNORE INTO receipts (peer, our_round, grp, seen_round, seen) VALUES (?, ?, ?, ?, ?)",
                (
                    (f"peer-{i % 7}", n - i, i % 2, min(n, n - i + 1), spans[min(n, n - i + 1) - 1][1])
                    for i in range(min(n, 2000))
                ),
            )
    finally:
        db.close()
    return path


def demo_try_result() -> dict:
    """What `sapo-node try --json` prints, for the Try it tab's screenshot."""
    return {
        "question": "Calculate 48 + 17.",
        "dataset": "basic_arithmetic",
        "reference": "65",
        "round": 600,
        "seconds": 9.4,
        "base": {
            "text": "48 + 17 is 48 plus 17. Adding them gives the sum of the two numbers.\nAnswer: 55",
            "reward": 0.0,
        },
        "trained": {"text": "48 + 17: 40 + 10 = 50 and 8 + 7 = 15, so 50 + 15 = 65.\nAnswer: 65", "reward": 1.0},
    }


def demo_node_events(rounds: int) -> list[P.Message]:
    """What a node in a swarm says about itself (identity, a state, gather progress naming peers)."""
    peer = "QmYyQSo1c1Ym7orWxLYvCrM2EmxFTANf8wXmmE7DWjhx5N"
    out: list[P.Message] = [
        P.Hello(protocol=P.PROTOCOL_VERSION, pid=4242, python="3.11.7", package_version="0.1.0"),
        P.NodeInfo(
            model_id="smollm2-135m-instruct",
            sampler="llamacpp",
            run_dir="(demo)",
            next_round=rounds + 1,
            peer_id=peer,
            node_name="keen-falcon-2c7d",
            visible_maddrs=[f"/ip4/192.168.1.20/tcp/31337/p2p/{peer}"],
            join_address=f"/ip4/192.168.1.20/tcp/31337/p2p/{peer}",
        ),
        P.State(state=P.RUNNING, reason="", round=rounds + 1),
    ]
    for i, name in enumerate(DEMO_PEERS):
        out.append(P.Progress(round=rounds - i % 2, phase=K.GATHER, done=i, total=len(DEMO_PEERS), info={"peer": name}))
    out.append(P.Progress(round=rounds + 1, phase=K.SAMPLE, done=5, total=16))
    out.append(
        P.Heartbeat(t=0.0, state=P.RUNNING, round=rounds + 1, cpu_seconds=100.0, rss_bytes=1_450_000_000, throttle=0.5)
    )
    return out


__all__ = [
    "DEMO_WEEK",
    "demo_spans",
    "demo_try_result",
    "demo_rows",
    "demo_metrics",
    "write_demo_store",
    "demo_node_events",
    "TASKS",
    "DEMO_PEERS",
]
