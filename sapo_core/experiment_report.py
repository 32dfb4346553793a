"""The measure of `sapo-experiment`: final held-out solve rates, each arm's difference from the
first arm over paired replicates with a 95 % t-interval, what an arm's node-rounds cost; the
columns of a row. The summary's words are `sapo_core/experiment_summary.py`; the files that hold
them (`experiment.csv`, `summary.txt`, `experiment.png`, read back by `--from-csv`) are
`sapo_core/experiment_files.py`.

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
import operator
import re
import statistics
from collections.abc import Callable
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
# what the likelihood floor did to peers' completions that round: the CSV's column -> the node's
# metric; "" where it judged none (isolated, the floor off, or files before 2026-12-05)
FLOOR_COLUMNS = {
    "floor_judged": "swarm/judged",
    "floor_dropped": "swarm/unlikely",
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
    *FLOOR_COLUMNS,
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


def node_means(rows: list[dict], column: str) -> dict[NodeKey, float]:
    """(seed, arm, node) -> the mean of `column` over the node's rounds where it was recorded."""
    per: dict[NodeKey, list[float]] = {}
    for r in rows:
        if r.get(column, "") != "":
            per.setdefault((int(r["seed"]), r["arm"], int(r["node"])), []).append(float(r[column]))
    return {k: statistics.fmean(v) for k, v in sorted(per.items())}


def training_values(rows: list[dict]) -> dict[NodeKey, float]:
    """(seed, arm, node) -> the node's training solve rate (its own questions) over all its rounds."""
    return node_means(rows, "solve_rate")


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


def compare(
    values: dict[NodeKey, float],
    sharing: dict[str, bool],
    baseline: str,
    arm: str,
    op: Callable[[float, float], float] = operator.sub,
) -> Comparison:
    """arm - baseline (or `op(arm, baseline)`), paired: by (seed, node) when both are isolated (node i
    of seed s has the same seeds in both), else by seed (each arm's mean over the seed's nodes)."""
    both_isolated = not sharing.get(baseline, False) and not sharing.get(arm, False)
    if both_isolated:
        a, b = unit_values(values, arm, False), unit_values(values, baseline, False)
    else:  # an isolated arm's seed mean is as good a seed replicate as a sharing arm's
        a, b = unit_values(values, arm, True), unit_values(values, baseline, True)
    keys = sorted(set(a) & set(b))
    diffs = [op(a[k], b[k]) for k in keys]
    m, lo, hi = mean_ci(diffs) if diffs else (math.nan, math.nan, math.nan)
    return Comparison("node" if both_isolated else "seed", keys, diffs, m, lo, hi)


def difference(rows: list[dict], baseline: str, arm: str, column: str = "eval_solve_rate") -> Comparison:
    """arm - baseline in final held-out `column`, paired as `compare` says."""
    return compare(final_values(rows, column), arm_sharing(rows), baseline, arm)


def gain_values(rows: list[dict], column: str = "eval_solve_rate") -> dict[NodeKey, float]:
    """(seed, arm, node) -> the final held-out `column` minus the node's own base model's (the
    `<column>_base` the CSV carries): what training added, whatever the prompt asked."""
    final, base = final_values(rows, column), final_values(rows, f"{column}_base")
    return {k: final[k] - base[k] for k in final if k in base}


def gain_difference(rows: list[dict], baseline: str, arm: str, column: str = "eval_solve_rate") -> Comparison | None:
    """arm - baseline in the gain over each arm's own base model, paired as `compare` says; None
    where the two arms' base models score the same (then it equals `difference`). An arm that asks
    the held-out questions another way (`tasks.prompt`, `tasks.system_prompt`) starts elsewhere:
    this says what its training added, `difference` where its node ends."""
    base = final_values(rows, f"{column}_base")
    a = {v for (_, arm_, _), v in base.items() if arm_ == arm}
    b = {v for (_, arm_, _), v in base.items() if arm_ == baseline}
    if not a or not b or statistics.fmean(a) == statistics.fmean(b):
        return None
    return compare(gain_values(rows, column), arm_sharing(rows), baseline, arm)


def training_difference(rows: list[dict], baseline: str, arm: str) -> Comparison:
    """The paper's kind of measure beside the held-out one: the training solve rate of each node's
    own questions over all rounds, arm - baseline, paired as `compare` says. Each node's curriculum
    sets how hard its questions are, so a node that climbs faster can show less here while
    learning more (the held-out set does not move)."""
    return compare(training_values(rows), arm_sharing(rows), baseline, arm)


def total_rewards(rows: list[dict], arm: str, units: set[tuple[int, int]] | None = None) -> dict[int, float]:
    """seed -> the SAPO paper's own measure (§4, 'total reward'): the arm's training reward summed
    over its nodes and rounds, each node-round counting the mean reward of its own completions.
    Like `training_difference` it follows each node's curriculum; the paper reports it for one run
    per configuration (8/0 561.79, 4/4 1093.31 over 8 nodes x 2000 rounds). `units`: only these
    (seed, node) runs, to compare two arms on the same nodes."""
    out: dict[int, float] = {}
    for r in rows:
        if units is not None and (int(r["seed"]), int(r["node"])) not in units:
            continue
        if r["arm"] == arm and r.get("reward_mean", "") != "":
            out[int(r["seed"])] = out.get(int(r["seed"]), 0.0) + float(r["reward_mean"])
    return dict(sorted(out.items()))


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


# what a node-round costs, the columns `cost_ratios` pairs and the words it prints them with
COST_RATIO_COLUMNS = {
    "round_seconds": "a round",
    "sample_seconds": "sampling",
    "update_seconds": "the update",
    "train_tokens": "trained tokens",
}


def cost_ratios(rows: list[dict], baseline: str, arm: str) -> dict[str, Comparison]:
    """arm / baseline per node-round, column by column (COST_RATIO_COLUMNS): each replicate's mean
    over its rounds, paired as `compare` says, and the mean of the pairs' ratios with its interval.
    Seconds move with the machine's load, so the ratio holds only where both arms ran at once (one
    side-by-side run, one core each); a column a file lacks is left out."""
    out, sharing = {}, arm_sharing(rows)
    for column in COST_RATIO_COLUMNS:
        means = {k: v for k, v in node_means(rows, column).items() if k[1] != baseline or v > 0}
        c = compare(means, sharing, baseline, arm, operator.truediv)
        if c.n:
            out[column] = c
    return out
