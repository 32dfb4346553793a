"""`sapo-bench contention`: one node round quiet, then beside one and two busy programs.

A volunteer's computer is never idle. One real node process (the embedded model, training
alone, `--local 2 --group-size 4` as docs/environment.md, 'OpenMP threads under contention',
measured, auto-scaling off) runs
rounds, driven through `NodeClient` as the app drives it. Between rounds it is paused while
the benchmark starts 0, 1 or 2 busy programs (plain Python spinning in a loop, each counting
its iterations), measures their solo speed for `--solo` seconds (the node holds still, and
its thread governor sees the new load meanwhile), then resumes the node for one round, and
holds it again to measure their solo speed a second time (the mean of the two is "solo"):

- how much longer the quiet round's work took beside them (fair share beside one busy program on
  two cores is 2x; goal <= 2.5x). Rounds differ in work (each draws new questions: answers of 5
  or 60 tokens, 1 or 2 groups with signal), so a round's seconds are not compared with another's:
  each phase's rate is (sampled tokens per second, trained tokens per second), and the slowdown is
  the quiet round's sampling and update seconds re-timed at the contended rates, over the quiet
  round's (a warm-up round runs first, so no rate includes loading caches);
- how fast the busy programs ran during the round against their solo speed (goal: they keep
  >= 45 %).

Setups: `default` (the node's own threads: control.leave_cores and the governor),
`all-cores` (leave_cores = 0: the governor alone decides), `fixed` (sampler.threads = N,
nothing adapts) and `spinning` (fixed, with OpenMP threads that spin at barriers,
OMP_WAIT_POLICY=ACTIVE: what the node did before it made them wait passively). The machine's
load average is printed with every case: on a shared machine the background is itself a
contention case.

Ends with one line: `contention: beside 1 busy process 2.1x the quiet round's work, beside 2
3.4x; the busy process kept 52 % of its speed; fixed 2 threads: 14.8x`.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import psutil

from sapo_core.bench.settings import add_set_argument, node_config
from sapo_core.config import NodeConfig
from sapo_core.control import protocol as P
from sapo_core.control import vocabulary as K
from sapo_core.control.client import NodeClient

EMBEDDED = "smollm2-135m-instruct"


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--setups",
        default="default,fixed",
        help="comma-separated: default, all-cores, fixed (sampler.threads = --fixed), spinning "
        "(fixed, and OpenMP threads that spin at barriers: OMP_WAIT_POLICY=ACTIVE)",
    )
    parser.add_argument("--fixed", type=int, default=2, help="threads of the 'fixed' setup")
    parser.add_argument("--busy", default="0,1,2", help="busy programs per case, comma-separated (0 = quiet)")
    parser.add_argument("--solo", type=float, default=5.0, help="seconds the busy programs run alone first")
    parser.add_argument("--local", type=int, default=2, help="round.local_groups")
    parser.add_argument("--group-size", type=int, default=4)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--model", default=EMBEDDED)
    parser.add_argument("--seed", type=int, default=0)
    add_set_argument(parser)


def _spin(counter, stop) -> None:  # pragma: no cover - runs in a spawned child
    n = 0
    while not stop.is_set():
        for _ in range(100_000):
            n += 1
        with counter.get_lock():
            counter.value += 100_000


@dataclass
class Busy:
    """k spinning processes and their shared counters."""

    k: int
    ctx: mp.context.BaseContext = field(default_factory=lambda: mp.get_context("spawn"))

    def __post_init__(self) -> None:
        self.stop = self.ctx.Event()
        self.counters = [self.ctx.Value("d", 0.0) for _ in range(self.k)]
        self.procs = [self.ctx.Process(target=_spin, args=(c, self.stop), daemon=True) for c in self.counters]
        for p in self.procs:
            p.start()

    def count(self) -> float:
        return sum(c.value for c in self.counters)

    def rate(self, seconds: float) -> float:
        c0, t0 = self.count(), time.monotonic()
        time.sleep(seconds)
        return (self.count() - c0) / (time.monotonic() - t0)

    def close(self) -> None:
        self.stop.set()
        for p in self.procs:
            p.join(5)
            if p.is_alive():
                p.kill()


def _config(args: argparse.Namespace, setup: str, run_dir: Path) -> NodeConfig:
    changes = {
        "model.name": args.model,
        "swarm.enabled": False,
        "round.external_groups": 0,
        "round.local_groups": args.local,
        "sampler.group_size": args.group_size,
        "sampler.max_new_tokens": args.max_new_tokens,
        "round.auto_scale": False,
        # every group trains (a KL term gives even a flat group a gradient): rounds that
        # train 0, 1 or 2 groups by chance would compare chance, not contention
        "train.kl_beta": 0.01,
        "run_dir": str(run_dir),
        "seed": args.seed,
    }
    if setup == "all-cores":
        changes["control.leave_cores"] = 0
    elif setup in ("fixed", "spinning"):
        changes["sampler.threads"] = args.fixed
    elif setup != "default":
        raise SystemExit(f"unknown setup {setup!r}: default, all-cores or fixed")
    return node_config(changes, args.set)


def _load() -> float:
    return psutil.getloadavg()[0]


def _run_setup(args: argparse.Namespace, setup: str, cases: list[int]) -> dict[int, dict[str, float]]:
    out: dict[int, dict[str, float]] = {}
    threads = {"n": 0}
    notes: list[str] = []

    def on_event(ev: P.Message) -> None:
        if isinstance(ev, P.Log):
            if ev.message.startswith("threads set to "):
                threads["n"] = int(ev.message.split()[-1]) if ev.message.split()[-1].isdigit() else 0
            if "sharing the CPU" in ev.message or ev.message.startswith("threads:"):
                notes.append(ev.message)

    with tempfile.TemporaryDirectory(prefix="sapo-bench-contention-") as tmp:
        env = dict(os.environ, OMP_WAIT_POLICY="ACTIVE") if setup == "spinning" else None
        client = NodeClient(on_event=on_event, env=env, heartbeat_timeout=600)
        try:
            client.start(_config(args, setup, Path(tmp) / "run"))
            info = client.wait_for(lambda e: isinstance(e, P.NodeInfo), 900)
            client.pause(after_round=True)  # held between rounds: a held round's clock would run on
            client.wait_for(lambda e: isinstance(e, P.RoundDone), 1800)  # warm: one round first
            print(
                f"[{setup}] node up: {info.model_id}, sampler {info.sampler}; "
                f"{'; '.join(notes[-2:]) or 'no thread note'}",
                flush=True,
            )
            client.wait_state(P.PAUSED, timeout=600)
            for k in cases:
                busy = Busy(k)
                try:
                    solo = busy.rate(args.solo) if k else 0.0
                    before = len(notes)
                    c0, load0 = busy.count(), _load()
                    client.resume()
                    client.pause(after_round=True)
                    t0 = time.monotonic()
                    done = client.wait_for(lambda e: isinstance(e, P.RoundDone), 3600)
                    during = (busy.count() - c0) / (time.monotonic() - t0)
                    client.wait_state(P.PAUSED, timeout=600)
                    if k:  # solo again, the node held: the background load drifts on a shared machine
                        solo = (solo + busy.rate(args.solo)) / 2
                finally:
                    busy.close()
                m = done.metrics
                kept = during / solo if solo > 0 else float("nan")
                out[k] = {
                    "round": m.get(K.TIME_ROUND, 0.0),
                    "update": m.get(K.time_of(K.UPDATE), 0.0),
                    "sample": m.get(K.time_of(K.SAMPLE), 0.0),
                    "train_tok_s": m.get(K.TRAIN_TOK_PER_S, 0.0),
                    "sample_tok_s": m.get(K.SAMPLER_TOK_PER_S, 0.0),
                    "kept": kept,
                    "load": load0,
                    "threads": float(threads["n"]),
                }
                said = "; ".join(notes[before:])
                print(
                    f"[{setup}] beside {k} busy: round {out[k]['round']:.1f} s (sample {out[k]['sample']:.1f} s at "
                    f"{out[k]['sample_tok_s']:.0f} tok/s, update {out[k]['update']:.1f} s at "
                    f"{out[k]['train_tok_s']:.0f} tok/s)"
                    + (f", busy programs kept {100 * kept:.0f} % of their solo speed" if k else "")
                    + f"; load average {load0:.1f}"
                    + (f"; node said: {said}" if said else ""),
                    flush=True,
                )
        finally:
            client.stop(timeout=120)
    return out


def slowdown(quiet: dict[str, float], busy: dict[str, float]) -> float:
    """How many times longer the quiet round's work took at `busy`'s rates: its sampling and update
    seconds, each scaled by quiet rate / busy rate, over their sum. The same work on both sides,
    whatever each round happened to draw."""
    parts = [(quiet["sample"], quiet["sample_tok_s"], busy["sample_tok_s"])]
    parts.append((quiet["update"], quiet["train_tok_s"], busy["train_tok_s"]))
    timed = [(secs, q / b) for secs, q, b in parts if secs > 0 and q > 0 and b > 0]
    total = sum(secs for secs, _ in timed)
    return sum(secs * ratio for secs, ratio in timed) / total if total > 0 else float("nan")


def run(args: argparse.Namespace) -> int:
    setups = [s.strip() for s in args.setups.split(",") if s.strip()]
    cases = [int(x) for x in args.busy.split(",")]
    if 0 not in cases:
        cases = [0] + cases
    print(
        f"machine: {psutil.cpu_count(logical=False)} cores, load average {_load():.1f} (other jobs share it); "
        f"OMP_WAIT_POLICY in the node: {os.environ.get('OMP_WAIT_POLICY', 'PASSIVE (set by the node)')}",
        flush=True,
    )
    results = {s: _run_setup(args, s, cases) for s in setups}
    parts = []
    for s, r in results.items():
        quiet = r[0]["round"]
        ratios = {k: slowdown(r[0], r[k]) for k in r if k}
        print(
            f"{s}: quiet {quiet:.1f} s (sample {r[0]['sample_tok_s']:.0f}, update {r[0]['train_tok_s']:.0f} tok/s); "
            + ", ".join(f"beside {k}: {v:.2f}x" for k, v in ratios.items())
            + "; busy kept "
            + ", ".join(f"{100 * r[k]['kept']:.0f} %" for k in r if k)
        )
    main = results.get("default") or next(iter(results.values()))
    quiet = main[0]["round"]
    if 1 in main:
        parts.append(f"beside 1 busy process {slowdown(main[0], main[1]):.1f}x the quiet round's work")
    if 2 in main:
        parts.append(f"beside 2 {slowdown(main[0], main[2]):.1f}x")
    summary = ", ".join(parts)
    if 1 in main:
        summary += f"; the busy process kept {100 * main[1]['kept']:.0f} % of its speed"
    for s, r in results.items():
        if s != "default" and 1 in r:
            name = {"fixed": f"fixed {args.fixed} threads", "spinning": f"fixed {args.fixed} spinning threads"}.get(
                s, s
            )
            summary += f"; {name}: {slowdown(r[0], r[1]):.1f}x"
    if 1 in main:
        met = slowdown(main[0], main[1]) <= 2.5 and main[1]["kept"] >= 0.45
        print(
            f"goals: beside 1 busy process <= 2.5x and it keeps >= 45 %: {'met' if met else 'MISSED'}; "
            f"load average now {_load():.1f} on {psutil.cpu_count()} CPUs; quiet round {quiet:.1f} s"
        )
    print(f"contention: {summary}")
    return 0


__all__ = ["configure", "run"]
