"""What `sapo-experiment` writes and reads back: `experiment.csv` (the rows), `summary.txt` (the
title, each arm's overrides, the measure of `sapo_core.experiment_report`) and `experiment.png`;
and the rows of experiment.csv files read back together (`--from-csv`).

Imports only the standard library (matplotlib where it draws): `--from-csv` needs no torch.
"""

from __future__ import annotations

import csv
import re
import statistics
import sys
from pathlib import Path

from sapo_core.experiment_report import (
    CSV_FIELDS,
    DATASET_PREFIX,
    FLOOR_COLUMNS,
    PHASE_COLUMNS,
    dataset_columns,
    difference,
)
from sapo_core.experiment_summary import summary_lines

_INT_FIELDS = ("seed", "sharing", "node", "round")
# columns an experiment.csv written before arms may lack (filled with "" when read)
_OPTIONAL_FIELDS = (
    "sharing",
    "train_tokens",
    "completions_cut",
    "eval_capability",
    "eval_capability_base",
    "role",
    *PHASE_COLUMNS,
    *FLOOR_COLUMNS,
)


def write_outputs(
    rows: list[dict], out: Path, title: str, arms: list[str], specs: dict[str, str] | None = None
) -> list[str]:
    """experiment.csv, summary.txt (the title, each arm's overrides, the measure) and
    experiment.png; the summary's lines (and a note where no PNG could be drawn)."""
    fields = list(CSV_FIELDS) + dataset_columns(rows)
    with open(out / "experiment.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=fields, restval="", extrasaction="ignore")
        writer.writeheader()
        writer.writerows(rows)
    lines = summary_lines(rows, arms)
    header = [f"arm {a}: {(specs or {}).get(a, '')}".rstrip() for a in arms]
    (out / "summary.txt").write_text("\n".join([title, *header, *lines]) + "\n")
    if not _plot(rows, out / "experiment.png", title, arms):
        lines.append(PLOT_NEEDS_MATPLOTLIB)
    return lines


# matplotlib is an optional extra (pyproject.toml): a volunteer's node never draws.
PLOT_NEEDS_MATPLOTLIB = (
    "experiment.png not drawn: matplotlib is not installed (pip install 'sapo-swarm[experiment]', "
    "or pip install matplotlib, then sapo-experiment --from-csv experiment.csv draws it); "
    "experiment.csv and summary.txt are written"
)


def _plot(rows: list[dict], path: Path, title: str, arms: list[str]) -> bool:
    """Draws `path`; False, drawing nothing, where matplotlib is not installed."""
    try:
        import matplotlib
    except ImportError:
        return False

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax, cx, bx) = plt.subplots(
        1, 3, figsize=(14 + 0.6 * max(0, len(arms) - 2), 4.2), dpi=120, gridspec_kw={"width_ratios": [3, 3, 1.2]}
    )
    for arm in arms:  # the paper's measure as it accumulates: reward summed over nodes, mean over seeds
        per: dict[tuple[int, int], float] = {}
        for r in rows:
            if r["arm"] == arm and r.get("reward_mean", "") != "":
                key = (int(r["seed"]), int(r["round"]))
                per[key] = per.get(key, 0.0) + float(r["reward_mean"])
        seeds = sorted({s for s, _ in per})
        rounds = sorted({x for _, x in per})
        running = dict.fromkeys(seeds, 0.0)
        curve = []
        for x in rounds:
            for s in seeds:
                running[s] += per.get((s, x), 0.0)
            curve.append(statistics.fmean(running.values()))
        cx.plot(rounds, curve, label=arm)
    cx.set_xlabel("round")
    cx.set_ylabel("total training reward so far (sum over nodes)")
    cx.set_title("the paper's measure, mean over seeds", fontsize=8)
    cx.grid(alpha=0.3)
    cx.legend(fontsize=7)
    for arm in arms:
        by_round: dict[int, list[float]] = {}
        for r in rows:
            if r["arm"] == arm and r["eval_solve_rate"] != "":
                by_round.setdefault(int(r["round"]), []).append(float(r["eval_solve_rate"]))
        xs = sorted(by_round)
        ax.plot(xs, [statistics.fmean(by_round[x]) for x in xs], marker="o", label=arm)
    ax.set_xlabel("round")
    ax.set_ylabel("held-out solve rate (mean over nodes and seeds)")
    ax.set_title(title, fontsize=8)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    ticks = []
    for k, arm in enumerate(arms[1:]):
        d = difference(rows, arms[0], arm)
        ticks.append(f"{arm}\n{d.n} {d.unit}{'s' * (d.n != 1)}")
        bx.scatter([k] * d.n, d.diffs, color="gray", s=12, label="one replicate" if k == 0 else None)
        if d.n:
            yerr = [[d.mean - d.lo], [d.hi - d.mean]]
            label = "mean, 95% CI" if k == 0 else None
            bx.errorbar([k + 0.3], [d.mean], yerr=yerr, fmt="o", color="black", capsize=4, label=label)
    if len(arms) >= 2:
        bx.axhline(0, color="red", lw=0.8)
        bx.set_xlim(-0.5, len(arms) - 1.2)
        bx.set_xticks([k + 0.15 for k in range(len(arms) - 1)], ticks, fontsize=7)
        bx.set_title(f"final held-out: arm - {arms[0]}", fontsize=8)
        bx.legend(fontsize=7)
    else:
        bx.set_axis_off()
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return True


def read_rows(paths: list[str]) -> tuple[list[dict], str, dict[str, str]]:
    """The rows of experiment.csv files, numbers as numbers; a row of a later file replaces the same
    (seed, arm, node, round) of an earlier one. A file written before arms existed (a `config`
    column of I/J names) reads as arms of those names. Also the first file's title (summary.txt
    beside it), which says the settings, and each arm's overrides as its summary.txt says them."""
    rows: dict[tuple, dict] = {}
    title = ""
    specs: dict[str, str] = {}
    for name in paths:
        path = Path(name)
        try:
            with open(path, newline="") as f:
                reader = csv.DictReader(f)
                have = set(reader.fieldnames or [])
                if "config" in have and "arm" not in have:
                    have = (have - {"config"}) | {"arm"}
                missing = set(CSV_FIELDS) - set(_OPTIONAL_FIELDS) - have
                if reader.fieldnames is None or missing:
                    raise SystemExit(f"sapo-experiment: {path} is not an experiment.csv (columns: {reader.fieldnames})")
                for r in reader:
                    if "arm" not in r:
                        r["arm"] = r.pop("config")
                    row = {k: r.get(k, "") for k in CSV_FIELDS}
                    row.update({k: v for k, v in r.items() if k.startswith(DATASET_PREFIX) and k not in row})
                    for k, v in row.items():
                        if k in _INT_FIELDS:
                            row[k] = int(v) if v != "" else ""
                        elif k not in ("arm", "role"):
                            row[k] = float(v) if v not in ("", None) else ""
                    rows[(row["seed"], row["arm"], row["node"], row["round"])] = row
        except (OSError, ValueError) as e:
            raise SystemExit(f"sapo-experiment: cannot read {path}: {e}") from None
        summary = path.with_name("summary.txt")
        if summary.is_file():
            text = summary.read_text().splitlines()
            title = title or next(iter(text), "")
            for line in text:
                m = re.fullmatch(r"arm (\S+):(.*)", line)
                if m:
                    specs.setdefault(m.group(1), m.group(2).strip())
    return list(rows.values()), title, specs


def rows_up_to(rows: list[dict], last: int) -> list[dict]:
    """The rows of rounds 1..last. A node whose held-out was last measured before `last` would
    compare an earlier figure as if it were round `last`'s: said, by node, on stderr."""
    if last < 1:
        raise SystemExit("--up-to-round must be at least 1 (0: every round)")
    kept = [r for r in rows if int(r["round"]) <= last]
    measured: dict[tuple, int] = {}
    for r in kept:
        if r.get("eval_solve_rate", "") != "":
            key = (r["seed"], r["arm"], r["node"])
            measured[key] = max(measured.get(key, 0), int(r["round"]))
    early = sorted(f"seed {s} {a} node {n} at round {at}" for (s, a, n), at in measured.items() if at < last)
    if early:
        print(
            f"sapo-experiment: warning: held-out not measured at round {last} for {len(early)} node(s), their "
            f"last before it taken: {'; '.join(early[:4])}{' ...' if len(early) > 4 else ''}",
            file=sys.stderr,
        )
    return kept
