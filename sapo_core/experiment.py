"""`sapo-experiment`: the SAPO paper's comparison in miniature, on this machine.

The paper (arXiv 2509.08721, §4) trains 8 nodes for 2000 rounds with the same number of groups
per update (I local + J external = 8) and compares configurations by total reward: 8/0
(isolated) against 6/2, 4/4 and 2/6 (sharing). This runs the same comparison small enough for
a laptop: N nodes of the embedded model (SmolLM2-135M) on the easy task mix, I + J groups per
update, a few rounds, one configuration after the other. Each node is a real node in its own
process (spawn) with its own identity, run directory and DHT; the sharing configurations form
one swarm each on loopback, the isolated one trains without a swarm.

The measure is each node's mean reward of its *own* completions per round (`reward/mean`: 1
right, 0 wrong, partial credits as ReasoningGYM gives them), summed over nodes and accumulated
over rounds. The mean, not the sum, because I differs between configurations (a 2/2 node
samples half the questions of a 4/0 node). Writes `experiment.csv` (one row per config, node
and round), `experiment.png` (cumulative reward per configuration) and `summary.txt`.

Departures from the paper: N, the rounds, G, the completion length and the task mix are
small (CPU); nodes of one configuration run concurrently on the same cores.
"""

from __future__ import annotations

import argparse
import csv
import multiprocessing
import os
import queue
import sys
import time
from pathlib import Path
from typing import Any

from sapo_core.config import DEFAULT_TASK_WEIGHTS, NodeConfig, from_dict, to_dict

CSV_FIELDS = ("config", "node", "round", "reward_mean", "accuracy", "groups_local_with_signal",
              "groups_external", "groups_trained", "round_seconds")


def parse_configs(text: str) -> list[tuple[int, int]]:
    """'4/0,2/2' -> [(4, 0), (2, 2)]; every I >= 1 and J >= 0."""
    out = []
    for part in text.split(","):
        try:
            i, j = (int(x) for x in part.strip().split("/"))
        except ValueError:
            raise SystemExit(f"--configs: '{part}' is not I/J, e.g. 4/0,2/2") from None
        if i < 1 or j < 0:
            raise SystemExit(f"--configs: '{part}' needs I >= 1 and J >= 0")
        out.append((i, j))
    return out


def node_config(args: argparse.Namespace, out: Path, label: str, index: int, local: int, external: int,
                join: str | None, threads: int) -> NodeConfig:
    weights = {t: 1.0 for t in args.tasks.split(",")} if args.tasks else dict(DEFAULT_TASK_WEIGHTS)
    return NodeConfig().replace(**{
        "run_dir": str(out / "runs" / label / f"node{index}"),
        "seed": args.seed + index,
        "model.name": args.model,
        "tasks.weights": weights,
        "sampler.group_size": args.group_size, "sampler.max_new_tokens": args.max_new_tokens,
        "sampler.threads": threads,
        "round.local_groups": local, "round.external_groups": external, "round.auto_scale": False,
        "swarm.enabled": external > 0,
        "swarm.swarm_name": f"experiment-{label.replace('/', '-')}-{args.stamp}",
        "swarm.host_maddrs": ["/ip4/127.0.0.1/tcp/0"],
        "swarm.window_seconds": max(60.0, args.window_seconds),
        # the same identity for node i in every configuration: the same questions to answer
        "swarm.identity_path": str(out / "identities" / f"node{index}.key"),
        "swarm.initial_peers": [join] if join else [],
    })


class _ChildHooks:
    def __init__(self, tag: str) -> None:
        self.tag = tag

    def checkpoint(self) -> None:
        return None

    def progress(self, phase: str, done: int, total: int, **info: Any) -> None:
        return None

    def log(self, level: str, message: str) -> None:
        if level in ("warning", "error"):
            print(f"[{self.tag}] {level}: {message}", flush=True)


def _run_node(config: dict, rounds: int, tag: str, index: int, messages: Any, all_done: Any) -> None:
    """One node's life in its own process: set up, announce, run its rounds, wait, close."""
    from sapo_core.node import Node

    node = None
    try:
        node = Node(from_dict(config), _ChildHooks(tag))
        node.setup()
        address = node.source.join_address if node.source is not None else ""
        messages.put(("ready", index, address))
        for _ in range(rounds):
            m = node.run_round()
            messages.put(("round", index, {k: float(v) for k, v in m.items()}))
        messages.put(("done", index, None))
        all_done.wait(3600)  # keep serving the DHT until every node of the swarm has finished
    except BaseException as e:  # reported to the parent, which stops the experiment
        messages.put(("error", index, f"{type(e).__name__}: {e}"))
    finally:
        if node is not None:
            node.close()


def run_configuration(args: argparse.Namespace, out: Path, local: int, external: int) -> list[dict]:
    """N node processes of one configuration; their rounds as CSV rows."""
    label = f"{local}/{external}"
    ctx = multiprocessing.get_context("spawn")
    messages, all_done = ctx.Queue(), ctx.Event()
    threads = max(1, (os.cpu_count() or 2) // args.nodes)
    procs: list[Any] = []
    rows: list[dict] = []
    done: set[int] = set()
    join: str | None = None

    def start(i: int) -> None:
        cfg = node_config(args, out, label, i, local, external, join, threads)
        p = ctx.Process(target=_run_node, args=(to_dict(cfg), args.rounds, f"{label} node{i}", i, messages, all_done))
        p.start()
        procs.append(p)

    def handle(kind: str, i: int, payload: Any) -> None:
        if kind == "error":
            raise RuntimeError(f"configuration {label}, node {i}: {payload}")
        if kind == "round":
            m = payload
            rows.append({"config": label, "node": i, "round": int(len([r for r in rows if r["node"] == i]) + 1),
                         "reward_mean": m.get("reward/mean", 0.0), "accuracy": m.get("accuracy/mean", 0.0),
                         "groups_local_with_signal": m.get("groups/local_with_signal", 0.0),
                         "groups_external": m.get("groups/external", 0.0),
                         "groups_trained": m.get("groups/trained", 0.0), "round_seconds": m.get("time/round", 0.0)})
            print(f"[{label} node{i}] round {rows[-1]['round']}/{args.rounds}: reward {m.get('reward/mean', 0):.3f}, "
                  f"external {m.get('groups/external', 0):.0f}, {m.get('time/round', 0):.0f} s", flush=True)
        elif kind == "done":
            done.add(i)

    try:
        start(0)  # the first node alone: it converts the model once for the others, and hosts
        while True:
            kind, i, payload = messages.get(timeout=args.timeout)
            if kind == "ready":
                join = payload or None
                break
            handle(kind, i, payload)
        for i in range(1, args.nodes):
            start(i)
        while len(done) < args.nodes:
            try:
                kind, i, payload = messages.get(timeout=args.timeout)
            except queue.Empty:
                raise RuntimeError(f"configuration {label}: no node reported for {args.timeout:.0f} s") from None
            if kind != "ready":
                handle(kind, i, payload)
    finally:
        all_done.set()
        for p in procs:
            p.join(60)
            if p.is_alive():
                p.terminate()
                p.join(10)
    return rows


def cumulative(rows: list[dict]) -> dict[str, list[float]]:
    """config -> cumulative (over rounds) sum over nodes of each round's mean reward."""
    out: dict[str, list[float]] = {}
    for label in dict.fromkeys(r["config"] for r in rows):
        per_round: dict[int, float] = {}
        for r in rows:
            if r["config"] == label:
                per_round[r["round"]] = per_round.get(r["round"], 0.0) + r["reward_mean"]
        total, series = 0.0, []
        for rnd in sorted(per_round):
            total += per_round[rnd]
            series.append(total)
        out[label] = series
    return out


def write_outputs(rows: list[dict], out: Path, title: str) -> list[str]:
    with open(out / "experiment.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=CSV_FIELDS)
        writer.writeheader()
        writer.writerows(rows)
    curves = cumulative(rows)
    lines = []
    for label, series in curves.items():
        mine = [r for r in rows if r["config"] == label]
        ext = sum(r["groups_external"] for r in mine) / max(1, len(mine))
        lines.append(f"{label}: cumulative reward {series[-1] if series else 0:.3f} over {len(series)} rounds, "
                     f"accuracy {sum(r['accuracy'] for r in mine) / max(1, len(mine)):.3f}, "
                     f"{ext:.2f} external groups per node-round")
    (out / "summary.txt").write_text(title + "\n" + "\n".join(lines) + "\n")
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        from matplotlib.ticker import MaxNLocator
    except ImportError:
        lines.append("(matplotlib is not installed: no experiment.png)")
        return lines
    fig, ax = plt.subplots(figsize=(7, 4.2), dpi=120)
    for label, series in curves.items():
        ax.plot(range(1, len(series) + 1), series, marker="o", label=f"{label} (local/external)")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel("round")
    ax.set_ylabel("cumulative reward (sum over nodes of mean reward)")
    ax.set_title(title, fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(out / "experiment.png")
    plt.close(fig)
    return lines


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="sapo-experiment", description=__doc__.splitlines()[0])
    p.add_argument("--nodes", type=int, default=3, help="nodes per configuration, N")
    p.add_argument("--rounds", type=int, default=10, help="rounds per node")
    p.add_argument("--configs", default="4/0,2/2", help="I/J configurations, same I + J each, e.g. 4/0,2/2")
    p.add_argument("--model", default="smollm2-135m-instruct", help="catalogue id (tiny-random for a dry run)")
    p.add_argument("--tasks", default="", help="comma-separated datasets (default: the node's easy mix)")
    p.add_argument("--group-size", type=int, default=4, help="completions per question, G")
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--window-seconds", type=float, default=300.0, help="swarm.window_seconds")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--timeout", type=float, default=1800.0, help="seconds without news before giving up")
    p.add_argument("--out", default="", help="output directory (default: experiment-<time> here)")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    configs = parse_configs(args.configs)
    if len({i + j for i, j in configs}) != 1:
        print("sapo-experiment: warning: the configurations do not all train on the same number of groups "
              "per update (I + J), so they are not the paper's comparison", file=sys.stderr)
    if args.nodes < 1 or args.rounds < 1:
        raise SystemExit("--nodes and --rounds must be at least 1")
    args.stamp = time.strftime("%Y%m%d-%H%M%S")
    out = Path(args.out or f"experiment-{args.stamp}").resolve()
    out.mkdir(parents=True, exist_ok=True)
    title = (f"SAPO in miniature: {args.nodes} nodes × {args.rounds} rounds, {args.model}, "
             f"G={args.group_size}, ≤{args.max_new_tokens} tokens")
    print(title, f"→ {out}", flush=True)
    rows: list[dict] = []
    started = time.time()
    for local, external in configs:
        rows += run_configuration(args, out, local, external)
        write_outputs(rows, out, title)  # keep what is done if a later configuration fails
    lines = write_outputs(rows, out, title)
    print(f"done in {(time.time() - started) / 60:.1f} min; {out / 'experiment.csv'}, {out / 'experiment.png'}")
    for line in lines:
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
