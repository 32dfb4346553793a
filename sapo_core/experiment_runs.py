"""How `sapo-experiment` runs the nodes of one (seed, arm): in turn in one process, or each in its own.

- In turn (the default, made for a 2-core CPU): the nodes live in one process and take their rounds
  in turn (round r of node 0, 1, ..., then round r + 1), so one round runs at a time on all cores;
  they share the frozen base weights (one copy in memory, one LoRA each) and one llama.cpp sampler,
  which swaps in each node's adapter before it samples.
- Each in its own process (`--node-processes`, for a GPU or a many-core machine): every node is a
  spawned process with its own model, as in a real swarm; node 0 starts first and hosts the swarm,
  the others join it through the address it writes, and nobody waits for anybody between rounds.

With `--minutes`, a node stops taking rounds once that much time has passed since its first round
and is evaluated after its last one, whichever round that is (`experiment_report` takes each node's
last evaluation). Runs of several (seed, arm) pairs go to a process pool, `--jobs` at a time; the
stop rules (SIGTERM, a parent killed) are the same for both ways.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import signal
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from sapo_core import logs
from sapo_core.experiment_files import write_outputs
from sapo_core.experiment_report import FLOOR_COLUMNS, PHASE_COLUMNS
from sapo_core.roundshape import RoundShape

VETERAN_INDEX = 100  # node indices from here are veterans (--veterans): seeds and identities of their own

# (seed, arm, node index, join address or None) -> that node's NodeConfig
ConfigOf = Callable[[int, Any, int, "str | None"], Any]


class SharedSampler:
    """One sampler for several nodes: `view(node)` is what a node samples through; before a node
    samples (or syncs), the sampler is made to follow that node's policy (its LoRA swapped in)."""

    def __init__(self, inner) -> None:
        self.inner = inner
        self.owner: Any = None

    def view(self, node) -> _SamplerView:
        return _SamplerView(self, node)


class _SamplerView:
    def __init__(self, shared: SharedSampler, node) -> None:
        self.shared, self.node, self.name = shared, node, shared.inner.name
        self.kernels = shared.inner.kernels

    def sync_policy(self, policy) -> None:
        if self.shared.owner is not self:
            self.shared.owner = self
            self.shared.inner.synced_version = None  # another node's adapter is loaded: export ours
        self.shared.inner.sync_policy(policy)

    def sample(self, prompts, seeds, params, hooks):
        if self.shared.owner is not self:
            self.sync_policy(self.node.policy)
        return self.shared.inner.sample(prompts, seeds, params, hooks)

    def set_threads(self, n: int) -> None:
        self.shared.inner.set_threads(n)

    def close(self) -> None:
        return None  # the experiment closes the shared sampler once


def share_frozen_weights(dst_model, src_model) -> int:
    """Point dst's frozen parameters at src's (the same base weights): one copy in memory."""
    src = dict(src_model.named_parameters())
    shared = 0
    for name, p in dst_model.named_parameters():
        q = src.get(name)
        if not p.requires_grad and q is not None and q.shape == p.shape and q.dtype == p.dtype:
            p.data = q.data
            shared += 1
    return shared


_node_tag = ""  # the node whose call runs now: its log lines say which it is (one process, in turn)


def log_prefix() -> str:
    return f"[{_node_tag}] " if _node_tag else "sapo-experiment: "


_PER_DATASET = re.compile(r"eval/([a-z0-9_]+)/solve_rate")


def row(seed: int, arm: str, sharing: bool, i: int, r: int, m: dict[str, float], role: str = "") -> dict:
    """One CSV row (experiment_report.CSV_FIELDS, then the per-dataset held-out columns)."""
    judged = FLOOR_COLUMNS["floor_judged"] in m  # the floor scored peers' completions this round
    out = {
        "role": role,
        "seed": seed,
        "arm": arm,
        "sharing": int(sharing),
        "node": i,
        "round": r,
        "reward_mean": m.get("reward/mean", 0.0),
        "solve_rate": m.get("accuracy/mean", 0.0),
        "groups_local_with_signal": m.get("groups/local_with_signal", 0.0),
        "groups_external": m.get("groups/external", 0.0),
        "groups_trained": m.get("groups/trained", 0.0),
        "round_seconds": m.get("time/round", 0.0),
        "train_tokens": m.get("train/tokens", 0.0),
        "completions_cut": 1.0 - m["completions/finished_frac"] if "completions/finished_frac" in m else "",
        **{column: m.get(key, 0.0) for column, key in PHASE_COLUMNS.items()},
        **{column: m.get(key, 0.0) if judged else "" for column, key in FLOOR_COLUMNS.items()},
        "eval_solve_rate": m.get("eval/solve_rate", ""),
        "eval_solve_rate_base": m.get("eval/solve_rate_base", ""),
        "eval_capability": m.get("eval/capability", ""),
        "eval_capability_base": m.get("eval/capability_base", ""),
    }
    for key, value in m.items():  # the start-level held-out rate per dataset
        match = _PER_DATASET.fullmatch(key)
        if match:
            out[f"eval_solve_rate_{match.group(1)}"] = value
    return out


def _say_round(seed: int, label: str, i: int, r: int, rounds: int, m: dict[str, float]) -> None:
    held = f", held-out {m['eval/solve_rate']:.3f}" if "eval/solve_rate" in m else ""
    print(
        f"[seed {seed} {label} node{i}] round {r}/{rounds}: solved {m.get('accuracy/mean', 0):.3f}, "
        f"external {m.get('groups/external', 0):.0f}, {m.get('time/round', 0):.1f} s{held}",
        flush=True,
    )


def _evaluate_last(node, rows: list[dict]) -> None:
    """The held-out figures of a node stopped by --minutes, into its last row."""
    m = node.evaluate()
    if rows and m:
        last = rows[-1]
        rows[-1] = {**last, **{k: v for k, v in row(0, "", False, 0, 0, m).items() if k.startswith("eval_")}}


def run_arm(args: argparse.Namespace, config_of: ConfigOf, seed: int, arm) -> list[dict]:
    """args.nodes nodes of one arm in this process, in turn; their rows."""
    global _node_tag
    from sapo_core import paths
    from sapo_core.node import Node
    from sapo_core.sampler import make_sampler

    label = arm.name
    nodes: list[Any] = []
    shared: SharedSampler | None = None
    rows: list[dict] = []

    def factory(node):
        nonlocal shared
        if shared is None:
            inner, _ = make_sampler(node.cfg.sampler, node.policy, paths.cache_dir())
            if inner.name != "llamacpp":
                return inner  # transformers samples from the node's own model: nothing to share
            shared = SharedSampler(inner)
        return shared.view(node)

    if not logs.installed():  # a child of --jobs: spawned, it starts without the handler
        logs.to_stderr(prefix=log_prefix)
    veterans = _veteran_indices(args, config_of, seed, arm)
    roles = {i: "veteran" for i in veterans}
    try:
        join = None
        for i in veterans:
            _node_tag = f"s{seed} {label} v{i}"
            node = Node(_copy_veteran(args, config_of, seed, arm, i, join), sampler_factory=factory)
            node.setup()
            node.shape = RoundShape(
                node.cfg.round.local_groups, node.cfg.round.external_groups, node.cfg.sampler.group_size
            )
            if nodes:
                share_frozen_weights(node.policy.model, nodes[0].policy.model)
            elif node.source is not None:
                join = node.source.join_address
            nodes.append(node)
            rows.append(row(seed, label, True, i, 0, _last_evaluation(node), "veteran"))
        n_veterans = len(nodes)
        for i in range(args.nodes):
            _node_tag = f"s{seed} {label} n{i}"
            node = Node(config_of(seed, arm, i, join), sampler_factory=factory)
            node.setup()
            if nodes:
                share_frozen_weights(node.policy.model, nodes[0].policy.model)
            elif node.source is not None:
                join = node.source.join_address
            nodes.append(node)
        indices = [*veterans, *range(len(nodes) - n_veterans)]
        role_of = {k: roles.get(i, "newcomer" if veterans else "") for k, i in enumerate(indices)}
        deadline = time.monotonic() + args.minutes * 60 if args.minutes else None
        mine: list[list[dict]] = [[] for _ in nodes]
        for r in range(1, args.rounds + 1):
            for k, node in enumerate(nodes):
                i = indices[k]
                _node_tag = f"s{seed} {label} n{i}"
                m = node.run_round(final=r == args.rounds)
                mine[k].append(row(seed, label, node.cfg.swarm.enabled, i, r, m, role_of[k]))
                _say_round(seed, label, i, r, args.rounds, m)
            if deadline is not None and time.monotonic() > deadline and r < args.rounds:
                for i, node in enumerate(nodes):
                    _node_tag = f"s{seed} {label} n{i}"
                    _evaluate_last(node, mine[i])
                break
        rows += [x for rs in zip(*mine) for x in rs]
    finally:
        for node in nodes:
            node.close()
        if shared is not None:
            shared.inner.close()
        _node_tag = ""
    return rows


def _veteran_indices(args: argparse.Namespace, config_of: ConfigOf, seed: int, arm) -> list[int]:
    """The node indices of this run's veterans (--veterans): none in an isolated arm."""
    if not getattr(args, "veterans", None) or not config_of(seed, arm, 0, None).swarm.enabled:
        return []
    return [VETERAN_INDEX + v for v in range(args.veterans_per_seed)]


def _copy_veteran(args: argparse.Namespace, config_of: ConfigOf, seed: int, arm, index: int, join):
    """The config of veteran `index`, its run directory a fresh copy of a trained node's (seed s
    takes the pool's directories s*V .. s*V+V-1, round robin): it resumes where that run stopped."""
    import shutil

    v = index - VETERAN_INDEX
    pool = args.veterans
    source = Path(pool[(seed * args.veterans_per_seed + v) % len(pool)])
    cfg = config_of(seed, arm, index, join)
    target = Path(cfg.run_dir)
    if not target.exists():
        shutil.copytree(source, target, ignore=shutil.ignore_patterns("config.toml", "*.lock"))
        (target / "veteran-of.txt").write_text(f"{source.resolve()}\n")
    return cfg


def _last_evaluation(node) -> dict[str, float]:
    """A resumed node's last held-out figures, as its run store holds them (round 0's row)."""
    rounds, _ = node.store.series("eval/solve_rate")
    if not rounds:
        return {}
    for stored in node.store.rounds(since=rounds[-1] - 1, limit=1):
        return {k: v for k, v in stored.metrics.items() if k.startswith("eval/")}
    return {}


JOIN_WAIT_SECONDS = 600.0  # how long a node waits for its run's others (they may still be loading models)


def _run_folder(config) -> Path:
    """Where the nodes of one run meet: beside their run directories."""
    return Path(config.run_dir).parent


def _wait_for(paths: list[Path], what: str, failed: list[Path]) -> None:
    """Until every one of `paths` exists; RuntimeError when a node of the run failed (it wrote one
    of `failed`) or after JOIN_WAIT_SECONDS."""
    give_up = time.monotonic() + JOIN_WAIT_SECONDS
    while not all(p.exists() for p in paths):
        gone = next((p for p in failed if p.exists()), None)
        if gone is not None:
            raise RuntimeError(f"stopped waiting for {what}: {gone.name.split('-')[-1]} failed ({gone.read_text()})")
        if time.monotonic() > give_up:
            missing = ", ".join(p.name for p in paths if not p.exists())
            raise RuntimeError(f"waited {JOIN_WAIT_SECONDS:.0f} s for {what}: {missing} never came")
        time.sleep(0.2)


def _mark(path: Path, text: str = "") -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def run_node(args: argparse.Namespace, config_of: ConfigOf, seed: int, arm, index: int) -> list[dict]:
    """Node `index` of one (seed, arm) in this process, its rounds at its own pace; its rows.

    The run's nodes meet through files in their run folder (names carry the experiment's stamp):
    node 0 writes its swarm address once its DHT is up and the others join it; every node waits
    until all are set up before its first round, and until all are done before it leaves the swarm,
    so nobody trains its first or last rounds alone. A node that fails says so there, and the
    others stop waiting for it."""
    global _node_tag
    from sapo_core.node import Node

    label = arm.name
    _node_tag = f"s{seed} {label} n{index}"
    if not logs.installed():
        logs.to_stderr(prefix=log_prefix)
    plain = config_of(seed, arm, index, None)
    folder = _run_folder(plain)
    folder.mkdir(parents=True, exist_ok=True)
    stamp = getattr(args, "stamp", "run")
    address = folder / f"join-{stamp}"
    ready = [folder / f"ready-{stamp}-node{i}" for i in range(args.nodes)]
    done = [folder / f"done-{stamp}-node{i}" for i in range(args.nodes)]
    failed = [folder / f"failed-{stamp}-node{i}" for i in range(args.nodes)]
    node = None
    rows: list[dict] = []
    try:
        join = None
        if index > 0 and plain.swarm.enabled:
            _wait_for([address], "node 0's swarm address", failed)
            join = address.read_text().strip()
        node = Node(config_of(seed, arm, index, join))
        node.setup()
        if index == 0 and node.source is not None:
            _mark(address, node.source.join_address)
        _mark(ready[index])
        _wait_for(ready, "the run's other nodes to set up", failed)
        deadline = time.monotonic() + args.minutes * 60 if args.minutes else None
        for r in range(1, args.rounds + 1):
            m = node.run_round(final=r == args.rounds)
            rows.append(row(seed, label, node.cfg.swarm.enabled, index, r, m))
            _say_round(seed, label, index, r, args.rounds, m)
            if deadline is not None and time.monotonic() > deadline and r < args.rounds:
                _evaluate_last(node, rows)
                break
        _mark(done[index])
        _wait_for(done, "the run's other nodes to finish", failed)
    except BaseException as e:
        _mark(failed[index], f"{type(e).__name__}: {e}"[:500])
        raise
    finally:
        if node is not None:
            node.close()
        _node_tag = ""
    return rows


def run_units(
    args: argparse.Namespace,
    config_of: ConfigOf,
    out: Path,
    units: list[tuple[int, Any]],
    title: str,
    arms: list,
    specs: dict[str, str],
) -> list[dict]:
    """Each (seed, arm) run in a process of its own, `args.jobs` at a time, or with
    `args.node_processes` each of its nodes in one (`args.jobs` x nodes processes). Runs share
    nothing but the base model's cached evaluation (written atomically) and identity files, which
    only sharing arms read; two runs of one seed at once would race to create them, so they are
    created here first. Spawned, not forked: the children load torch themselves."""
    import concurrent.futures as cf
    import multiprocessing

    from sapo_core.swarm.identity import load_or_create_identity

    names = [a.name for a in arms]
    for seed, arm in units:
        if config_of(seed, arm, 0, None).swarm.enabled:
            for i in range(args.nodes):
                load_or_create_identity(Path(config_of(seed, arm, i, None).swarm.identity_path))
    per_node = bool(getattr(args, "node_processes", False))
    if per_node:  # a node waits for its run's node 0: each run's nodes are queued together, node 0 first
        work = [
            (run_node, (args, config_of, seed, arm, i), (seed, arm)) for seed, arm in units for i in range(args.nodes)
        ]
        workers = args.jobs * args.nodes
    else:
        work = [(run_arm, (args, config_of, seed, arm), (seed, arm)) for seed, arm in units]
        workers = args.jobs
    rows: list[dict] = []
    failed = []
    pool = cf.ProcessPoolExecutor(
        max_workers=workers,
        mp_context=multiprocessing.get_context("spawn"),
        initializer=_child_init,
        initargs=(os.getpid(),),
    )
    try:
        futures = {pool.submit(_child_run, fn, fargs): unit for fn, fargs, unit in work}
        for future in cf.as_completed(futures):
            seed, arm = futures[future]
            try:
                rows += future.result()
            except Exception as e:  # one failed run must not lose the others' rows
                failed.append(f"seed {seed} {arm.name}: {type(e).__name__}: {e}")
                print(f"sapo-experiment: seed {seed} {arm.name} failed: {e}", file=sys.stderr, flush=True)
            write_outputs(ordered(rows, names), out, title, names, specs)
    except BaseException:  # SIGTERM or Ctrl-C: no run may go on without us
        pool.shutdown(wait=False, cancel_futures=True)
        stop_children(grace=STOP_GRACE_SECONDS)
        raise
    pool.shutdown()
    if failed:
        raise SystemExit("sapo-experiment: runs failed (the others' rows are in experiment.csv): " + "; ".join(failed))
    return ordered(rows, names)


# how long a run has to close its nodes (sampler engines, p2pd daemons) once asked to stop
STOP_GRACE_SECONDS = 30.0
_stopping = False


def stopping() -> bool:
    return _stopping


def reset_stopping() -> None:
    global _stopping
    _stopping = False


def raise_on_sigterm(signum: int, frame: Any) -> None:
    """SIGTERM (`kill`, a scheduler's stop) unwinds as Ctrl-C does, so every node closes; a
    second one while that runs is ignored, so the closing itself is not cut short."""
    global _stopping
    if _stopping:
        return
    _stopping = True
    raise SystemExit(128 + signum)


def _child_init(parent: int) -> None:
    """A --jobs process: stop as the experiment does on SIGTERM, and stop by itself when the
    experiment is gone without telling it (killed with SIGKILL): an orphaned run would go on
    for the rest of its rounds on cores nobody is watching."""
    signal.signal(signal.SIGTERM, raise_on_sigterm)

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(1.0)
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(STOP_GRACE_SECONDS)  # the round thread is stuck: take its processes down
        stop_children(grace=0.0)
        os._exit(128 + signal.SIGTERM)

    threading.Thread(target=watch, name="parent-watch", daemon=True).start()


def _child_run(fn: Callable[..., list[dict]], fargs: tuple) -> list[dict]:
    """A run (or a node) in a --jobs process. Once told to stop, the process ends after the run
    has closed its nodes: the pool would otherwise hand it the next unit already queued."""
    if _stopping:
        os._exit(128 + signal.SIGTERM)
    try:
        return fn(*fargs)
    except KeyboardInterrupt:  # Ctrl-C reaches the whole process group
        os._exit(128 + signal.SIGINT)
    except BaseException:
        if _stopping:
            os._exit(128 + signal.SIGTERM)
        raise


def stop_children(grace: float) -> None:
    """SIGTERM to this process's children (each closes its nodes), then after `grace` seconds
    SIGKILL to every descendant still there, the ones a dead child left behind included (they
    are listed before anything is signalled: an orphan no longer shows as ours)."""
    import psutil

    me = psutil.Process()
    try:
        everyone = me.children(recursive=True)
        children = me.children()
    except psutil.Error:
        return
    for p in children:
        with contextlib.suppress(psutil.Error):
            p.terminate()
    psutil.wait_procs(children, timeout=grace)
    for p in everyone:
        with contextlib.suppress(psutil.Error):
            p.kill()
    psutil.wait_procs(everyone, timeout=5.0)


def ordered(rows: list[dict], arms: list[str]) -> list[dict]:
    """The rows in the order one process writes them: seed, arm, round, node."""
    return sorted(rows, key=lambda r: (r["seed"], arms.index(r["arm"]), r["round"], r["node"]))
