"""The measure of `sapo-experiment`: final held-out solve rates, each arm's difference from the
first arm over paired replicates with a 95 % t-interval, and the summary's lines; the columns of
a row. The files that hold them (`experiment.csv`, `summary.txt`, `experiment.png`, read back by
`--from-csv`) are `sapo_core/experiment_files.py`.

The replication unit (docs/experiment.md, "Recipe lab"): an isolated arm's nodes are independent
runs (own seed, own questions, own LoRA), so each node is a replicate; the nodes of a sharing arm
train on each other's groups, so there the seed is the replicate (the mean over its nodes). Node
i of seed s has the same seeds in every arm, so two isolated arms are compared pair by pair on
(seed, node): common random numbers, the pair differs by the recipe. Where either arm shares, the
pairs are seeds (each arm's mean over its nodes).

Imports only the standard library (matplotlib where it draws): `--from-csv` needs no torch.
"""

from __future__ import annotations

import math
import re
import statistics
from dataclasses import dataclass

from sapo_core.config import PAPER_SPECIALTIES

# where a node-round's time goes: the CSV's column -> the node's metric (files written before
# 2026-11-27 have none of them); eval_seconds is the held-out evaluation's, outside the round
PHASE_COLUMNS = {
    "update_seconds": "time/update",
    "sample_seconds": "time/sample",
    "likelihood_seconds": "time/likelihood",
    "eval_seconds": "time/eval",
}
CSV_FIELDS = (
    "seed",
    "arm",
    "sharing",
    "node",
    "round",
    "reward_mean",
    "solve_rate",
    "groups_local_with_signal",
    "groups_external",
    "groups_trained",
    "round_seconds",
    "train_tokens",
    "completions_cut",  # the share of the round's own completions cut at sampler.max_new_tokens
    *PHASE_COLUMNS,
    "eval_solve_rate",
    "eval_solve_rate_base",
    "eval_capability",
    "eval_capability_base",
    "role",
)
# then one `eval_solve_rate_<dataset>` column per dataset evaluated (the node's `eval/<dataset>/solve_rate`)
DATASET_PREFIX = "eval_solve_rate_"

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


def mean_ci(xs: list[float]) -> tuple[float, float, float]:
    """Mean and its two-sided 95 % t-interval (the mean itself for one value)."""
    m = statistics.fmean(xs)
    if len(xs) < 2:
        return m, m, m
    df = len(xs) - 1
    t = _T975.get(df) or next((v for k, v in sorted(_T975.items()) if k >= df), 1.96)
    half = t * statistics.stdev(xs) / math.sqrt(len(xs))
    return m, m - half, m + half


def interval_words(lo: float, hi: float, n: int, unit: str, fmt: str = ".3f") -> str:
    """'95% CI 0.1..0.2' (numbers in `fmt`), or why there is none: one replicate has no spread,
    and mean_ci's zero-width interval would read as certainty."""
    return f"95% CI {lo:{fmt}}..{hi:{fmt}}" if n >= 2 else f"no interval from one {unit}"


def dataset_columns(rows: list[dict]) -> list[str]:
    """The per-dataset held-out columns present in the rows, in the datasets' usual order."""
    present = {k for r in rows for k in r if k.startswith(DATASET_PREFIX)}
    return [DATASET_PREFIX + d for d in PAPER_SPECIALTIES if DATASET_PREFIX + d in present]


def arm_sharing(rows: list[dict]) -> dict[str, bool]:
    """arm -> whether its nodes shared (a swarm): the `sharing` column; in a file written before it
    existed, J > 0 in an I/J configuration's name, else any external group trained."""
    out: dict[str, bool] = {}
    for r in rows:
        arm, flag = r["arm"], r.get("sharing", "")
        if flag != "":
            out[arm] = out.get(arm, False) or bool(int(flag))
            continue
        ij = re.fullmatch(r"(\d+)/(\d+)", arm)
        out[arm] = out.get(arm, False) or (int(ij.group(2)) > 0 if ij else float(r["groups_external"] or 0) > 0)
    return out


# --- the measure ----------------------------------------------------------------------------------

NodeKey = tuple[int, str, int]  # (seed, arm, node)


def final_values(rows: list[dict], column: str = "eval_solve_rate") -> dict[NodeKey, float]:
    """(seed, arm, node) -> `column` at the node's last round where it was measured."""
    last: dict[NodeKey, tuple[int, float]] = {}
    for r in rows:
        v = r.get(column, "")
        if v != "":
            key = (int(r["seed"]), r["arm"], int(r["node"]))
            if key not in last or int(r["round"]) >= last[key][0]:
                last[key] = (int(r["round"]), float(v))
    return {k: v for k, (_, v) in sorted(last.items())}


def training_values(rows: list[dict]) -> dict[NodeKey, float]:
    """(seed, arm, node) -> the node's training solve rate (its own questions) over all its rounds."""
    per: dict[NodeKey, list[float]] = {}
    for r in rows:
        per.setdefault((int(r["seed"]), r["arm"], int(r["node"])), []).append(float(r["solve_rate"]))
    return {k: statistics.fmean(v) for k, v in sorted(per.items())}


def unit_values(values: dict[NodeKey, float], arm: str, sharing: bool) -> dict[tuple, float]:
    """An arm's replicates: (seed, node) -> the node's value where isolated; (seed,) -> the mean over
    the seed's nodes where sharing (one swarm: its nodes are not independent)."""
    if not sharing:
        return {(s, n): v for (s, a, n), v in values.items() if a == arm}
    per_seed: dict[tuple, list[float]] = {}
    for (s, a, _n), v in values.items():
        if a == arm:
            per_seed.setdefault((s,), []).append(v)
    return {k: statistics.fmean(v) for k, v in per_seed.items()}


@dataclass(frozen=True)
class Comparison:
    """One arm against the baseline: the paired replicates' differences and their mean's 95 % CI."""

    unit: str  # "node" (both arms isolated: pairs of (seed, node)) or "seed"
    keys: list[tuple]
    diffs: list[float]
    mean: float
    lo: float
    hi: float

    @property
    def n(self) -> int:
        return len(self.diffs)

    def interval(self) -> str:
        """'95% CI -0.1..+0.2', or why there is none."""
        return interval_words(self.lo, self.hi, self.n, self.unit, "+.3f")

    def units(self) -> str:
        """'8 (seed, node) pairs' or '3 seeds'."""
        if self.unit == "node":
            return f"{self.n} (seed, node) pair{'s' * (self.n != 1)}"
        return f"{self.n} seed{'s' * (self.n != 1)}"


def compare(values: dict[NodeKey, float], sharing: dict[str, bool], baseline: str, arm: str) -> Comparison:
    """arm - baseline, paired: by (seed, node) when both are isolated (node i of seed s has the same
    seeds in both), else by seed (each arm's mean over the seed's nodes)."""
    both_isolated = not sharing.get(baseline, False) and not sharing.get(arm, False)
    if both_isolated:
        a, b = unit_values(values, arm, False), unit_values(values, baseline, False)
    else:  # an isolated arm's seed mean is as good a seed replicate as a sharing arm's
        a, b = unit_values(values, arm, True), unit_values(values, baseline, True)
    keys = sorted(set(a) & set(b))
    diffs = [a[k] - b[k] for k in keys]
    m, lo, hi = mean_ci(diffs) if diffs else (math.nan, math.nan, math.nan)
    return Comparison("node" if both_isolated else "seed", keys, diffs, m, lo, hi)


def difference(rows: list[dict], baseline: str, arm: str, column: str = "eval_solve_rate") -> Comparison:
    """arm - baseline in final held-out `column`, paired as `compare` says."""
    return compare(final_values(rows, column), arm_sharing(rows), baseline, arm)


def training_difference(rows: list[dict], baseline: str, arm: str) -> Comparison:
    """The paper's kind of measure beside the held-out one: the training solve rate of each node's
    own questions over all rounds, arm - baseline, paired as `compare` says. Each node's curriculum
    sets how hard its questions are, so a node that climbs faster can show less here while
    learning more (the held-out set does not move)."""
    return compare(training_values(rows), arm_sharing(rows), baseline, arm)


def total_rewards(rows: list[dict], arm: str) -> dict[int, float]:
    """seed -> the SAPO paper's own measure (§4, 'total reward'): the arm's training reward summed
    over its nodes and rounds, each node-round counting the mean reward of its own completions.
    Like `training_difference` it follows each node's curriculum; the paper reports it for one run
    per configuration (8/0 561.79, 4/4 1093.31 over 8 nodes x 2000 rounds)."""
    out: dict[int, float] = {}
    for r in rows:
        if r["arm"] == arm and r.get("reward_mean", "") != "":
            out[int(r["seed"])] = out.get(int(r["seed"]), 0.0) + float(r["reward_mean"])
    return dict(sorted(out.items()))


def reward_lines(rows: list[dict], arms: list[str]) -> list[str]:
    """The paper's measure per arm (mean over seeds) and each arm's % over the first, per seed."""
    totals = {a: total_rewards(rows, a) for a in arms}
    base = totals.get(arms[0], {}) if arms else {}
    lines = []
    for arm in arms:
        t = totals[arm]
        if not t:
            continue
        nodes = len({(int(r["seed"]), int(r["node"])) for r in rows if r["arm"] == arm}) / len(t)
        rounds = max(int(r["round"]) for r in rows if r["arm"] == arm)
        m, lo, hi = mean_ci(list(t.values()))
        interval = interval_words(lo, hi, len(t), "seed", ".2f")
        line = (
            f"{arm}: total training reward (the paper's measure) {m:.2f} ({interval}) "
            f"over {len(t)} seed{'s' * (len(t) != 1)}, {nodes:g} nodes x {rounds} rounds each"
        )
        pct = [100 * (t[s] / base[s] - 1) for s in sorted(set(t) & set(base)) if base[s] > 0]
        if arm != arms[0] and pct:
            pm, plo, phi = mean_ci(pct)
            ci = f" (95% CI {plo:+.0f}..{phi:+.0f} %)" if len(pct) > 1 else ""
            line += f"; {pm:+.0f} %{ci} over {arms[0]}, per seed " + ", ".join(f"{x:+.0f} %" for x in pct)
        lines.append(line)
    return lines


@dataclass(frozen=True)
class ArmCost:
    """What an arm's rounds cost, and its held-out gain per node-hour of rounds."""

    round_seconds: float  # mean per node-round, evaluation not counted
    train_tokens: float | None  # mean tokens the update processed per node-round (all K steps)
    node_hours: float  # mean per node, rounds only
    gain: float | None  # mean final held-out solve rate - the base model's
    phases: dict[str, float] | None = None  # PHASE_COLUMNS' mean seconds per node-round, where the CSV has them

    @property
    def gain_per_node_hour(self) -> float | None:
        return self.gain / self.node_hours if self.gain is not None and self.node_hours > 0 else None


def node_hours(rows: list[dict]) -> dict[NodeKey, float]:
    """(seed, arm, node) -> hours of the node's rounds (their `round_seconds`, evaluation not counted)."""
    hours: dict[NodeKey, float] = {}
    for r in rows:
        key = (int(r["seed"]), r["arm"], int(r["node"]))
        hours[key] = hours.get(key, 0.0) + float(r["round_seconds"] or 0) / 3600
    return hours


def node_gains(rows: list[dict]) -> dict[NodeKey, float]:
    """(seed, arm, node) -> the node's final held-out solve rate - the base model's, where both were measured."""
    finals, bases = final_values(rows), final_values(rows, "eval_solve_rate_base")
    return {k: v - bases[k] for k, v in finals.items() if k in bases}


def arm_cost(rows: list[dict], arm: str) -> ArmCost:
    mine = [r for r in rows if r["arm"] == arm]
    hours = node_hours(mine)
    tokens = [float(r["train_tokens"]) for r in mine if r.get("train_tokens", "") != ""]
    gains = node_gains(mine)
    timed = [r for r in mine if all(r.get(c, "") != "" for c in PHASE_COLUMNS)]
    return ArmCost(
        round_seconds=statistics.fmean(float(r["round_seconds"] or 0) for r in mine) if mine else 0.0,
        train_tokens=statistics.fmean(tokens) if tokens else None,
        node_hours=statistics.fmean(hours.values()) if hours else 0.0,
        gain=statistics.fmean(gains.values()) if gains else None,
        phases={c: statistics.fmean(float(r[c]) for r in timed) for c in PHASE_COLUMNS} if timed else None,
    )


def hourly_gains(rows: list[dict]) -> dict[NodeKey, float]:
    """(seed, arm, node) -> the node's final held-out gain over the base model per hour of its
    rounds: what a volunteer's node-hour bought."""
    hours = node_hours(rows)
    return {k: g / hours[k] for k, g in node_gains(rows).items() if hours.get(k, 0.0) > 0}


def hourly_difference(rows: list[dict], baseline: str, arm: str) -> Comparison:
    """arm - baseline in held-out gain per node-hour of rounds, paired as `compare` says: the
    per-CPU-hour figure with an interval. Round seconds move with the machine's load, so it holds
    only between arms whose runs shared the same conditions (one run, or runs alone on the machine)."""
    return compare(hourly_gains(rows), arm_sharing(rows), baseline, arm)


def phase_words(cost: ArmCost) -> str | None:
    """Where an arm's node-round goes: the update, sampling, checking peers' text (the likelihood
    floor's forward pass), the rest of the round; and the held-out evaluation beside it, spread
    over the rounds (it runs before the first and after the last, outside them)."""
    if not cost.phases or cost.round_seconds <= 0:
        return None
    p, whole = cost.phases, cost.round_seconds
    named = {
        "update": p["update_seconds"],
        "sampling": p["sample_seconds"],
        "checking peers' text": p["likelihood_seconds"],
    }
    named["the rest"] = max(0.0, whole - sum(named.values()))
    parts = ", ".join(f"{k} {v:.2f} s ({100 * v / whole:.0f} %)" for k, v in named.items() if v >= 0.005)
    return f"  a node-round's {whole:.2f} s: {parts}; held-out evaluation {p['eval_seconds']:.2f} s more per node-round"


def tail_words(rows: list[dict]) -> str | None:
    """What completions cut at the length limit cost an arm's rounds: a round waits for its longest
    completion, and trains on it. The share of node-rounds with one, their mean seconds against
    the others', and how much they add to the rounds' time (files before 2026-11-28 lack the column)."""
    timed = [
        (float(r["completions_cut"]) > 0, float(r["round_seconds"] or 0))
        for r in rows
        if r.get("completions_cut", "") != ""
    ]
    cut, clean = [t for c, t in timed if c], [t for c, t in timed if not c]
    if not cut or not clean:
        return None
    added = 1 - statistics.fmean(clean) / statistics.fmean(t for _, t in timed)
    return (
        f"  node-rounds with a completion cut at the length limit: {100 * len(cut) / len(timed):.0f} %, "
        f"{statistics.fmean(cut):.2f} s against {statistics.fmean(clean):.2f} s; they add {100 * added:.0f} % "
        "to the rounds' time"
    )


def _short(column: str) -> str:
    return column.removeprefix(DATASET_PREFIX)


def veteran_lines(rows: list[dict], arms: list[str]) -> list[str]:
    """With veterans (--veterans): their held-out level when the run began (their own run's last
    evaluation, round 0) and at its end, and per arm how many rounds its newcomers took to reach
    the veterans' starting level (the first evaluation at or above it), seed by seed."""
    vets = [r for r in rows if r.get("role") == "veteran"]
    if not vets:
        return []
    start = {}  # seed -> the veterans' mean held-out at round 0
    for seed in sorted({int(r["seed"]) for r in vets}):
        xs = [float(r["eval_solve_rate"]) for r in vets if int(r["seed"]) == seed and int(r["round"]) == 0]
        xs = [x for x in xs if x == x]
        if xs:
            start[seed] = statistics.fmean(xs)
    end = list(final_values(vets).values())
    lines = [
        f"veterans: held-out {statistics.fmean(start.values()):.3f} when the newcomers joined, "
        f"{statistics.fmean(end) if end else float('nan'):.3f} at the end ({len(start)} seeds)"
    ]
    for arm in arms:
        reached = []
        for seed, level in start.items():
            evals = sorted(
                (int(r["round"]), float(r["eval_solve_rate"]))
                for r in rows
                if r["arm"] == arm
                and int(r["seed"]) == seed
                and r.get("role") != "veteran"
                and r.get("eval_solve_rate", "") != ""
                and int(r["round"]) > 0
            )
            by_round: dict[int, list[float]] = {}
            for rnd, x in evals:
                by_round.setdefault(rnd, []).append(x)
            hit = next((rnd for rnd, xs in sorted(by_round.items()) if statistics.fmean(xs) >= level), None)
            reached.append(hit)
        if not reached:
            continue
        got = [x for x in reached if x is not None]
        words = ", ".join("not reached" if x is None else f"round {x}" for x in reached)
        lines.append(f"  {arm}: newcomers reach the veterans' level in {len(got)} of {len(reached)} seeds ({words})")
    return lines


def comparison_lines(rows: list[dict], baseline: str, arm: str, columns: list[str]) -> list[str]:
    """arm - baseline: held-out with each replicate's difference, per dataset, on every level, per
    node-hour of rounds, and the training solve rate; each paired as `compare` says."""
    lines = []
    d = difference(rows, baseline, arm)
    if d.n:
        listed = "; per unit " + ", ".join(f"{x:+.3f}" for x in d.diffs) if d.n <= 24 else ""
        lines.append(f"{arm} - {baseline}: {d.mean:+.3f} ({d.interval()}) over {d.units()}{listed}")
    parts = []
    for c in columns:
        dc = difference(rows, baseline, arm, c)
        if dc.n:
            parts.append(f"{_short(c)} {dc.mean:+.3f} ({dc.interval()})")
    if parts:
        lines.append("  per dataset: " + ", ".join(parts))
    dcap = difference(rows, baseline, arm, "eval_capability")
    if dcap.n:
        lines.append(f"  every level (capability): {dcap.mean:+.3f} ({dcap.interval()}) over {dcap.units()}")
    h = hourly_difference(rows, baseline, arm)
    if h.n:
        lines.append(
            f"  held-out gain per node-hour of rounds, {arm} - {baseline}: {h.mean:+.3f} ({h.interval()}) "
            f"over {h.units()}"
        )
    t = training_difference(rows, baseline, arm)
    if t.n:
        lines.append(
            f"  training solve rate over all rounds (own questions, each node's curriculum), "
            f"{arm} - {baseline}: {t.mean:+.3f} ({t.interval()}) over {t.units()}"
        )
    return lines


def summary_lines(rows: list[dict], arms: list[str]) -> list[str]:
    """Per arm its final held-out solve rate over its replicates, per dataset, and its cost; per
    arm after the first its difference from the first, overall and per dataset. Veterans' rows
    (--veterans) stay out of every comparison: the newcomers are the replicates."""
    everyone, rows = rows, [r for r in rows if r.get("role") != "veteran"]
    sharing = arm_sharing(rows)
    finals = final_values(rows)
    columns = dataset_columns(rows)
    per_dataset = {c: final_values(rows, c) for c in columns}
    lines = []
    for arm in arms:
        units = unit_values(finals, arm, sharing.get(arm, False))
        if not units:
            continue
        m, lo, hi = mean_ci(list(units.values()))
        interval = interval_words(lo, hi, len(units), "seed" if sharing.get(arm) else "node")
        plural = "s" * (len(units) != 1)
        unit = (
            f"seed{plural} (a sharing arm's nodes are one swarm)"
            if sharing.get(arm)
            else f"node{plural} (independent runs)"
        )
        mine = [r for r in rows if r["arm"] == arm]
        ext = statistics.fmean(float(r["groups_external"] or 0) for r in mine)
        cost = arm_cost(rows, arm)
        tokens = f", {cost.train_tokens:.0f} trained tokens" if cost.train_tokens is not None else ""
        gain = (
            f"; gain over the base model {cost.gain:+.3f} in {cost.node_hours:.2f} node-hours of rounds: "
            f"{cost.gain_per_node_hour:+.3f} per node-hour"
            if cost.gain_per_node_hour is not None
            else ""
        )
        lines.append(
            f"{arm}: final held-out solve rate {m:.3f} ({interval}) over {len(units)} {unit}; "
            f"{ext:.2f} external groups, {cost.round_seconds:.1f} s{tokens} per node-round{gain}"
        )
        lines.extend(w for w in (phase_words(cost), tail_words(mine)) if w)
        if columns:
            parts = []
            for c in columns:
                xs = list(unit_values(per_dataset[c], arm, sharing.get(arm, False)).values())
                if xs:
                    parts.append(f"{_short(c)} {statistics.fmean(xs):.3f}")
            lines.append("  per dataset: " + ", ".join(parts))
        caps = unit_values(final_values(rows, "eval_capability"), arm, sharing.get(arm, False))
        if caps:
            cm, clo, chi = mean_ci(list(caps.values()))
            cint = interval_words(clo, chi, len(caps), "seed" if sharing.get(arm) else "node")
            lines.append(f"  every level (capability, the mean over each dataset's levels): {cm:.3f} ({cint})")
    for arm in arms[1:]:
        lines.extend(comparison_lines(rows, arms[0], arm, columns))
    lines.extend(reward_lines(rows, arms))
    lines.extend(veteran_lines(everyone, arms))
    return lines
