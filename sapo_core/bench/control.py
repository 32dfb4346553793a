"""`sapo-bench control`: how fast a node gets out of the way, and how well it keeps to its share.

One real node process (by default the embedded model, the sampler the node picks, no swarm),
driven through `NodeClient` as the desktop app drives it:

- Pause latency: `--pauses` times, at a random moment inside a round (sampling or training),
  the time from sending "pause now" to the node's `paused` event; p50/p95 against the goal
  of 2 s, with the phase each pause hit.
- Throttle: the node's CPU use (user + system time of the node process and its children —
  the llama.cpp sampler runs in one — from psutil, so other jobs on a shared machine do not
  count) over whole rounds, alternating unthrottled rounds and rounds at 75 %, 50 % or 25 %,
  `--repeats` times each. The measured share of a throttle is its round's CPU rate (CPU
  seconds per wall second, from one round's end to the next) over the mean of the two
  unthrottled rounds beside it (other jobs coming and going cancel out), averaged; goal:
  within ±10 points of the setting. Whole rounds, not fixed windows: a round's phases use
  the CPU unevenly (sampling in the child, training in the node, saving), and a window that
  caught more of one phase throttled than unthrottled measured the phases, not the throttle
  (docs/calibration.md, 'Threads and throttle').

Ends with one line: `control: pause p50 … s p95 … s; throttle 25% -> …%, 50% -> …%, 75% -> …%`.
"""

from __future__ import annotations

import argparse
import random
import statistics
import tempfile
import time
from pathlib import Path

import psutil

from sapo_core.bench.settings import add_set_argument, node_config
from sapo_core.config import NodeConfig
from sapo_core.control import protocol as P
from sapo_core.control.client import NodeClient
from sapo_core.control.vocabulary import SAMPLE, UPDATE
from sapo_core.cpu import tree_cpu_seconds

INSIDE_ROUND = (SAMPLE, UPDATE)


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", default="auto", help="model id, 'auto' (the node's pick) or 'tiny-random'")
    parser.add_argument("--sampler", default="auto", choices=["auto", "llamacpp", "transformers"])
    parser.add_argument("--pauses", type=int, default=12, help="pauses measured")
    parser.add_argument(
        "--repeats",
        type=int,
        default=2,
        help="times each throttle is measured over a round between two unthrottled rounds",
    )
    parser.add_argument("--threads", type=int, default=0, help="node threads (0 = the node's own choice)")
    parser.add_argument("--run-dir", default="", help="run directory (default: a temporary one)")
    parser.add_argument("--seed", type=int, default=0)
    add_set_argument(parser)


def _config(args: argparse.Namespace, run_dir: Path) -> NodeConfig:
    # kl_beta > 0 trains every group, so every round has a training phase for pauses to land in
    return node_config(
        {
            "model.name": args.model,
            "sampler.backend": args.sampler,
            "swarm.enabled": False,
            "round.local_groups": 2,
            "round.external_groups": 0,
            "sampler.group_size": 4,
            "sampler.max_new_tokens": 96,
            "round.auto_scale": False,
            "train.kl_beta": 0.01,
            "sampler.threads": args.threads,
            "run_dir": str(run_dir),
            "seed": args.seed,
        },
        args.set,
    )


def percentile(xs: list[float], q: float) -> float:
    """The q-quantile, interpolated between ranks (the benchmarks' one definition of p50 and p95)."""
    xs = sorted(xs)
    k = (len(xs) - 1) * q
    lo, hi = int(k), min(int(k) + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (k - lo)


def _measure_pauses(client: NodeClient, n: int, rng: random.Random) -> list[tuple[float, float, str]]:
    """(acknowledged, paused, phase) per pause: seconds from the command to `pausing` (the command
    reached the node) and to `paused` (the round is held)."""
    out = []
    for i in range(n):
        ev = client.wait_for(lambda e: isinstance(e, P.Progress) and e.phase in INSIDE_ROUND, 600)
        time.sleep(rng.uniform(0.0, 2.0))  # a random moment, not always the start of a phase
        phase = ev.phase
        while (late := client.next_event(0)) is not None:  # the phase we are in now
            if isinstance(late, P.Progress):
                phase = late.phase
        asked = time.monotonic()
        client.pause()
        acked = None
        while True:
            state = client.wait_state(P.PAUSING, P.PAUSED, timeout=120)
            acked = acked if acked is not None else time.monotonic() - asked
            if state.state == P.PAUSED:
                break
        latency = time.monotonic() - asked
        out.append((acked, latency, phase))
        print(
            f"  pause {i + 1:>2}: {latency:6.3f} s  (command reached the node in {acked:.3f} s; "
            f"round {state.round}, {phase})",
            flush=True,
        )
        client.resume()
        client.wait_state(P.RUNNING, timeout=60)
    return out


def _throttled_round(client: NodeClient, share: float) -> float:
    """CPU seconds per wall second of the node (and its sampler child) over one whole round at
    `share`: the throttle is set as the previous round ends, the CPU read at the two ends."""
    client.set_throttle(share)
    c0, t0 = tree_cpu_seconds(client.pid), time.monotonic()
    client.wait_for(lambda e: isinstance(e, P.RoundDone), 1800)
    return (tree_cpu_seconds(client.pid) - c0) / (time.monotonic() - t0)


def _measure_throttle(
    client: NodeClient, repeats: int, shares: tuple[float, ...] = (0.75, 0.5, 0.25)
) -> dict[float, float]:
    """Measured share per throttle. Whole rounds alternate unthrottled and throttled (100, 75, 100,
    50, 100, 25, 100, ...), `repeats` times: each throttled round's CPU rate is divided by the mean
    of the two unthrottled rounds beside it, so that other jobs coming and going cancel out; the
    ratios of a share are averaged."""
    ratios: dict[float, list[float]] = {s: [] for s in shares}
    client.wait_for(lambda e: isinstance(e, P.RoundDone), 1800)  # start at a round's end
    before = _throttled_round(client, 1.0)
    for k in range(repeats):
        for s in shares:
            rate = _throttled_round(client, s)
            after = _throttled_round(client, 1.0)
            ratios[s].append(rate / ((before + after) / 2))
            before = after
        print(
            f"  repeat {k + 1}: "
            + ", ".join(f"{100 * s:.0f}% -> {100 * ratios[s][-1]:.0f}%" for s in shares)
            + f"  (unthrottled {after:.2f} cores, load average {psutil.getloadavg()[0]:.1f})",
            flush=True,
        )
    return {s: 100 * statistics.mean(r) for s, r in ratios.items()}


def run(args: argparse.Namespace) -> int:
    rng = random.Random(args.seed)
    tmp = tempfile.TemporaryDirectory(prefix="sapo-bench-control-")
    run_dir = Path(args.run_dir) if args.run_dir else Path(tmp.name) / "run"
    client = NodeClient(heartbeat_timeout=300)
    print(
        f"machine: {psutil.cpu_count(logical=False)} cores, load average "
        f"{psutil.getloadavg()[0]:.1f} (other jobs share it)",
        flush=True,
    )
    try:
        client.start(_config(args, run_dir))
        info = client.wait_for(lambda e: isinstance(e, P.NodeInfo), 900)
        print(f"node: {info.model_id}, sampler {info.sampler}", flush=True)
        client.wait_for(lambda e: isinstance(e, P.RoundDone), 900)  # warm: one full round first
        pauses = _measure_pauses(client, args.pauses, rng)
        measured = _measure_throttle(client, args.repeats)
    finally:
        client.stop(timeout=120)
        tmp.cleanup()
    acks, lat = [a for a, _, _ in pauses], [x for _, x, _ in pauses]
    by_phase = {ph: statistics.median([x for _, x, p in pauses if p == ph]) for ph in {p for _, _, p in pauses}}
    print(
        "pause median by phase: "
        + ", ".join(f"{p} {v:.2f} s" for p, v in sorted(by_phase.items()))
        + f"; command delivery p50 {percentile(acks, 0.5):.3f} s p95 {percentile(acks, 0.95):.3f} s"
    )
    worst = max(abs(measured[s] - 100 * s) for s in measured)
    print(
        f"goals: pause p95 <= 2 s {'met' if percentile(lat, 0.95) <= 2 else 'MISSED'}, "
        f"throttle within ±10 points {'met' if worst <= 10 else 'MISSED'} (worst {worst:.0f}); "
        f"load average now {psutil.getloadavg()[0]:.1f} on {psutil.cpu_count()} CPUs"
    )
    print(
        f"control: pause p50 {percentile(lat, 0.5):.2f} s p95 {percentile(lat, 0.95):.2f} s; throttle "
        + ", ".join(f"{100 * s:.0f}% -> {measured[s]:.0f}%" for s in sorted(measured))
    )
    return 0


__all__ = ["configure", "run", "percentile"]
