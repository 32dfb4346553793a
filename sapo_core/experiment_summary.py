"""The summary `sapo-experiment` prints and writes to `summary.txt`: per arm its final held-out
solve rate, cost, where a round's time goes and what the likelihood floor dropped of peers' text;
per arm after the first its paired differences from the first (held-out, per dataset, every level,
per node-hour, what a node-round costs, the training solve rate); the paper's total reward; the
veterans' level. The measure behind each line is `sapo_core/experiment_report.py`.

Imports only the standard library: `--from-csv` needs no torch.
"""

from __future__ import annotations

import statistics

from sapo_core.experiment_report import (
    COST_RATIO_COLUMNS,
    DATASET_PREFIX,
    ArmCost,
    arm_cost,
    arm_sharing,
    cost_ratios,
    dataset_columns,
    difference,
    final_values,
    gain_difference,
    hourly_difference,
    interval_words,
    mean_ci,
    total_rewards,
    training_difference,
    unit_values,
)


def reward_lines(rows: list[dict], arms: list[str]) -> list[str]:
    """The paper's measure per arm (mean over seeds) and each arm's % over the first, per seed.
    The % sums both arms over the (seed, node) runs they share: a sum over 2 nodes against one
    over 4 (a pilot paired with a full run) would say -50 % of nothing."""
    totals = {a: total_rewards(rows, a) for a in arms}
    runs = {a: {(int(r["seed"]), int(r["node"])) for r in rows if r["arm"] == a} for a in arms}
    lines = []
    for arm in arms:
        t = totals[arm]
        if not t:
            continue
        base, mine, on = totals[arms[0]], t, ""
        seeds = set(t) & set(base)
        if arm != arms[0] and {u for u in runs[arm] if u[0] in seeds} != {u for u in runs[arms[0]] if u[0] in seeds}:
            shared = runs[arm] & runs[arms[0]]
            base, mine = total_rewards(rows, arms[0], shared), total_rewards(rows, arm, shared)
            on = f" on the {len(shared)} (seed, node) runs both have"
        nodes = len(runs[arm]) / len(t)
        rounds = max(int(r["round"]) for r in rows if r["arm"] == arm)
        m, lo, hi = mean_ci(list(t.values()))
        interval = interval_words(lo, hi, len(t), "seed", ".2f")
        line = (
            f"{arm}: total training reward (the paper's measure) {m:.2f} ({interval}) "
            f"over {len(t)} seed{'s' * (len(t) != 1)}, {nodes:g} nodes x {rounds} rounds each"
        )
        pct = [100 * (mine[s] / base[s] - 1) for s in sorted(set(mine) & set(base)) if base[s] > 0]
        if arm != arms[0] and pct:
            pm, plo, phi = mean_ci(pct)
            ci = f" (95% CI {plo:+.0f}..{phi:+.0f} %)" if len(pct) > 1 else ""
            line += f"; {pm:+.0f} %{ci} over {arms[0]}{on}, per seed " + ", ".join(f"{x:+.0f} %" for x in pct)
        lines.append(line)
    return lines


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


def floor_words(rows: list[dict]) -> str | None:
    """What the likelihood floor did to an arm's peers' text: the peer completions it dropped of
    those it judged over the run, by quarter of the rounds (its floor was calibrated on the base
    model: does it drop more as the policies move?) and per seed. None where it judged none
    (isolated, the floor off, files before 2026-12-05)."""
    judged = [r for r in rows if r.get("floor_judged", "") != ""]
    if not sum(float(r["floor_judged"]) for r in judged):
        return None
    rounds = max(int(r["round"]) for r in rows)

    def rate(part: list[dict]) -> tuple[float, float]:
        return sum(float(r["floor_dropped"] or 0) for r in part), sum(float(r["floor_judged"]) for r in part)

    def pct(dropped: float, of: float) -> str:
        return f"{100 * dropped / of:.1f} %" if of else "none judged"

    dropped, of = rate(judged)
    quarters = [[r for r in judged if min(4 * (int(r["round"]) - 1) // rounds, 3) == q] for q in range(4)]
    seeds = sorted({int(r["seed"]) for r in judged})
    words = (
        f"  the likelihood floor dropped {dropped:.0f} of the {of:.0f} peer completions it judged "
        f"({pct(dropped, of)}); by quarter of the rounds " + ", ".join(pct(*rate(q)) for q in quarters)
    )
    if len(seeds) > 1:
        words += "; per seed " + ", ".join(pct(*rate([r for r in judged if int(r["seed"]) == s])) for s in seeds)
    return words


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
    for column, what in (("eval_solve_rate", "start level"), ("eval_capability", "every level")):
        g = gain_difference(rows, baseline, arm, column)
        if g is not None and g.n:
            lines.append(
                f"  gain over each arm's own base model ({what}; the base models differ), {arm} - {baseline}: "
                f"{g.mean:+.3f} ({g.interval()}) over {g.units()}"
            )
    h = hourly_difference(rows, baseline, arm)
    if h.n:
        lines.append(
            f"  held-out gain per node-hour of rounds, {arm} - {baseline}: {h.mean:+.3f} ({h.interval()}) "
            f"over {h.units()}"
        )
    ratios = cost_ratios(rows, baseline, arm)
    if ratios:
        parts = [
            f"{COST_RATIO_COLUMNS[k]} {c.mean:.2f}x ({interval_words(c.lo, c.hi, c.n, c.unit, '.2f')})"
            for k, c in ratios.items()
        ]
        lines.append(
            f"  cost per node-round, {arm} / {baseline}, the mean of the pairs' ratios over "
            f"{next(iter(ratios.values())).units()} (only where both ran at once): " + ", ".join(parts)
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
        lines.extend(w for w in (phase_words(cost), tail_words(mine), floor_words(mine)) if w)
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
