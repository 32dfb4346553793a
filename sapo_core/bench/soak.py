"""`sapo-bench soak --rounds N --peers P`: a node over many rounds, with its memory, files,
processes, disk and round time per round, and how each grows.

A real node in its worker process, driven by `NodeClient` as the desktop app drives it (the
embedded model, small rounds so a thousand are affordable: I=2 own and J=2 peers' groups of
G=4, at most 32 new tokens, a small held-out evaluation every 100 rounds), in a swarm on
loopback with P light peers in this process (the swarm bench's: own identity, p2pd, DHT,
verifier; no model). The peers publish records and gather (the node's records too) every few
seconds; what they publish is the node's own groups they gathered, echoed as theirs (model text,
so the node trains on peers' groups all along), and short made-up answers until they have some;
every `--churn-every` seconds a share of them leaves (closed) and the ones that left the time
before come back with the same identity, so the node's peer table keeps changing. Short
DHT windows (60 s) make the swarm's keys turn over sixty times an hour.

After every round of the node: the RSS of the node's process tree (the worker and its p2p
daemon; the worker alone too), its open files and threads, its p2pd processes, the run
directory's size on disk (store and checkpoints), the round's time. Written to `soak.csv`.
After warm-up and again after the last round, the app's controls on the soaking node, measured
as `sapo-bench control` does (`--pauses` pauses, command to paused; one throttle pass at 50 %, a
throttled round between two unthrottled ones; before 2026-12-03 also 75 and 25 %, four rounds
more): whether pause and throttle keep their figures after days. Those rounds are not rows.
With `--app` (the default) the desktop app's window follows the node offscreen in a process of
its own (`app/soakwatch.py`: each round as the app's round event, then the dashboard's redraw), and
each row has the window's RSS and its latest redraw's CPU time.

Ends with one line: the slope of each per 100 rounds after warm-up (`--warmup` rounds, default a
tenth) with its 95 % interval (ordinary least squares; successive rounds are correlated, so the
interval is narrower than it should be: read it as a lower bound on the uncertainty), and the
worst value:
`soak: 1000 rounds in 1.1 h, RSS +1.8 MB/100 rounds (95% CI +0.9..+2.7), peak 1.21 GB, open files +0, ...,
pause p95 0.41 -> 0.44 s, throttle 50% -> 52 / 51%, app RSS 190 -> 196 MB, redraw p95 7.1 -> 7.9 ms`
(the controls and the window: after warm-up, then at the end)
"""

from __future__ import annotations

import argparse
import collections
import csv
import dataclasses
import json
import math
import random
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from sapo_core.config import NodeConfig, SwarmConfig, TaskConfig
from sapo_core.control import vocabulary as K
from sapo_core.rollouts import Completion, Group

FIELDS = (  # the columns of soak.csv, one row a round
    "round wall_s round_s rss_mb worker_rss_mb open_files threads p2pd"
    " disk_mb store_mb peers_live external_groups app_rss_mb app_redraw_ms"
).split()


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--rounds", type=int, default=1000, help="node rounds (default 1000)")
    parser.add_argument("--peers", type=int, default=8, help="light peers on loopback (default 8)")
    parser.add_argument("--churn", type=float, default=0.25, help="share of the peers that leave each churn")
    parser.add_argument("--churn-every", type=float, default=60.0, help="seconds between churns (default 60)")
    parser.add_argument("--warmup", type=int, default=0, help="rounds left out of the slopes (0: a tenth)")
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--threads", type=int, default=0, help="node threads (0: the node's own choice)")
    parser.add_argument("--out", default="", help="directory for soak.csv (default: a temporary one)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--pauses",
        type=int,
        default=5,
        help="pauses timed after warm-up and again after the last round, each with one throttle pass at "
        "50 %% (`sapo-bench control`'s measures; those rounds are not in the CSV); 0: none",
    )
    parser.add_argument(
        "--app",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="follow the node with the app's window offscreen in its own process (app/soakwatch.py): "
        "its RSS and redraw time per round",
    )
    parser.add_argument(
        "--from-csv", metavar="FILE", help="summarize an earlier run's soak.csv (one cut short, say) instead of running"
    )


def node_config(args: argparse.Namespace, run_dir: Path, swarm: SwarmConfig) -> NodeConfig:
    return NodeConfig().replace(
        **{
            "model.name": args.model,
            "round.local_groups": 2,
            "round.external_groups": 2,
            "round.auto_scale": False,
            "sampler.group_size": 4,
            "sampler.max_new_tokens": 32,
            "sampler.threads": args.threads,
            "eval.every_rounds": 100,
            "eval.questions": 4,
            "eval.samples": 2,
            "eval.max_share": 1.0,
            "swarm.swarm_name": swarm.swarm_name,
            "swarm.window_seconds": swarm.window_seconds,
            "swarm.host_maddrs": ["/ip4/127.0.0.1/tcp/0"],
            "swarm.initial_peers": list(swarm.initial_peers),
            "swarm.lan_discovery": False,
            "run_dir": str(run_dir),
            "seed": args.seed,
        }
    )


def tree_usage(pid: int, seen: set[int] | None = None) -> dict[str, float]:
    """RSS (MB) of a process and its children, its own RSS, open files and threads of the tree,
    and how many of its children are p2p daemons; their pids go into `seen`."""
    import psutil

    root = psutil.Process(pid)
    out = {"rss_mb": 0.0, "worker_rss_mb": 0.0, "open_files": 0, "threads": 0, "p2pd": 0}
    for p in [root, *root.children(recursive=True)]:
        if seen is not None:
            seen.add(p.pid)
        try:
            with p.oneshot():
                rss = p.memory_info().rss / 1e6
                out["rss_mb"] += rss
                if p.pid == pid:
                    out["worker_rss_mb"] = rss
                out["open_files"] += p.num_fds()
                out["threads"] += p.num_threads()
                out["p2pd"] += "p2pd" in p.name()
        except psutil.Error:
            continue
    return out


def disk_mb(path: Path, prefix: str = "") -> float:
    """Size on disk of the files under a directory (those whose name starts with `prefix`)."""
    if not path.is_dir():
        return 0.0
    total = 0
    for f in path.rglob(f"{prefix}*"):
        try:
            total += f.stat().st_size if f.is_file() else 0
        except OSError:  # a checkpoint pruned while we walked
            continue
    return total / 1e6


def slope(xs: list[float], ys: list[float]) -> tuple[float, float, float]:
    """Least-squares slope per 100 x, with its 95 % interval (normal approximation)."""
    n = len(xs)
    if n < 3:
        return math.nan, math.nan, math.nan
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    sxx = sum((x - mx) ** 2 for x in xs)
    if sxx == 0:
        return math.nan, math.nan, math.nan
    b = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx
    a = my - b * mx
    resid = sum((y - a - b * x) ** 2 for x, y in zip(xs, ys)) / (n - 2)
    half = 1.96 * math.sqrt(resid / sxx)
    return 100 * b, 100 * (b - half), 100 * (b + half)


class LightPeers:
    """P light peers on loopback that publish, gather, leave and come back, on a thread."""

    def __init__(self, cfg: SwarmConfig, n: int, root: Path, rng: random.Random, period: float = 5.0) -> None:
        from sapo_core.swarm.source import open_swarm
        from sapo_core.tasks import TaskSet

        self.cfg, self.root, self.rng, self.period = cfg, root, rng, period
        self._open = open_swarm
        self.verifier = TaskSet(TaskConfig(), seed=0)
        self.own = {k: TaskSet(TaskConfig(), seed=1000 + k) for k in range(n)}
        first = open_swarm(cfg, self.verifier, root / "peer0")
        self.address = first.join_address
        joined = dataclasses.replace(cfg, initial_peers=[self.address])
        self.cfg = joined
        self.live = {0: first, **{k: open_swarm(joined, self.verifier, root / f"peer{k}") for k in range(1, n)}}
        self.away: list[int] = []
        self.round = 0
        self.churns = 0
        self.errors = 0
        # the node's groups the peers gathered, republished as their own (echo): model text
        self.echo: collections.deque[Group] = collections.deque(maxlen=64)
        self.echoed = 0
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._loop, name="soak-peers", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def _loop(self) -> None:
        while not self._stop.wait(self.period):
            self.round += 1
            with self._lock:
                peers = list(self.live.items())
            ours = {p.node_id for _, p in peers}
            for k, p in peers:
                try:
                    mine = [self.echo.popleft() for _ in range(min(2, len(self.echo)))]
                    p.publish(self.round, mine or short_groups(self.own[k], self.round, self.rng))
                    self.echoed += len(mine)
                    self.echo.extend(echo(p.gather(self.round, 2, random.Random(self.rng.random())), ours))
                except Exception:  # a peer that closed under us: churn, not a failure of the node
                    self.errors += 1

    def churn(self, share: float) -> None:
        """The ones away come back (same identity); a share of the others (never peer 0, the
        node's bootstrap) leaves."""
        with self._lock:
            for k in self.away:
                self.live[k] = self._open(self.cfg, self.verifier, self.root / f"peer{k}")
            candidates = [k for k in self.live if k != 0]
            self.away = self.rng.sample(candidates, min(len(candidates), max(1, round(share * len(self.live)))))
            leaving = [self.live.pop(k) for k in self.away]
        for p in leaving:
            p.close()
        self.churns += 1

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=60)
        with self._lock:
            for p in self.live.values():
                p.close()
            self.live.clear()


def echo(gathered: list[Group], ours: set[str]) -> list[Group]:
    """The node's groups among those a peer gathered, as the peer republishes them: the model's
    own text (which the node's likelihood floor takes as it takes its own), the rewards the peer
    scored; our token ids and the sampler's log-probs left out, as another tokenizer's peer would."""
    return [
        Group(g.question, [Completion(text=c.text, finished=c.finished, reward=c.reward) for c in g.completions])
        for g in gathered
        if g.source not in ours
    ]


def short_groups(tasks, round: int, rng: random.Random, n: int = 2, size: int = 4) -> list[Group]:
    """n groups of `size` short completions, some right and some wrong (a group with signal).
    Random filler words fail the node's likelihood floor at once; these one-line answers pass it
    while the node still answers that way itself (its first ~20 rounds in the 2026-11-25 soak),
    then are refused as unlikely. So a peer publishes these only until it has gathered the node's
    own groups to echo (`echo`)."""
    out = []
    for q in tasks.sample_questions(round, n):
        right = rng.randint(1, size - 1)
        forms = ("Answer: {}", "The answer is {}.", "So the answer is {}.")
        wrong = "0" if q.answer.strip() != "0" else "1"
        texts = [rng.choice(forms).format(q.answer if k < right else wrong) for k in range(size)]
        rewards = tasks.score(q, texts)
        out.append(Group(q, [Completion(text=t, reward=r) for t, r in zip(texts, rewards)], round=round))
    return out


def from_csv(path: str, warmup: int) -> str:
    """The summary line of a soak.csv (its churn counts and leftover processes are not in it)."""
    with open(path, newline="") as f:
        rows = [{k: float(v) if v not in ("", None) else math.nan for k, v in r.items()} for r in csv.DictReader(f)]
    if len(rows) < 3:
        raise SystemExit(f"{path}: {len(rows)} rounds, nothing to fit")
    hours = rows[-1]["wall_s"] / 3600
    return summary(rows, warmup or max(1, len(rows) // 10), hours, -1, None)


def run(args: argparse.Namespace) -> int:
    import psutil

    if args.from_csv:
        print(from_csv(args.from_csv, args.warmup), flush=True)
        return 0

    from sapo_core.control import protocol as P
    from sapo_core.control.client import NodeClient

    rng = random.Random(args.seed)
    tmp = tempfile.TemporaryDirectory(prefix="sapo-bench-soak-")
    root = Path(tmp.name)
    out = Path(args.out) if args.out else root
    out.mkdir(parents=True, exist_ok=True)
    swarm = SwarmConfig(
        swarm_name=f"soak-{rng.randrange(1 << 30):x}",
        window_seconds=60.0,
        host_maddrs=["/ip4/127.0.0.1/tcp/0"],
        lan_discovery=False,
    )
    print(
        f"machine: {psutil.cpu_count(logical=False)} cores, load average {psutil.getloadavg()[0]:.1f}; "
        f"{args.rounds} rounds, {args.peers} light peers, churn {args.churn:.0%} every {args.churn_every:g} s",
        flush=True,
    )
    peers = LightPeers(swarm, args.peers, root / "peers", rng)
    swarm = peers.cfg
    run_dir = root / "run"
    client = NodeClient(heartbeat_timeout=600)
    rows: list[dict[str, float]] = []
    tree: set[int] = set()  # every process of the node's tree seen: none may outlive its stop
    window: AppWatch | None = None
    started = time.monotonic()
    try:
        peers.start()
        client.start(node_config(args, run_dir, swarm))  # runs until stopped: the probes take rounds too
        info = client.wait_for(lambda e: isinstance(e, P.NodeInfo), 900)
        print(f"node: {info.model_id}, sampler {info.sampler}, pid {client.pid}", flush=True)
        if args.app:
            window = AppWatch(run_dir / "rounds.sqlite")
        next_churn = time.monotonic() + args.churn_every
        warmup = args.warmup or max(1, args.rounds // 10)
        control: dict[str, dict[str, float]] = {}
        with open(out / "soak.csv", "w", newline="") as f:
            writer = csv.DictWriter(f, FIELDS)
            writer.writeheader()
            while len(rows) < args.rounds:
                ev = client.wait_for(lambda e: isinstance(e, (P.RoundDone, P.Exited)), 1800)
                if isinstance(ev, P.Exited):
                    print(f"the node exited: {ev}", flush=True)
                    break
                app = window.latest if window else {}
                row = round_row(ev, time.monotonic() - started, tree_usage(client.pid, tree), run_dir, peers, app)
                rows.append(row)
                writer.writerow(row)
                f.flush()
                if ev.round % 50 == 0 or ev.round == 1:
                    print(progress_line(row), flush=True)
                if time.monotonic() >= next_churn:
                    peers.churn(args.churn)
                    next_churn = time.monotonic() + args.churn_every
                if args.pauses and len(rows) in (warmup, args.rounds):
                    when = "end" if len(rows) == args.rounds else "start"
                    control[when] = control_probe(client, args.pauses, rng, ev.round)
    finally:
        client.stop(timeout=120)
        peers.close()
        if window is not None:
            window.close()
        hours = (time.monotonic() - started) / 3600
    time.sleep(2)
    left = [pid for pid in tree if psutil.pid_exists(pid) and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE]
    tmp.cleanup()
    if len(rows) < 3:
        print(f"soak: only {len(rows)} rounds; nothing to fit")
        return 1
    print(summary(rows, args.warmup or max(1, len(rows) // 10), hours, len(left), peers, control), flush=True)
    return 0


def round_row(ev, wall_s: float, usage: dict, run_dir: Path, peers, app: dict) -> dict:
    """A CSV row after round `ev` (RoundDone): the node tree's `usage`, its disk, the peers, the app."""
    return {
        "round": ev.round,
        "wall_s": round(wall_s, 1),
        "round_s": round(ev.metrics.get(K.TIME_ROUND, math.nan), 2),
        **{k: round(v, 1) for k, v in usage.items()},
        "disk_mb": round(disk_mb(run_dir), 2),
        "store_mb": round(disk_mb(run_dir, "rounds.sqlite"), 4),  # with its journal
        "peers_live": len(peers.live),
        "external_groups": ev.metrics.get(K.GROUPS_EXTERNAL, 0),
        "app_rss_mb": app.get("rss_mb", math.nan),
        "app_redraw_ms": app.get("redraw_cpu_ms", math.nan),
    }


def progress_line(row: dict) -> str:
    return (
        f"round {row['round']}: {row['round_s']:.1f} s, RSS {row['rss_mb']:.0f} MB "
        f"(worker {row['worker_rss_mb']:.0f}), files {row['open_files']:.0f}, threads {row['threads']:.0f}, "
        f"p2pd {row['p2pd']:.0f}, disk "
        f"{row['disk_mb']:.1f} MB, peers {row['peers_live']}"
    )


class AppWatch:
    """The app's window following the node in its own process (app/soakwatch.py); `latest` is its
    last report (round, rss_mb, redraw_cpu_ms, redraw_wall_ms)."""

    def __init__(self, store: Path) -> None:
        self.latest: dict[str, float] = {}
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "app.soakwatch", str(store)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        self.thread = threading.Thread(target=self._read, name="soakwatch", daemon=True)
        self.thread.start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            try:
                self.latest = json.loads(line)
            except ValueError:
                continue

    def close(self) -> None:
        try:
            self.proc.stdin.close()  # it stops when its stdin closes
            self.proc.wait(timeout=30)
        except (OSError, subprocess.TimeoutExpired):
            self.proc.kill()
            self.proc.wait()


def control_probe(client, pauses: int, rng: random.Random, after: int) -> dict[str, float]:
    """The app's controls on the soaking node, as `sapo-bench control` measures them: the p95
    of `pauses` pauses (command to paused), and one throttle pass at 50 % (the throttled round's
    CPU rate over the unthrottled rounds beside it; `sapo-bench control` measures 75 and 25 % too)."""
    from sapo_core.bench.control import _measure_pauses, _measure_throttle, percentile

    print(f"controls, after round {after}:", flush=True)
    times = [latency for _, latency, _ in _measure_pauses(client, pauses, rng)]
    shares = _measure_throttle(client, 1, (0.5,))  # the share the summary names: 3 rounds, not 7
    client.set_throttle(1.0)
    return {"pause_p95": percentile(times, 0.95), **{f"throttle_{round(100 * k)}": v for k, v in shares.items()}}


def summary(
    rows: list[dict[str, float]],
    warmup: int,
    hours: float,
    left: int,
    peers: LightPeers | None,
    control: dict[str, dict[str, float]] | None = None,
) -> str:
    """The one summary line (`left` -1: not known); prints the details before it. `control`:
    the probes' figures after warm-up ("start") and at the end ("end"), where they ran."""
    kept = rows[warmup:] if len(rows) - warmup >= 3 else rows
    x = [r["round"] for r in kept]

    def fit(key: str) -> tuple[float, float, float]:
        return slope(x, [r[key] for r in kept])

    rss, disk, rt, worker = fit("rss_mb"), fit("disk_mb"), fit("round_s"), fit("worker_rss_mb")
    files = kept[-1]["open_files"] - kept[0]["open_files"]
    procs = kept[-1]["p2pd"] - kept[0]["p2pd"]
    store_per_round = (kept[-1]["store_mb"] - kept[0]["store_mb"]) / max(1, x[-1] - x[0]) * 1000
    print(
        f"after {warmup} warm-up rounds: the worker alone {worker[0]:+.1f} MB/100 rounds "
        f"({worker[1]:+.1f}..{worker[2]:+.1f}), peak {max(r['worker_rss_mb'] for r in rows):.0f} MB; "
        f"store +{store_per_round:.1f} kB a round; threads "
        f"{kept[0]['threads']:.0f} -> {kept[-1]['threads']:.0f} (max {max(r['threads'] for r in rows):.0f}); "
        f"open files max {max(r['open_files'] for r in rows):.0f}; p2pd max {max(r['p2pd'] for r in rows):.0f}; "
        f"peers' groups trained on {statistics.fmean(r['external_groups'] for r in rows):.2f} a round; "
        + (
            f"{peers.churns} churns, {peers.errors} peer errors, {peers.echoed} of the node's groups echoed; "
            if peers is not None
            else ""
        )
        + (f"processes left after stop: {left}" if left >= 0 else "")
    )
    return (
        f"soak: {len(rows)} rounds in {hours:.2f} h, "
        f"RSS {rss[0]:+.1f} MB/100 rounds (95% CI {rss[1]:+.1f}..{rss[2]:+.1f}), "
        f"peak {max(r['rss_mb'] for r in rows) / 1000:.2f} GB, open files {files:+.0f}, processes {procs:+.0f}, "
        f"disk {disk[0]:+.2f} MB/100 rounds, round time {rt[0]:+.2f} s/100 rounds (95% CI {rt[1]:+.2f}..{rt[2]:+.2f})"
        + _control_words(control or {})
        + _app_words(kept)
    )


def _app_words(kept: list[dict[str, float]]) -> str:
    """ ", app RSS 190 -> 196 MB, redraw p95 7.1 -> 7.9 ms": the window's median RSS and its
    redraw p95 over the first and the last tenth of the rounds after warm-up."""
    from sapo_core.bench.control import percentile  # the pause p95's definition too

    seen = [r for r in kept if not math.isnan(r.get("app_rss_mb", math.nan))]
    if len(seen) < 2:
        return ""
    n = max(1, len(seen) // 10)
    ends = (seen[:n], seen[-n:])
    rss = [statistics.median(r["app_rss_mb"] for r in part) for part in ends]
    p95 = [percentile([r["app_redraw_ms"] for r in part], 0.95) for part in ends]
    return f", app RSS {rss[0]:.0f} -> {rss[1]:.0f} MB, redraw p95 {p95[0]:.1f} -> {p95[1]:.1f} ms"


def _control_words(control: dict[str, dict[str, float]]) -> str:
    """ ", pause p95 0.41 -> 0.44 s, throttle 50% -> 52 / 51%": the start's figure, then the end's."""
    if not control:
        return ""
    runs = [control[k] for k in ("start", "end") if k in control]
    pause = " -> ".join(f"{c['pause_p95']:.2f}" for c in runs)
    throttle = " / ".join(f"{c['throttle_50']:.0f}" for c in runs)
    return f", pause p95 {pause} s, throttle 50% -> {throttle}%"


__all__ = ["configure", "run", "slope", "summary", "tree_usage"]
