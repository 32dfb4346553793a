"""`sapo-bench seed --peers N`: what a seed costs its operator while a swarm uses it.

A real `sapo-node seed` process on loopback, and N light peers in this process (the swarm
bench's: own identity, p2pd, DHT, validators, verifier; no model) that know only the seed's
address. Every round each peer publishes a record of realistic size and gathers J groups; between
rounds `--churn` of the peers leave (closed) and as many new ones join through the seed, so the
seed keeps serving while peers come and go. Measured on the seed: its resident memory with its
p2p daemon (the largest over the run, sampled every half second), and its CPU time (its own and its
daemon's) over the measured rounds' wall time, as a share of one core; on the peers: gather time.
The first round warms caches and is not counted.

Ends with one line: `seed: 64 peers, RSS 150 MB, CPU 2.1 % of one core, gather p95 0.40 s`.
"""

from __future__ import annotations

import argparse
import random
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from sapo_core.bench.swarm import _groups, _pct
from sapo_core.config import SwarmConfig, TaskConfig
from sapo_core.control import vocabulary as K


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--peers", type=int, default=64, help="light peers on loopback, all joined through the seed")
    parser.add_argument("--rounds", type=int, default=5, help="measured rounds (after one warm-up round)")
    parser.add_argument("--churn", type=float, default=0.1, help="share of the peers replaced between rounds")
    parser.add_argument("--groups", type=int, default=4, help="groups each peer publishes per round (I)")
    parser.add_argument("--completions", type=int, default=8, help="completions per group (G)")
    parser.add_argument("--chars", type=int, default=560, help="characters per completion (~128 tokens)")
    parser.add_argument("--want", type=int, default=4, help="groups each peer gathers per round (J)")
    parser.add_argument("--seed", type=int, default=0)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_seed(data: Path, swarm: str, window: float, page_port: int = 0) -> tuple[subprocess.Popen, str]:
    """A `sapo-node seed` process on loopback (its page on `page_port`, 0: a free one) and the
    address it says to join with."""
    port = _free_port()
    cmd = [sys.executable, "-m", "sapo_core.cli", "seed", "--data-dir", str(data), "--host", "127.0.0.1"]
    cmd += ["--port", str(port), "--page-port", str(page_port or _free_port())]
    cmd += ["--set", f"swarm.swarm_name={swarm}", "--set", f"swarm.window_seconds={window}"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    deadline = time.monotonic() + 120
    seen = []
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        seen.append(line)
        if "join with: --initial-peers " in line:
            return proc, line.split("--initial-peers ", 1)[1].strip()
    proc.kill()
    raise SystemExit("the seed did not start:\n" + "".join(seen))


def _usage(pid: int) -> tuple[float, float, float]:
    """(RSS in MB, CPU seconds, RSS of the seed's Python process alone in MB) of a process and its
    children (the seed and its p2pd)."""
    import psutil

    proc = psutil.Process(pid)
    procs = [proc, *proc.children(recursive=True)]
    rss = cpu = own = 0.0
    for p in procs:
        try:
            mb = p.memory_info().rss / 1e6
            rss += mb
            own += mb if p.pid == pid else 0.0
            t = p.cpu_times()
            cpu += t.user + t.system
        except psutil.Error:
            continue
    return rss, cpu, own


class _PeakSampler(threading.Thread):
    """The seed's largest RSS (with its p2pd), sampled every half second, not only between rounds:
    the page's poll and verification come on their own clock."""

    def __init__(self, pid: int):
        super().__init__(daemon=True)
        self.pid, self.peak, self.own_at_peak = pid, 0.0, 0.0
        self.done = threading.Event()

    def run(self) -> None:
        while not self.done.wait(0.5):
            try:
                rss, _, own = _usage(self.pid)
            except Exception:  # noqa: BLE001 (the seed is gone: the run says so)
                return
            if rss > self.peak:
                self.peak, self.own_at_peak = rss, own


def _page_says(port: int) -> str:
    """What the seed's page reported at the end: it polls and verifies while the peers work."""
    import json
    import urllib.request

    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/status", timeout=10) as reply:
            status = json.load(reply)
    except (OSError, ValueError) as e:
        return f"seed page: no status ({e})"
    refused = sum(status.get("groups_refused", {}).values())
    return (
        f"seed page: {status.get('nodes_known', 0)} nodes seen, {status.get('groups_verified', 0)} groups "
        f"verified, {refused} refused"
    )


def _churn(peers: list, share: float, rng: random.Random, new_peer) -> None:
    """`share` of the peers leave (closed) and as many new ones join through the seed."""
    gone = rng.sample(peers, max(1, round(share * len(peers))))
    for p in gone:
        p.close()
        peers.remove(p)
    with ThreadPoolExecutor(4) as pool:
        peers += list(pool.map(new_peer, range(len(gone))))


def _stop(seed: subprocess.Popen) -> None:
    """SIGTERM, as a service manager stops it; killed after 30 s."""
    seed.send_signal(signal.SIGTERM)
    try:
        seed.wait(30)
    except subprocess.TimeoutExpired:
        seed.kill()


def run(args: argparse.Namespace) -> int:
    from sapo_core.swarm.source import open_swarm
    from sapo_core.tasks import TaskSet

    if args.peers < 2:
        raise SystemExit("--peers must be at least 2")
    rng = random.Random(args.seed)
    tmp = Path(tempfile.mkdtemp(prefix="sapo-bench-seed-"))
    swarm, window = f"bench-seed-{rng.randrange(1 << 30):x}", 600.0
    page_port = _free_port()
    seed, address = start_seed(tmp / "seed", swarm, window, page_port)
    cfg = SwarmConfig(
        swarm_name=swarm,
        host_maddrs=["/ip4/127.0.0.1/tcp/0"],
        window_seconds=window,
        shards_read=2,
        initial_peers=[address],
        lan_discovery=False,
    )
    verifier = TaskSet(TaskConfig(), seed=0)
    made = [0]

    def new_peer(_: int = 0):
        made[0] += 1
        return open_swarm(cfg, verifier, tmp / f"peer{made[0]}")

    started = time.perf_counter()
    with ThreadPoolExecutor(4) as pool:
        peers = list(pool.map(new_peer, range(args.peers)))
    print(f"seed and {args.peers} peers up in {time.perf_counter() - started:.1f} s; seed {address}")
    own = {id(p): TaskSet(TaskConfig(), seed=1000 + k) for k, p in enumerate(peers)}
    gather_s: list[float] = []
    cpu0, t0 = 0.0, 0.0
    sampler = _PeakSampler(seed.pid)
    sampler.start()
    try:
        for r in range(args.rounds + 1):
            if r == 1:
                _, cpu0, _ = _usage(seed.pid)
                t0 = time.perf_counter()
            order = list(peers)
            rng.shuffle(order)
            for p in order:
                tasks = own.setdefault(id(p), TaskSet(TaskConfig(), seed=rng.randrange(1 << 30)))
                p.publish(r, _groups(tasks, r, args, rng))
            times = []
            for p in order:
                p.gather(r, args.want, random.Random(rng.random()))
                times.append(p.stats()[K.SWARM_GATHER_S])
            rss, _, _ = _usage(seed.pid)
            if r:
                gather_s += times
            print(
                f"round {r}: seed RSS {rss:.0f} MB, gather p50 {_pct(times, 50):.3f} s max {max(times):.3f} s"
                + (" (warm-up)" if r == 0 else "")
            )
            if r < args.rounds and args.churn > 0:
                _churn(peers, args.churn, rng, new_peer)
        _, cpu1, _ = _usage(seed.pid)
        wall = time.perf_counter() - t0
        print(_page_says(page_port))
    finally:
        sampler.done.set()
        with ThreadPoolExecutor(4) as pool:
            list(pool.map(lambda p: p.close(), peers))
        _stop(seed)
    share = 100 * (cpu1 - cpu0) / wall if wall > 0 else float("nan")
    print(f"seed CPU {cpu1 - cpu0:.1f} s over {wall:.0f} s of measured rounds; exit code {seed.returncode}")
    print(
        f"seed RSS at its peak: {sampler.own_at_peak:.0f} MB the seed's Python process, "
        f"{sampler.peak - sampler.own_at_peak:.0f} MB its p2p daemon"
    )
    print(
        f"seed: {args.peers} peers, RSS {sampler.peak:.0f} MB, CPU {share:.1f} % of one core, "
        f"gather p95 {_pct(gather_s, 95):.2f} s"
    )
    return 0


__all__ = ["configure", "run", "start_seed"]
