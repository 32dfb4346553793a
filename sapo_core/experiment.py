"""`sapo-experiment`: the SAPO paper's comparison, isolated against sharing, sized to be believed.

The paper (arXiv 2509.08721, §4) trains 8 nodes for 2000 rounds at the same number of groups per
update (I local + J external = 8) and compares 8/0 (isolated) with 4/4 (sharing) by total
training reward. Training reward rises with any curriculum and swings with the draw of questions,
so here the measure is the held-out evaluation (`sapo_core/evaluation.py`): every node's solve
rate on questions no node trains on, before round 1, every `--eval-every` rounds and after the
last. Per seed, the difference of the nodes' mean final solve rate (sharing - isolated); over
seeds, its mean with a 95 % t-interval. Writes `experiment.csv` (one row per seed, configuration,
node and round), `experiment.png` (held-out solve rate over rounds; each seed's difference) and
`summary.txt`.

Made affordable on a 2-core CPU (docs/experiment.md says what this simplifies):
- the nodes of one configuration live in one process and take their rounds in turn (round r of
  node 0, 1, ..., then round r + 1), so one round runs at a time on all cores;
- they share the frozen base weights (one copy in memory, one LoRA each) and one llama.cpp
  sampler, which swaps in each node's adapter before it samples;
- sharing nodes form a real swarm on loopback (own identity and DHT each); a node gathers what
  the others published in their latest round;
- small rounds (I + J = 2 groups of G = 4, <= 64 tokens by default).
"""

from __future__ import annotations

import argparse
import csv
import math
import re
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from sapo_core import logs
from sapo_core.config import DEFAULT_TASK_WEIGHTS, NodeConfig

CSV_FIELDS = (
    "seed",
    "config",
    "node",
    "round",
    "reward_mean",
    "solve_rate",
    "groups_local_with_signal",
    "groups_external",
    "groups_trained",
    "round_seconds",
    "eval_solve_rate",
    "eval_solve_rate_base",
)
# two-sided 95 % quantiles of Student's t by degrees of freedom (larger: the normal's 1.96)
_T975 = {
    1: 12.706,
    2: 4.303,
    3: 3.182,
    4: 2.776,
    5: 2.571,
    6: 2.447,
    7: 2.365,
    8: 2.306,
    9: 2.262,
    10: 2.228,
    15: 2.131,
    20: 2.086,
    30: 2.042,
}


def parse_configs(text: str) -> list[tuple[int, int]]:
    """'2/0,1/1' -> [(2, 0), (1, 1)]; every I >= 1 and J >= 0."""
    out = []
    for part in text.split(","):
        try:
            i, j = (int(x) for x in part.strip().split("/"))
        except ValueError:
            raise SystemExit(f"--configs: '{part}' is not I/J, e.g. 2/0,1/1") from None
        if i < 1 or j < 0:
            raise SystemExit(f"--configs: '{part}' needs I >= 1 and J >= 0")
        out.append((i, j))
    return out


def node_config(
    args: argparse.Namespace, out: Path, seed: int, label: str, index: int, local: int, external: int, join: str | None
) -> NodeConfig:
    weights = {t: 1.0 for t in args.tasks.split(",")} if args.tasks else dict(DEFAULT_TASK_WEIGHTS)
    tag = f"seed{seed}-{label.replace('/', '-')}"
    return NodeConfig().replace(
        **{
            "run_dir": str(out / "runs" / tag / f"node{index}"),
            "seed": seed * 1000 + index,
            "model.name": args.model,
            "tasks.weights": weights,
            "sampler.group_size": args.group_size,
            "sampler.max_new_tokens": args.max_new_tokens,
            "sampler.threads": args.threads,
            "round.local_groups": local,
            "round.external_groups": external,
            "round.auto_scale": False,
            "swarm.enabled": external > 0,
            "swarm.swarm_name": f"experiment-{tag}-{args.stamp}",
            "swarm.host_maddrs": ["/ip4/127.0.0.1/tcp/0"],
            "swarm.window_seconds": args.window_seconds,
            "swarm.gather_timeout": 3.0,
            "swarm.publish_timeout": 5.0,
            "swarm.identity_path": str(out / "identities" / f"seed{seed}-node{index}.key"),
            "swarm.initial_peers": [join] if join else [],
            "eval.enabled": True,
            "eval.every_rounds": args.eval_every,
            "eval.max_share": 1.0,  # as asked, not skipped
            "eval.questions": args.eval_questions,
            "eval.samples": args.eval_samples,
            "eval.greedy": False,
        }
    )


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


_node_tag = ""  # the node whose call runs now: its log lines say which it is (one process, round-robin)


def _log_prefix() -> str:
    return f"[{_node_tag}] " if _node_tag else "sapo-experiment: "


def _row(seed: int, label: str, i: int, r: int, m: dict[str, float]) -> dict:
    return {
        "seed": seed,
        "config": label,
        "node": i,
        "round": r,
        "reward_mean": m.get("reward/mean", 0.0),
        "solve_rate": m.get("accuracy/mean", 0.0),
        "groups_local_with_signal": m.get("groups/local_with_signal", 0.0),
        "groups_external": m.get("groups/external", 0.0),
        "groups_trained": m.get("groups/trained", 0.0),
        "round_seconds": m.get("time/round", 0.0),
        "eval_solve_rate": m.get("eval/solve_rate", ""),
        "eval_solve_rate_base": m.get("eval/solve_rate_base", ""),
    }


def run_configuration(args: argparse.Namespace, out: Path, seed: int, local: int, external: int) -> list[dict]:
    """args.nodes nodes of one configuration in this process, round-robin; their rows."""
    global _node_tag
    from sapo_core import paths
    from sapo_core.node import Node
    from sapo_core.sampler import make_sampler

    label = f"{local}/{external}"
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
        logs.to_stderr(prefix=_log_prefix)
    try:
        join = None
        for i in range(args.nodes):
            _node_tag = f"s{seed} {label} n{i}"
            node = Node(node_config(args, out, seed, label, i, local, external, join), sampler_factory=factory)
            node.setup()
            if nodes:
                share_frozen_weights(node.policy.model, nodes[0].policy.model)
            elif node.source is not None:
                join = node.source.join_address
            nodes.append(node)
        for r in range(1, args.rounds + 1):
            for i, node in enumerate(nodes):
                _node_tag = f"s{seed} {label} n{i}"
                m = node.run_round(final=r == args.rounds)
                rows.append(_row(seed, label, i, r, m))
                held = f", held-out {m['eval/solve_rate']:.3f}" if "eval/solve_rate" in m else ""
                print(
                    f"[seed {seed} {label} node{i}] round {r}/{args.rounds}: solved {m.get('accuracy/mean', 0):.3f}, "
                    f"external {m.get('groups/external', 0):.0f}, {m.get('time/round', 0):.1f} s{held}",
                    flush=True,
                )
    finally:
        for node in nodes:
            node.close()
        if shared is not None:
            shared.inner.close()
        _node_tag = ""
    return rows


def _run_in_processes(
    args: argparse.Namespace, out: Path, units: list[tuple[int, int, int]], title: str, labels: list[str]
) -> list[dict]:
    """Each (seed, configuration) run in a process of its own, `args.jobs` at a time. Runs share
    nothing but the base model's cached evaluation (written atomically) and identity files, which
    only sharing configurations read; two runs of one seed at once would race to create them, so
    they are created here first. Spawned, not forked: the children load torch themselves."""
    import concurrent.futures as cf
    import multiprocessing

    from sapo_core.swarm.identity import load_or_create_identity

    for seed, _, external in units:
        if external:
            for i in range(args.nodes):
                load_or_create_identity(Path(node_config(args, out, seed, "x", i, 1, 1, None).swarm.identity_path))
    rows: list[dict] = []
    failed = []
    with cf.ProcessPoolExecutor(max_workers=args.jobs, mp_context=multiprocessing.get_context("spawn")) as pool:
        futures = {pool.submit(run_configuration, args, out, *unit): unit for unit in units}
        for future in cf.as_completed(futures):
            seed, local, external = futures[future]
            try:
                rows += future.result()
            except Exception as e:  # one failed run must not lose the others' rows
                failed.append(f"seed {seed} {local}/{external}: {type(e).__name__}: {e}")
                print(f"sapo-experiment: seed {seed} {local}/{external} failed: {e}", file=sys.stderr, flush=True)
            write_outputs(_ordered(rows, labels), out, title, labels)
    if failed:
        raise SystemExit("sapo-experiment: runs failed (the others' rows are in experiment.csv): " + "; ".join(failed))
    return _ordered(rows, labels)


def _ordered(rows: list[dict], labels: list[str]) -> list[dict]:
    """The rows in the order one process writes them: seed, configuration, round, node."""
    return sorted(rows, key=lambda r: (r["seed"], labels.index(r["config"]), r["round"], r["node"]))


# --- the measure ----------------------------------------------------------------------------------


def final_solve_rates(rows: list[dict]) -> dict[tuple[int, str], list[float]]:
    """(seed, config) -> each node's held-out solve rate at its last evaluated round."""
    last: dict[tuple[int, str, int], tuple[int, float]] = {}
    for r in rows:
        if r["eval_solve_rate"] != "":
            key = (int(r["seed"]), r["config"], int(r["node"]))
            if key not in last or int(r["round"]) >= last[key][0]:
                last[key] = (int(r["round"]), float(r["eval_solve_rate"]))
    out: dict[tuple[int, str], list[float]] = {}
    for (seed, config, _node), (_, rate) in sorted(last.items()):
        out.setdefault((seed, config), []).append(rate)
    return out


def mean_ci(xs: list[float]) -> tuple[float, float, float]:
    """Mean and its two-sided 95 % t-interval (the mean itself for one value)."""
    m = statistics.fmean(xs)
    if len(xs) < 2:
        return m, m, m
    df = len(xs) - 1
    t = _T975.get(df) or next((v for k, v in sorted(_T975.items()) if k >= df), 1.96)
    half = t * statistics.stdev(xs) / math.sqrt(len(xs))
    return m, m - half, m + half


def difference(rows: list[dict], isolated: str, sharing: str) -> tuple[list[float], tuple[float, float, float]]:
    """Per seed: mean final solve rate of the sharing nodes - that of the isolated nodes; and the
    mean of those with its 95 % t-interval over seeds."""
    finals = final_solve_rates(rows)
    seeds = sorted({s for s, c in finals if c == isolated} & {s for s, c in finals if c == sharing})
    diffs = [statistics.fmean(finals[(s, sharing)]) - statistics.fmean(finals[(s, isolated)]) for s in seeds]
    return diffs, (mean_ci(diffs) if diffs else (math.nan, math.nan, math.nan))


def training_difference(
    rows: list[dict], isolated: str, sharing: str
) -> tuple[list[float], tuple[float, float, float]]:
    """The paper's kind of measure beside the held-out one: per seed, the mean over nodes and rounds
    of the training solve rate of the node's own questions, sharing - isolated; over seeds, its
    mean and 95 % t-interval. Each node's curriculum sets how hard its questions are, so a node that
    climbs faster can show less here while learning more (the held-out set does not move)."""
    per: dict[tuple[int, str], list[float]] = {}
    for r in rows:
        per.setdefault((int(r["seed"]), r["config"]), []).append(float(r["solve_rate"]))
    seeds = sorted({s for s, c in per if c == isolated} & {s for s, c in per if c == sharing})
    diffs = [statistics.fmean(per[(s, sharing)]) - statistics.fmean(per[(s, isolated)]) for s in seeds]
    return diffs, (mean_ci(diffs) if diffs else (math.nan, math.nan, math.nan))


def _interval(lo: float, hi: float, n: int) -> str:
    """'95% CI -0.1..+0.2', or why there is none: the seed is the unit of replication."""
    return f"95% CI {lo:+.3f}..{hi:+.3f}" if n >= 2 else "no interval from one seed"


def write_outputs(rows: list[dict], out: Path, title: str, configs: list[str]) -> list[str]:
    with open(out / "experiment.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=CSV_FIELDS)
        writer.writeheader()
        writer.writerows(rows)
    finals = final_solve_rates(rows)
    lines = []
    for c in configs:
        rates = [x for (s, cc), xs in finals.items() if cc == c for x in xs]
        mine = [r for r in rows if r["config"] == c]
        if rates:
            m, lo, hi = mean_ci(rates)
            ext = statistics.fmean(r["groups_external"] for r in mine)
            lines.append(
                f"{c}: final held-out solve rate {m:.3f} (95% CI {lo:.3f}..{hi:.3f}) over {len(rates)} nodes, "
                f"{ext:.2f} external groups per node-round"
            )
    diffs: list[float] = []
    if len(configs) >= 2:
        for c in configs[1:]:
            diffs, (m, lo, hi) = difference(rows, configs[0], c)
            if diffs:
                lines.append(
                    f"{c} - {configs[0]}: {m:+.3f} ({_interval(lo, hi, len(diffs))}) over {len(diffs)} "
                    f"seed{'s' * (len(diffs) != 1)}; per seed " + ", ".join(f"{d:+.3f}" for d in diffs)
                )
            train, (m, lo, hi) = training_difference(rows, configs[0], c)
            if train:
                lines.append(
                    f"  training solve rate over all rounds (own questions, each node's curriculum), "
                    f"{c} - {configs[0]}: {m:+.3f} ({_interval(lo, hi, len(train))}); per seed "
                    + ", ".join(f"{d:+.3f}" for d in train)
                )
    (out / "summary.txt").write_text(title + "\n" + "\n".join(lines) + "\n")
    if not _plot(rows, out / "experiment.png", title, configs):
        lines.append(PLOT_NEEDS_MATPLOTLIB)
    return lines


# matplotlib is an optional extra (pyproject.toml): a volunteer's node never draws.
PLOT_NEEDS_MATPLOTLIB = (
    "experiment.png not drawn: matplotlib is not installed (pip install 'sapo-swarm[experiment]', "
    "or pip install matplotlib, then sapo-experiment --from-csv experiment.csv draws it); "
    "experiment.csv and summary.txt are written"
)


def _plot(rows: list[dict], path: Path, title: str, configs: list[str]) -> bool:
    """Draws `path`; False, drawing nothing, where matplotlib is not installed."""
    try:
        import matplotlib
    except ImportError:
        return False

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax, bx) = plt.subplots(1, 2, figsize=(10, 4.2), dpi=120, gridspec_kw={"width_ratios": [3, 1]})
    for c in configs:
        by_round: dict[int, list[float]] = {}
        for r in rows:
            if r["config"] == c and r["eval_solve_rate"] != "":
                by_round.setdefault(int(r["round"]), []).append(float(r["eval_solve_rate"]))
        xs = sorted(by_round)
        ax.plot(xs, [statistics.fmean(by_round[x]) for x in xs], marker="o", label=f"{c} (local/external)")
    ax.set_xlabel("round")
    ax.set_ylabel("held-out solve rate (mean over nodes and seeds)")
    ax.set_title(title, fontsize=8)
    ax.grid(alpha=0.3)
    ax.legend()
    if len(configs) >= 2:
        diffs, (m, lo, hi) = difference(rows, configs[0], configs[1])
        bx.scatter([0] * len(diffs), diffs, color="gray", label="one seed")
        if diffs:
            bx.errorbar([0.3], [m], yerr=[[m - lo], [hi - m]], fmt="o", color="black", capsize=4, label="mean, 95% CI")
        bx.axhline(0, color="red", lw=0.8)
        bx.set_xlim(-0.5, 0.8)
        bx.set_xticks([])
        bx.set_title(f"{configs[1]} - {configs[0]}, final", fontsize=8)
        bx.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return True


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="sapo-experiment", description=__doc__.splitlines()[0])
    p.add_argument("--nodes", type=int, default=4, help="nodes per configuration, N")
    p.add_argument("--seeds", type=int, default=3, help="repetitions with other seeds")
    p.add_argument("--rounds", type=int, default=100, help="rounds per node")
    p.add_argument(
        "--configs",
        default="2/0,1/1",
        help="I/J configurations, the same I + J each; the first is the baseline the others are compared with",
    )
    p.add_argument("--model", default="smollm2-135m-instruct", help="catalogue id (tiny-random for a dry run)")
    p.add_argument("--tasks", default="", help="comma-separated datasets (default: the node's easy mix)")
    p.add_argument("--group-size", type=int, default=4, help="completions per question, G")
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--threads", type=int, default=0, help="sampler and torch threads (0 = physical cores)")
    p.add_argument("--eval-every", type=int, default=50, help="held-out evaluation every this many rounds")
    p.add_argument("--eval-questions", type=int, default=16, help="held-out questions per dataset")
    p.add_argument("--eval-samples", type=int, default=2, help="completions per held-out question")
    p.add_argument("--window-seconds", type=float, default=60.0, help="swarm.window_seconds")
    p.add_argument(
        "--jobs",
        type=int,
        default=1,
        help="(seed, configuration) runs at once, each in its own process "
        "(on 2 cores: --jobs 2 --threads 1, one run per core)",
    )
    p.add_argument("--seed", type=int, default=0, help="first seed")
    p.add_argument("--out", default="", help="output directory (default: experiment-<time> here)")
    p.add_argument(
        "--from-csv",
        nargs="+",
        default=[],
        metavar="CSV",
        help="run nothing: the summary, plot and CSV of the rows in these experiment.csv files together "
        "(seeds run at different times or on other machines, with the same settings)",
    )
    logs.add_level_argument(p)
    return p


def read_rows(paths: list[str]) -> tuple[list[dict], str]:
    """The rows of experiment.csv files, numbers as numbers; a row of a later file replaces the same
    (seed, configuration, node, round) of an earlier one. Also the first file's title (summary.txt
    beside it), which says the settings."""
    rows: dict[tuple, dict] = {}
    title = ""
    for name in paths:
        path = Path(name)
        try:
            with open(path, newline="") as f:
                reader = csv.DictReader(f)
                if reader.fieldnames is None or set(CSV_FIELDS) - set(reader.fieldnames):
                    raise SystemExit(f"sapo-experiment: {path} is not an experiment.csv (columns: {reader.fieldnames})")
                for r in reader:
                    row = {k: r[k] for k in CSV_FIELDS}
                    for k in ("seed", "node", "round"):
                        row[k] = int(row[k])
                    for k in CSV_FIELDS[4:]:
                        row[k] = float(row[k]) if row[k] != "" else ""
                    rows[(row["seed"], row["config"], row["node"], row["round"])] = row
        except (OSError, ValueError) as e:
            raise SystemExit(f"sapo-experiment: cannot read {path}: {e}") from None
        summary = path.with_name("summary.txt")
        if not title and summary.is_file():
            title = next(iter(summary.read_text().splitlines()), "")
    return list(rows.values()), title


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logs.apply_level_argument(args)
    logs.to_stderr(prefix=_log_prefix)
    configs = parse_configs(args.configs)
    if args.from_csv:
        rows, title = read_rows(args.from_csv)
        out = Path(args.out or f"experiment-merged-{time.strftime('%Y%m%d-%H%M%S')}").resolve()
        out.mkdir(parents=True, exist_ok=True)
        present = {r["config"] for r in rows}
        labels = [f"{i}/{j}" for i, j in configs if f"{i}/{j}" in present]
        seeds = sorted({r["seed"] for r in rows})
        # the first file's title names its own seed count: say the merged one
        title = re.sub(r" x \d+ seeds?\b", f" x {len(seeds)} seeds", title or "SAPO experiment")
        title = f"{title} (seeds {', '.join(map(str, seeds))} from {len(args.from_csv)} file(s))"
        for line in write_outputs(_ordered(rows, labels), out, title, labels):
            print(line)
        return 0
    if len({i + j for i, j in configs}) != 1:
        print(
            "sapo-experiment: warning: the configurations do not all train on the same number of groups "
            "per update (I + J), so they are not the paper's comparison",
            file=sys.stderr,
        )
    if args.nodes < 1 or args.rounds < 1 or args.seeds < 1:
        raise SystemExit("--nodes, --rounds and --seeds must be at least 1")
    args.stamp = time.strftime("%Y%m%d-%H%M%S")
    out = Path(args.out or f"experiment-{args.stamp}").resolve()
    out.mkdir(parents=True, exist_ok=True)
    labels = [f"{i}/{j}" for i, j in configs]
    title = (
        f"SAPO: {args.nodes} nodes x {args.rounds} rounds x {args.seeds} seeds, {args.model}, "
        f"G={args.group_size}, <={args.max_new_tokens} tokens, held-out {args.eval_questions} q/dataset "
        f"x {args.eval_samples}"
    )
    print(title, f"-> {out}", flush=True)
    rows: list[dict] = []
    started = time.time()
    seeds = range(args.seed, args.seed + args.seeds)
    units = [(seed, local, external) for seed in seeds for local, external in configs]
    if args.jobs <= 1:
        for seed, local, external in units:
            rows += run_configuration(args, out, seed, local, external)
            write_outputs(rows, out, title, labels)  # keep what is done if a later run fails
    else:
        rows = _run_in_processes(args, out, units, title, labels)
    lines = write_outputs(rows, out, title, labels)
    print(f"done in {(time.time() - started) / 60:.1f} min; {out / 'experiment.csv'}, {out / 'experiment.png'}")
    for line in lines:
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
