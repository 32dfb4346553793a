"""`sapo-experiment`: training recipes (arms) compared over seeds, sized so the result can be believed.

An arm is a name and NodeConfig overrides (`lr2e-4:train.learning_rate=2e-4`); the first arm is
the baseline. The SAPO paper (arXiv 2509.08721, §4) compares I local / J external groups per round
at the same I + J, isolated against sharing, which is `--configs 2/0,1/1`: arms named "2/0" and
"1/1" that override `round.local_groups` and `round.external_groups` (a node shares, in a swarm,
where J > 0).

The measure is the held-out evaluation (`sapo_core/evaluation.py`): every node's solve rate on
questions no node trains on, before round 1, every `--eval-every` rounds and after the last; per
arm its difference from the first over paired replicates (an isolated node, or a sharing arm's
seed), with a 95 % t-interval (`sapo_core/experiment_report.py`). Writes `experiment.csv` (one row
per seed, arm, node and round), `experiment.png` and `summary.txt` (`sapo_core/experiment_files.py`).

Made affordable on a 2-core CPU (docs/experiment.md says what this simplifies): a run's nodes take
their rounds in turn in one process, sharing the base weights and one llama.cpp sampler; sharing
nodes form a real swarm on loopback (own identity and DHT each); small rounds (I + J = 2 groups of
G = 4, <= 64 tokens by default). On a GPU or a many-core machine `--node-processes` gives every node
a process of its own instead. How runs are run: `sapo_core/experiment_runs.py`.
"""

from __future__ import annotations

import argparse
import difflib
import functools
import json
import re
import signal
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sapo_core import logs
from sapo_core.config import DEFAULT_TASK_WEIGHTS, ConfigError, NodeConfig, field_help
from sapo_core.experiment_files import PLOT_NEEDS_MATPLOTLIB, read_rows, rows_up_to, write_outputs
from sapo_core.experiment_runs import (
    STOP_GRACE_SECONDS,
    VETERAN_INDEX,
    log_prefix,
    ordered,
    raise_on_sigterm,
    reset_stopping,
    run_arm,
    run_units,
    stopping,
)

__all__ = ["Arm", "PLOT_NEEDS_MATPLOTLIB", "STOP_GRACE_SECONDS", "main", "node_config", "parse_arm", "parse_configs"]

# --- arms -----------------------------------------------------------------------------------------

_ARM_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._/-]{0,23}")  # it names run directories and swarms
# set by the experiment for every node: an arm that changed them would break the runs themselves
_RESERVED = {
    "run_dir": "each node's run directory",
    "seed": "each node's seed (seed x 1000 + node)",
    "swarm.enabled": "on where round.external_groups > 0",
    "swarm.swarm_name": "one swarm per (seed, arm)",
    "swarm.initial_peers": "node 0 of the arm",
    "swarm.host_maddrs": "loopback",
    "swarm.identity_path": "one identity per (seed, node)",
}
# overrides that change the held-out questions themselves (or how many completions, how long, measure them)
_CHANGES_HELD_OUT = (
    "eval.questions",
    "eval.samples",
    "eval.max_new_tokens",
    "eval.temperature",
    "tasks.weights",
    "tasks.difficulty",
    "tasks.levels",
)


@dataclass(frozen=True)
class Arm:
    """A recipe: its name and the NodeConfig overrides (dotted key -> value) it applies."""

    name: str
    overrides: tuple[tuple[str, Any], ...] = ()

    @property
    def tag(self) -> str:
        """Its name as a path component ('2/0' -> '2-0')."""
        return self.name.replace("/", "-")

    def spec(self) -> str:
        """'train.learning_rate=0.0002,tasks.prompt=plain', as the overrides can be given again."""
        return ",".join(f"{k}={_render(v)}" for k, v in self.overrides)


def _render(value: Any) -> str:
    """A value as `parse_arm` reads it back: a plain word bare, anything else as JSON."""
    if isinstance(value, str) and value == value.strip() and not set(value) & set(',"[]{}'):
        try:
            json.loads(value)
        except ValueError:
            return value
    return json.dumps(value)


def _split_top_level(text: str) -> list[str]:
    """Split at commas outside brackets, braces and double quotes: a JSON value may hold commas."""
    parts, depth, quoted, current = [], 0, False, []
    for i, ch in enumerate(text):
        if ch == '"' and (i == 0 or text[i - 1] != "\\"):
            quoted = not quoted
        elif not quoted and ch in "[{":
            depth += 1
        elif not quoted and ch in "]}":
            depth -= 1
        elif not quoted and depth == 0 and ch == ",":
            parts.append("".join(current))
            current = []
            continue
        current.append(ch)
    parts.append("".join(current))
    return parts


def parse_arm(text: str) -> Arm:
    """'lr:train.learning_rate=2e-4,tasks.prompt=plain' -> Arm('lr', ...); 'base:' -> no overrides.
    Values are JSON where they parse as JSON (2e-4, true, [..], {..}, "a, b"), else the text."""
    name, sep, rest = text.partition(":")
    name = name.strip()
    if not sep:
        raise SystemExit(
            f"--arm '{text}': write NAME:key=value[,key=value...], e.g. lr2e-4:train.learning_rate=2e-4 "
            "('NAME:' for an arm without overrides)"
        )
    if not _ARM_NAME.fullmatch(name):
        raise SystemExit(
            f"--arm '{text}': the name '{name}' must be 1..24 letters, digits, '.', '_', '-' or '/', "
            "starting with a letter or digit"
        )
    overrides: dict[str, Any] = {}
    if rest.strip():
        for part in _split_top_level(rest):
            key, eq, raw = part.partition("=")
            key, raw = key.strip(), raw.strip()
            if not eq or not key:
                raise SystemExit(f"--arm {name}: '{part.strip()}' is not key=value, e.g. train.learning_rate=2e-4")
            if key in overrides:
                raise SystemExit(f"--arm {name}: {key} is given twice")
            try:
                overrides[key] = json.loads(raw)
            except ValueError:
                overrides[key] = raw  # a word such as plain or medium
    return Arm(name, tuple(overrides.items()))


def parse_configs(text: str) -> list[Arm]:
    """'2/0,1/1' -> arms named '2/0' and '1/1' with I local and J external groups; I >= 1, J >= 0."""
    out = []
    for part in text.split(","):
        try:
            i, j = (int(x) for x in part.strip().split("/"))
        except ValueError:
            raise SystemExit(f"--configs: '{part}' is not I/J, e.g. 2/0,1/1") from None
        if i < 1 or j < 0:
            raise SystemExit(f"--configs: '{part}' needs I >= 1 and J >= 0")
        out.append(Arm(f"{i}/{j}", (("round.local_groups", i), ("round.external_groups", j))))
    return out


def check_arms(args: argparse.Namespace, arms: list[Arm], out: Path) -> dict[str, str]:
    """Every arm's every override, checked before anything runs: a SystemExit naming the arm and
    the key otherwise. Returns each arm's description for summary.txt."""
    if not arms:
        raise SystemExit("sapo-experiment: no arms (give --arm NAME:key=value ... or --configs I/J,...)")
    seen: dict[str, str] = {}
    for arm in arms:
        if arm.tag in seen:
            raise SystemExit(f"--arm {arm.name}: the name is taken by arm {seen[arm.tag]} (run directories: {arm.tag})")
        seen[arm.tag] = arm.name
    known = field_help()
    try:
        plain = node_config(args, out, args.seed, Arm("check"), 0, None)
    except ConfigError as e:
        raise SystemExit(f"sapo-experiment: {e}") from None
    specs = {}
    for arm in arms:
        for key, value in arm.overrides:
            if key in _RESERVED or any(r.startswith(key + ".") for r in _RESERVED):
                what = _RESERVED.get(key, "the experiment's")
                raise SystemExit(f"--arm {arm.name}: {key} is set by the experiment ({what}); leave it out")
            if key not in known:
                near = difflib.get_close_matches(key, known, n=1)
                hint = f"; did you mean {near[0]}?" if near else " (NodeConfig keys such as train.learning_rate)"
                raise SystemExit(f"--arm {arm.name}: unknown key {key}{hint}")
            try:
                plain.replace(**{key: value})
            except ConfigError as e:
                raise SystemExit(f"--arm {arm.name}: {key}={value!r}: {e}") from None
        try:
            cfg = node_config(args, out, args.seed, arm, 0, None)
        except ConfigError as e:  # the overrides together (e.g. curriculum_lower above curriculum_raise)
            raise SystemExit(f"--arm {arm.name}: {e}") from None
        changed = [k for k, _ in arm.overrides if k in _CHANGES_HELD_OUT]
        if changed and arm is not arms[0]:
            print(
                f"sapo-experiment: warning: arm {arm.name} sets {', '.join(changed)}: its held-out questions "
                f"differ from {arms[0].name}'s, so the difference compares other measures",
                file=sys.stderr,
            )
        how = "sharing" if cfg.swarm.enabled else "isolated"
        specs[arm.name] = (
            f"{arm.spec() or 'no overrides'} ({how}: {cfg.round.local_groups} local / "
            f"{cfg.round.external_groups} external groups)"
        )
    return specs


def node_config(args: argparse.Namespace, out: Path, seed: int, arm: Arm, index: int, join: str | None) -> NodeConfig:
    """Node `index` of `arm` at `seed`: the experiment's settings, then the arm's overrides (they
    win), then what the experiment derives (a swarm where the node takes external groups)."""
    weights = {t: 1.0 for t in args.tasks.split(",")} if args.tasks else dict(DEFAULT_TASK_WEIGHTS)
    tag = f"seed{seed}-{arm.tag}"
    name = f"veteran{index - VETERAN_INDEX}" if index >= VETERAN_INDEX else f"node{index}"
    cfg = NodeConfig().replace(
        **{
            "run_dir": str(out / "runs" / tag / name),
            "seed": seed * 1000 + index,
            "model.name": args.model,
            "tasks.weights": weights,
            "sampler.group_size": args.group_size,
            "sampler.max_new_tokens": args.max_new_tokens,
            "sampler.threads": args.threads,
            "round.local_groups": args.local,
            "round.external_groups": args.external,
            "round.auto_scale": False,
            "swarm.swarm_name": f"experiment-{tag}-{args.stamp}",
            "swarm.host_maddrs": ["/ip4/127.0.0.1/tcp/0"],
            "swarm.window_seconds": args.window_seconds,
            "swarm.gather_timeout": 3.0,
            "swarm.publish_timeout": 5.0,
            "swarm.identity_path": str(out / "identities" / f"seed{seed}-{name}.key"),
            "swarm.initial_peers": [join] if join else [],
            "eval.enabled": True,
            "eval.every_rounds": args.eval_every if index < VETERAN_INDEX else 0,
            "eval.max_share": 1.0,  # as asked, not skipped
            "eval.questions": args.eval_questions,
            "eval.samples": args.eval_samples,
            "eval.greedy": False,
            "eval.max_new_tokens": args.max_new_tokens,  # an arm's sampler.max_new_tokens changes training only
            "eval.temperature": NodeConfig().sampler.temperature,  # and an arm's sampler.temperature too
        }
    )
    if arm.overrides:
        cfg = cfg.replace(**dict(arm.overrides))
    return cfg.replace(**{"swarm.enabled": cfg.round.external_groups > 0})


# --- the command ----------------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="sapo-experiment", description=__doc__.splitlines()[0])
    p.add_argument("--nodes", type=int, default=4, help="nodes per arm and seed, N")
    p.add_argument("--seeds", type=int, default=3, help="repetitions with other seeds")
    p.add_argument("--rounds", type=int, default=100, help="rounds per node")
    _add_arm_arguments(p)
    _add_node_arguments(p)
    _add_layout_arguments(p)
    p.add_argument("--seed", type=int, default=0, help="first seed")
    p.add_argument("--out", default="", help="output directory (default: experiment-<time> here)")
    p.add_argument(
        "--from-csv",
        nargs="+",
        default=[],
        metavar="CSV",
        help="run nothing: the summary, plot and CSV of the rows in these experiment.csv files together "
        "(seeds run at different times or on other machines, with the same settings); --arm or --configs "
        "names pick the arms and their order (default: all, in the order the files hold them)",
    )
    p.add_argument(
        "--up-to-round",
        type=int,
        default=0,
        metavar="N",
        help="with --from-csv: the comparison as it stood after round N of a longer run (its later rows "
        "left out: held-out is each node's last evaluation at or before N, the hours its rounds up to N; "
        "run with --eval-every so that N is evaluated); 0: every round",
    )
    logs.add_level_argument(p)
    return p


def _add_arm_arguments(p: argparse.ArgumentParser) -> None:
    """What the arms are: their names and NodeConfig overrides."""
    p.add_argument(
        "--arm",
        action="append",
        default=[],
        metavar="NAME:KEY=VALUE,...",
        help="an arm: a name and NodeConfig overrides, e.g. lr2e-4:train.learning_rate=2e-4 or base: (none); "
        "repeat for each arm, the first is the baseline the others are compared with; values are JSON where "
        "they parse (2e-4, true, [..], {..}), else text",
    )
    p.add_argument(
        "--configs",
        default=None,
        help="shorthand for arms of I local / J external groups, e.g. 2/0,1/1 (the default where no --arm "
        "is given): arms named I/J, sharing where J > 0; the first is the baseline",
    )
    p.add_argument("--local", type=int, default=2, help="round.local_groups of arms that do not set it, I")
    p.add_argument("--external", type=int, default=0, help="round.external_groups of arms that do not set it, J")


def _add_node_arguments(p: argparse.ArgumentParser) -> None:
    """The settings every node of every arm shares: model, tasks, sampling, held-out evaluation."""
    p.add_argument("--model", default="smollm2-135m-instruct", help="catalogue id (tiny-random for a dry run)")
    p.add_argument("--tasks", default="", help="comma-separated datasets (default: the node's easy mix)")
    p.add_argument("--group-size", type=int, default=4, help="completions per question, G")
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--threads", type=int, default=0, help="sampler and torch threads (0 = physical cores)")
    p.add_argument(
        "--eval-every",
        type=int,
        default=0,
        help="held-out evaluation also every this many rounds (0: only before round 1 and after the last, "
        "all the comparison needs; each one costs as much as 15-35 rounds at the default size)",
    )
    p.add_argument(
        "--eval-questions",
        type=int,
        default=32,
        help="held-out questions per dataset (docs/experiment.md, 'How many held-out questions')",
    )
    p.add_argument("--eval-samples", type=int, default=4, help="completions per held-out question")
    p.add_argument("--window-seconds", type=float, default=60.0, help="swarm.window_seconds")


def _add_layout_arguments(p: argparse.ArgumentParser) -> None:
    """How the runs are laid out: processes, veterans beside the newcomers, a time limit."""
    p.add_argument(
        "--jobs",
        type=int,
        default=1,
        help="(seed, arm) runs at once, each in its own process (on 2 cores: --jobs 2 --threads 1, one run per core)",
    )
    p.add_argument(
        "--veterans",
        nargs="+",
        default=[],
        metavar="RUN_DIR",
        help="run directories of nodes that have trained (each its own run, e.g. an earlier experiment's "
        "runs/seed0-base/node0): in every sharing arm --veterans-per-seed of them, copied, resume and join "
        "the swarm as veterans beside the --nodes newcomers, which start from the base model; isolated arms "
        "run the newcomers alone (docs/experiment.md, 'A newcomer among veterans')",
    )
    p.add_argument(
        "--veterans-per-seed",
        type=int,
        default=2,
        help="veterans in each sharing run; seed s takes the pool's run directories s*V .. s*V+V-1 (round robin)",
    )
    p.add_argument(
        "--node-processes",
        action="store_true",
        help="every node in a process of its own, at its own pace, with its own model (a GPU or a many-core "
        "machine; --jobs runs at once, so --jobs x --nodes processes); default: a run's nodes take their "
        "rounds in turn in one process and share the base weights and the sampler",
    )
    p.add_argument(
        "--minutes",
        type=float,
        default=0.0,
        help="a node stops taking rounds once this many minutes have passed since its first round (at most "
        "--rounds) and is evaluated after its last one; 0: exactly --rounds",
    )


def _arms(args: argparse.Namespace) -> list[Arm]:
    if args.arm and args.configs:
        raise SystemExit("sapo-experiment: give arms with --arm or with --configs, not both")
    if args.arm:
        return [parse_arm(a) for a in args.arm]
    return parse_configs(args.configs or "2/0,1/1")


def _from_csv(args: argparse.Namespace) -> int:
    rows, title, specs = read_rows(args.from_csv)
    out = Path(args.out or f"experiment-merged-{time.strftime('%Y%m%d-%H%M%S')}").resolve()
    out.mkdir(parents=True, exist_ok=True)
    present = list(dict.fromkeys(r["arm"] for r in rows))
    if args.arm or args.configs:
        names = [a.name for a in _arms(args) if a.name in present]
    else:
        names = present
    rows = [r for r in rows if r["arm"] in names]
    if args.up_to_round:
        rows = rows_up_to(rows, args.up_to_round)
        title = f"{title or 'SAPO experiment'}, up to round {args.up_to_round}"
    seeds = sorted({r["seed"] for r in rows})
    # the first file's title names its own seed count: say the merged one
    title = re.sub(r" x \d+ seeds?\b", f" x {len(seeds)} seeds", title or "SAPO experiment")
    title = f"{title} (seeds {', '.join(map(str, seeds))} from {len(args.from_csv)} file(s))"
    for line in write_outputs(ordered(rows, names), out, title, names, specs):
        print(line)
    return 0


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logs.apply_level_argument(args)
    logs.to_stderr(prefix=log_prefix)
    if args.from_csv:
        return _from_csv(args)
    if args.up_to_round:
        raise SystemExit("--up-to-round reads the rows of --from-csv files: give those")
    arms = _arms(args)
    # I + J (a --configs arm overrides those two only): the paper compares at the same number
    if args.configs and len({sum(v for _, v in a.overrides) for a in arms}) != 1:
        print(
            "sapo-experiment: warning: the configurations do not all train on the same number of groups "
            "per update (I + J), so they are not the paper's comparison",
            file=sys.stderr,
        )
    if args.nodes < 1 or args.rounds < 1 or args.seeds < 1:
        raise SystemExit("--nodes, --rounds and --seeds must be at least 1")
    if args.minutes < 0:
        raise SystemExit("--minutes must be >= 0 (0: exactly --rounds)")
    if args.veterans:
        missing = [d for d in args.veterans if not (Path(d) / "checkpoints").is_dir()]
        if missing:
            raise SystemExit(f"--veterans: no checkpoints in {', '.join(missing)} (a node's run directory)")
        if args.node_processes:
            raise SystemExit("--veterans runs in turn, in one process: leave out --node-processes")
        if args.veterans_per_seed < 1:
            raise SystemExit("--veterans-per-seed must be at least 1")
    args.stamp = time.strftime("%Y%m%d-%H%M%S")
    out = Path(args.out or f"experiment-{args.stamp}").resolve()
    specs = check_arms(args, arms, out)  # before anything runs or is written
    out.mkdir(parents=True, exist_ok=True)
    names = [a.name for a in arms]
    title = (
        f"SAPO: {args.nodes} nodes x {args.rounds} rounds x {args.seeds} seeds, {args.model}, "
        f"G={args.group_size}, <={args.max_new_tokens} tokens, held-out {args.eval_questions} q/dataset "
        f"x {args.eval_samples}, threads {args.threads or 'all'}"
    )
    print(title, f"-> {out}", flush=True)
    for arm in arms:
        print(f"arm {arm.name}: {specs[arm.name]}", flush=True)
    rows: list[dict] = []
    started = time.time()
    seeds = range(args.seed, args.seed + args.seeds)
    units = [(seed, arm) for seed in seeds for arm in arms]
    config_of = functools.partial(node_config, args, out)
    reset_stopping()
    previous = signal.signal(signal.SIGTERM, raise_on_sigterm)
    try:
        if args.jobs <= 1 and not args.node_processes:
            for seed, arm in units:
                rows += run_arm(args, config_of, seed, arm)
                write_outputs(rows, out, title, names, specs)  # keep what is done if a later run fails
        else:
            rows = run_units(args, config_of, out, units, title, arms, specs)
    except (SystemExit, KeyboardInterrupt) as e:
        if stopping() or isinstance(e, KeyboardInterrupt):
            print(
                f"sapo-experiment: stopped; the runs that had finished are in {out / 'experiment.csv'}",
                file=sys.stderr,
                flush=True,
            )
        raise
    finally:
        signal.signal(signal.SIGTERM, previous)
    lines = write_outputs(rows, out, title, names, specs)
    print(f"done in {(time.time() - started) / 60:.1f} min; {out / 'experiment.csv'}, {out / 'experiment.png'}")
    for line in lines:
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
