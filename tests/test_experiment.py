"""sapo-experiment: arms and their checks, the measure by hand (final held-out solve rates, paired
differences by (seed, node) or by seed, their t-intervals), its outputs, reading older CSVs, and
real dry runs (tiny-random nodes in one process; a real swarm on loopback for a sharing arm)."""

from __future__ import annotations

import csv
import signal
import subprocess
import sys
import threading
import time
import tomllib
from pathlib import Path

import psutil
import pytest

from sapo_core.evaluation import EvalSettings
from sapo_core.experiment import (
    STOP_GRACE_SECONDS,
    Arm,
    build_parser,
    check_arms,
    main,
    node_config,
    parse_arm,
    parse_configs,
)
from sapo_core.experiment_files import PLOT_NEEDS_MATPLOTLIB, read_rows, write_outputs
from sapo_core.experiment_report import (
    CSV_FIELDS,
    arm_cost,
    cost_ratios,
    difference,
    final_values,
    gain_difference,
    hourly_difference,
    mean_ci,
    total_rewards,
    training_difference,
)
from sapo_core.experiment_summary import comparison_lines, floor_words, phase_words, reward_lines, tail_words


def _args(*argv):
    args = build_parser().parse_args(list(argv))
    args.stamp = "x"
    return args


def test_parse_configs_makes_arms_of_local_and_external_groups():
    arms = parse_configs("4/0, 2/2")
    assert [a.name for a in arms] == ["4/0", "2/2"]
    assert dict(arms[1].overrides) == {"round.local_groups": 2, "round.external_groups": 2}
    assert arms[0].tag == "4-0"
    for bad in ("4", "0/4", "a/b", "4/-1"):
        with pytest.raises(SystemExit):
            parse_configs(bad)


def test_parse_arm_reads_values_as_json_where_they_are():
    assert parse_arm("base:") == Arm("base", ())
    assert parse_arm("lr2e-4:train.learning_rate=2e-4").overrides == (("train.learning_rate", 2e-4),)
    arm = parse_arm(
        'w: tasks.weights={"basic_arithmetic": 1, "calendar_arithmetic": 2}, tasks.prompt=plain, '
        'tasks.system_prompt="Be brief, be right", train.gradient_checkpointing=false'
    )
    assert dict(arm.overrides) == {
        "tasks.weights": {"basic_arithmetic": 1, "calendar_arithmetic": 2},
        "tasks.prompt": "plain",
        "tasks.system_prompt": "Be brief, be right",
        "train.gradient_checkpointing": False,
    }
    assert parse_arm(f"again:{arm.spec()}").overrides == arm.overrides
    for bad, says in (
        ("nocolon", "NAME:key=value"),
        (":train.learning_rate=1e-4", "the name ''"),
        ("a b:x=1", "the name 'a b'"),
        ("a:train.learning_rate", "is not key=value"),
        ("a:x=1,x=2", "x is given twice"),
    ):
        with pytest.raises(SystemExit, match=says):
            parse_arm(bad)


@pytest.mark.parametrize(
    "spec, says",
    [
        ("lr:train.lerning_rate=1e-4", r"--arm lr: unknown key train.lerning_rate; did you mean train.learning_rate\?"),
        ("lr:train.learning_rate=2", r"--arm lr: train.learning_rate=2: train.learning_rate: must be in \(0, 1\)"),
        ("g:sampler.group_size=four", r"--arm g: sampler.group_size='four': .*expected int"),
        ("s:seed=3", r"--arm s: seed is set by the experiment"),
        ("s:swarm.enabled=true", r"--arm s: swarm.enabled is set by the experiment \(on where round.external"),
        # each alone is fine, together lower >= raise
        ("c:tasks.curriculum_raise=0.1,tasks.curriculum_lower=0.3", r"--arm c: tasks.curriculum_lower: need"),
    ],
)
def test_a_wrong_key_or_value_names_the_arm_and_the_key(tmp_path, spec, says):
    with pytest.raises(SystemExit, match=says):
        check_arms(_args(), [parse_arm("base:"), parse_arm(spec)], tmp_path)


def test_arms_are_checked_before_anything_runs_or_is_written(tmp_path):
    out = tmp_path / "out"
    with pytest.raises(SystemExit, match="--arm lr: unknown key"):
        main(["--arm", "base:", "--arm", "lr:train.lerning_rate=1e-4", "--out", str(out)])
    assert not out.exists()
    with pytest.raises(SystemExit, match="the name is taken by arm 2/0"):
        check_arms(_args(), [Arm("2/0"), Arm("2-0")], tmp_path)
    with pytest.raises(SystemExit, match="not both"):
        main(["--arm", "base:", "--configs", "2/0,1/1", "--out", str(out)])


def test_arm_overrides_win_over_the_experiments_settings(tmp_path):
    args = _args("--nodes", "2", "--group-size", "4")
    arms = [parse_arm("base:"), parse_arm("big:sampler.group_size=8,round.external_groups=1,train.learning_rate=1e-4")]
    specs = check_arms(args, arms, tmp_path)
    base, big = (node_config(args, tmp_path, 0, a, 1, None) for a in arms)
    assert (base.sampler.group_size, base.round.local_groups, base.round.external_groups) == (4, 2, 0)
    assert not base.swarm.enabled and base.train.learning_rate == 5e-5
    assert big.sampler.group_size == 8 and big.swarm.enabled and big.train.learning_rate == 1e-4
    assert base.seed == big.seed == 1  # node 1 of seed 0 in every arm: the pairs share their seeds
    assert specs == {
        "base": "no overrides (isolated: 2 local / 0 external groups)",
        "big": "sampler.group_size=8,round.external_groups=1,train.learning_rate=0.0001 "
        "(sharing: 2 local / 1 external groups)",
    }


@pytest.mark.parametrize("field, value, default", [("max_new_tokens", 48, 128), ("temperature", 0.7, 1.0)])
def test_an_arm_that_changes_training_only_is_measured_as_the_baseline(tmp_path, capsys, field, value, default):
    args = _args("--max-new-tokens", "128")
    arms = [parse_arm("base:"), parse_arm(f"changed:sampler.{field}={value}")]
    check_arms(args, arms, tmp_path)
    assert "warning" not in capsys.readouterr().err  # the held-out measure is the same for both
    base, changed = (node_config(args, tmp_path, 0, a, 0, None) for a in arms)
    assert (getattr(base.sampler, field), getattr(changed.sampler, field)) == (default, value)
    assert EvalSettings.for_config(changed) == EvalSettings.for_config(base)
    assert getattr(EvalSettings.for_config(changed), field) == default
    check_arms(args, [arms[0], parse_arm(f"evalchanged:eval.{field}={value}")], tmp_path)
    assert f"arm evalchanged sets eval.{field}" in capsys.readouterr().err


def test_node_configs_share_identities_across_arms_not_swarms(tmp_path):
    args = _args("--nodes", "2")
    iso, share = parse_configs("2/0,1/1")
    a = node_config(args, tmp_path, 0, iso, 1, None)
    b = node_config(args, tmp_path, 0, share, 1, "/ip4/127.0.0.1/tcp/1/p2p/QmX")
    c = node_config(args, tmp_path, 1, share, 1, None)
    assert a.swarm.identity_path == b.swarm.identity_path != c.swarm.identity_path
    assert not a.swarm.enabled and b.swarm.enabled and b.swarm.initial_peers
    assert a.run_dir != b.run_dir and b.swarm.swarm_name != c.swarm.swarm_name
    assert a.round.local_groups + a.round.external_groups == b.round.local_groups + b.round.external_groups
    assert a.eval.enabled and a.eval.every_rounds == 0 and (a.eval.questions, a.eval.samples) == (32, 4)


def _row(seed, arm, node, rnd, held="", sharing=0, **extra):
    return {
        "seed": seed,
        "arm": arm,
        "sharing": sharing,
        "node": node,
        "round": rnd,
        "reward_mean": 0.0,
        "solve_rate": 0.0,
        "groups_local_with_signal": 0,
        "groups_external": sharing,
        "groups_trained": 1,
        "round_seconds": 360.0,
        "train_tokens": 100.0,
        "eval_solve_rate": held,
        "eval_solve_rate_base": 0.1 if held != "" else "",
        **extra,
    }


def _finals(arm, values, sharing=0):
    """(seed, node) -> final held-out rate, evaluated at round 2 (round 1 evaluated at 0.9: not final)."""
    rows = []
    for (seed, node), v in values.items():
        rows.append(_row(seed, arm, node, 1, 0.9, sharing))
        rows.append(_row(seed, arm, node, 2, v, sharing, eval_solve_rate_basic_arithmetic=v + 0.1))
    return rows


# base and lr isolated, pairs by (seed, node): +0.1, +0.2, 0.0, +0.1
# share is a swarm, pairs by seed against base's seed means 0.3, 0.4: +0.2, +0.1
BASE = _finals("base", {(0, 0): 0.2, (0, 1): 0.4, (1, 0): 0.3, (1, 1): 0.5})
LR = _finals("lr", {(0, 0): 0.3, (0, 1): 0.6, (1, 0): 0.3, (1, 1): 0.6})
SHARE = _finals("share", {(0, 0): 0.5, (0, 1): 0.5, (1, 0): 0.4, (1, 1): 0.6}, sharing=1)
ROWS = BASE + LR + SHARE


def test_final_values_take_each_nodes_last_evaluation():
    finals = final_values(ROWS)
    assert finals[(0, "base", 1)] == 0.4 and finals[(1, "share", 0)] == 0.4 and len(finals) == 12
    assert final_values(ROWS, "eval_solve_rate_basic_arithmetic")[(0, "lr", 1)] == pytest.approx(0.7)


def test_isolated_arms_pair_by_seed_and_node_by_hand():
    d = difference(ROWS, "base", "lr")
    assert d.unit == "node" and d.keys == [(0, 0), (0, 1), (1, 0), (1, 1)]
    assert d.diffs == pytest.approx([0.1, 0.2, 0.0, 0.1])
    # mean 0.1, sd sqrt(0.02 / 3) = 0.08165, t(3) = 3.182: half-width 3.182 * 0.08165 / 2 = 0.1299
    assert d.mean == pytest.approx(0.1) and d.hi - d.mean == pytest.approx(0.1299, abs=1e-4)
    assert d.units() == "4 (seed, node) pairs"


def test_a_sharing_arm_pairs_by_seed_by_hand():
    d = difference(ROWS, "base", "share")
    assert d.unit == "seed" and d.keys == [(0,), (1,)] and d.diffs == pytest.approx([0.2, 0.1])
    # mean 0.15, sd 0.0707, t(1) = 12.706: half-width 12.706 * 0.0707 / sqrt(2) = 0.6353
    assert d.mean == pytest.approx(0.15) and d.hi - d.mean == pytest.approx(0.6353, abs=1e-3)
    assert d.units() == "2 seeds" and mean_ci([0.25]) == (0.25, 0.25, 0.25)
    one = difference([r for r in ROWS if r["seed"] == 0], "base", "share")
    assert one.n == 1 and one.interval() == "no interval from one seed"


def test_an_arm_asked_another_way_is_compared_on_its_gain_too_by_hand():
    """Arm `worked` asks the held-out questions with another prompt: its base model scores 0.25
    against `base`'s 0.1. Finals base 0.2, 0.4 and worked 0.45, 0.55: it ends +0.25 and +0.15 higher,
    but training added 0.2 and 0.3 against 0.1 and 0.3: gains +0.1 and +0.0, mean +0.05, t(1)
    12.706 x sd 0.0707 / sqrt 2 = 0.635 either side. Where the bases agree there is no such line."""
    rows = []
    for arm, base, finals in (("base", 0.1, (0.2, 0.4)), ("worked", 0.25, (0.45, 0.55))):
        for node, final in enumerate(finals):
            rows += [
                dict(_row(0, arm, node, 1, base), eval_solve_rate_base=base),
                dict(_row(0, arm, node, 2, final), eval_solve_rate_base=base),
            ]
    assert difference(rows, "base", "worked").diffs == pytest.approx([0.25, 0.15])
    g = gain_difference(rows, "base", "worked")
    assert g.keys == [(0, 0), (0, 1)] and g.diffs == pytest.approx([0.1, 0.0])
    assert g.mean == pytest.approx(0.05) and g.hi - g.mean == pytest.approx(0.635, abs=1e-3)
    lines = comparison_lines(rows, "base", "worked", [])
    assert any(
        line.startswith(
            "  gain over each arm's own base model (start level; the base models differ), worked - base: +0.050"
        )
        for line in lines
    )
    assert gain_difference(ROWS, "base", "lr") is None
    assert not any("own base model" in line for line in comparison_lines(ROWS, "base", "lr", []))


def test_training_solve_rate_difference_by_hand():
    rows = [dict(_row(0, "2/0", n, r), solve_rate=v) for n, r, v in ((0, 1, 0.0), (0, 2, 0.5), (1, 1, 0.25))]
    rows += [dict(_row(0, "1/1", 0, r, sharing=1), solve_rate=v) for r, v in ((1, 0.5), (2, 0.5))]
    rows += [dict(_row(1, "2/0", 0, 1), solve_rate=0.5), dict(_row(1, "1/1", 0, 1, sharing=1), solve_rate=0.25)]
    # seed 0: isolated nodes 0.25 and 0.25 (mean 0.25) against 0.5; seed 1: 0.5 against 0.25
    t = training_difference(rows, "2/0", "1/1")
    assert t.diffs == pytest.approx([0.25, -0.25]) and t.mean == pytest.approx(0.0) and t.lo < 0 < t.hi


def test_the_papers_total_reward_by_hand():
    rows = [dict(_row(s, "2/0", n, r), reward_mean=v) for s, n, r, v in ((0, 0, 1, 0.5), (0, 1, 1, 0.5), (1, 0, 1, 1))]
    rows += [dict(_row(0, "1/1", n, 1, sharing=1), reward_mean=v) for n, v in ((0, 0.75), (1, 0.75))]
    rows += [dict(_row(1, "1/1", 0, 1, sharing=1), reward_mean=2.0)]
    assert total_rewards(rows, "2/0") == {0: 1.0, 1: 1.0} and total_rewards(rows, "1/1") == {0: 1.5, 1: 2.0}
    base, share = reward_lines(rows, ["2/0", "1/1"])
    # seed 0: 1.5 / 1.0 = +50 %, seed 1: 2.0 / 1.0 = +100 %; mean +75 %, t(1) 12.706 x 35.36 / sqrt 2 = 318
    assert base.startswith("2/0: total training reward (the paper's measure) 1.00 (95% CI 1.00..1.00) over 2 seeds")
    assert "1.5 nodes x 1 rounds" in base  # seed 0 had 2 nodes, seed 1 one: said as the mean
    assert share.endswith("+75 % (95% CI -243..+393 %) over 2/0, per seed +50 %, +100 %")


def test_the_papers_measure_compares_arms_on_the_runs_both_have():
    """A pilot of nodes 0-1 paired with a full run of nodes 0-3: the full run's nodes 2-3 earn 1.0
    each, its nodes 0-1 0.5 and 0.5, the pilot's 0.55 and 0.55. Over the same two nodes 1.1 / 1.0
    = +10 %; the sums over all each arm ran (1.1 / 3.0) would say -63 %."""
    rows = [dict(_row(0, "full", n, 1), reward_mean=v) for n, v in ((0, 0.5), (1, 0.5), (2, 1.0), (3, 1.0))]
    rows += [dict(_row(0, "pilot", n, 1), reward_mean=0.55) for n in (0, 1)]
    full, pilot = reward_lines(rows, ["full", "pilot"])
    assert full.startswith("full: total training reward (the paper's measure) 3.00") and "4 nodes" in full
    assert pilot.startswith("pilot: total training reward (the paper's measure) 1.10") and "2 nodes" in pilot
    assert pilot.endswith("+10 % over full on the 2 (seed, node) runs both have, per seed +10 %")


def test_cost_and_gain_per_node_hour():
    cost = arm_cost(ROWS, "lr")  # 2 rounds of 360 s per node: 0.2 h; final 0.45 on average against base 0.1
    assert cost.round_seconds == 360.0 and cost.train_tokens == 100.0 and cost.node_hours == pytest.approx(0.2)
    assert cost.gain == pytest.approx(0.35) and cost.gain_per_node_hour == pytest.approx(1.75)


def test_gain_per_node_hour_difference_by_hand(tmp_path):
    """Arm b's rounds cost half of a's (180 s against 360 s: 0.1 h against 0.2 h per node) and it
    ends 0.1 lower on held-out in both pairs. Gains over the base 0.1 per node-hour: a 0.2 / 0.2 =
    1.0 and 0.4 / 0.2 = 2.0, b 0.1 / 0.1 = 1.0 and 0.3 / 0.1 = 3.0: pairs +0.0 and +1.0, mean +0.5,
    t(1) 12.706 x sd 0.7071 / sqrt 2 = 6.353 either side. A node never evaluated has no figure."""
    rows = []
    for arm, secs, finals in (("a", 360.0, (0.3, 0.5)), ("b", 180.0, (0.2, 0.4))):
        for node, final in enumerate(finals):
            rows += [_row(0, arm, node, 1, round_seconds=secs), _row(0, arm, node, 2, final, round_seconds=secs)]
    rows += [_row(0, "b", 2, 1, round_seconds=180.0)]  # no evaluation: not a replicate
    assert difference(rows, "a", "b").diffs == pytest.approx([-0.1, -0.1])
    h = hourly_difference(rows, "a", "b")
    assert h.keys == [(0, 0), (0, 1)] and h.diffs == pytest.approx([0.0, 1.0])
    assert h.mean == pytest.approx(0.5) and h.hi - h.mean == pytest.approx(6.353, abs=1e-3)
    lines = write_outputs(rows, tmp_path, "title", ["a", "b"])
    want = "  held-out gain per node-hour of rounds, b - a: +0.500 (95% CI -5.853..+6.853) over 2 (seed, node) pairs"
    assert want in lines


def test_what_a_node_round_costs_against_the_baseline_by_hand(tmp_path):
    """Node 0: a's rounds 10 and 10 s, b's 12 and 14 -> 13 / 10 = 1.3; node 1: 8 s in both -> 1.0.
    Mean 1.15, sd 0.3 / sqrt 2, half-width t(1) 12.706 x 0.15 = 1.906. The trained tokens are
    equal (1.00x); the phase columns are absent, so they are left out. Written and read back, the same."""
    seconds = {("a", 0): [10, 10], ("b", 0): [12, 14], ("a", 1): [8, 8], ("b", 1): [8, 8]}
    rows = [
        _row(0, arm, node, i + 1, held=0.3 if i == 1 else "", round_seconds=float(t))
        for (arm, node), ts in seconds.items()
        for i, t in enumerate(ts)
    ]
    r = cost_ratios(rows, "a", "b")
    assert list(r) == ["round_seconds", "train_tokens"]
    assert r["round_seconds"].diffs == pytest.approx([1.3, 1.0]) and r["round_seconds"].mean == pytest.approx(1.15)
    assert r["round_seconds"].hi - 1.15 == pytest.approx(1.906, abs=1e-3)
    want = (
        "  cost per node-round, b / a, the mean of the pairs' ratios over 2 (seed, node) pairs "
        "(only where both ran at once): a round 1.15x (95% CI -0.76..3.06), trained tokens 1.00x (95% CI 1.00..1.00)"
    )
    assert want in write_outputs(rows, tmp_path, "title", ["a", "b"])
    again, _, _ = read_rows([str(tmp_path / "experiment.csv")])
    assert cost_ratios(again, "a", "b")["round_seconds"].diffs == pytest.approx([1.3, 1.0])


RESULTS = Path(__file__).parents[1] / "docs" / "results"
BASE_SEEDS_0_1 = ["lab-2026-11-27-band.csv", "lab-2026-11-27-band-seed1.csv"]  # the recipe lab's base, seeds 0-1


def _committed(names, arms):
    """The rows of `arms` in the committed CSVs `names`."""
    rows, _, _ = read_rows([str(RESULTS / n) for n in names])
    return [r for r in rows if r["arm"] in arms]


def _rounded(c, digits=3):
    return c.unit, c.n, round(c.mean, digits), round(c.lo, digits), round(c.hi, digits)


def test_the_committed_side_by_side_costs_recompute():
    """The results README quotes g4q8 at 1.31x base a node-round (0.88..1.74), sampling 1.58x, the
    update 1.17x, and tok48 at 0.950x (0.870..1.031), sampling 0.88x, the update 0.99x: recomputed
    from the committed CSVs."""
    rows, _, _ = read_rows([str(RESULTS / "lab-2026-11-28-g4q8-timing.csv")])
    r = cost_ratios(rows, "base", "g4q8")
    got = {k: round(c.mean, 2) for k, c in r.items()}
    assert got == {"round_seconds": 1.31, "sample_seconds": 1.58, "update_seconds": 1.17, "train_tokens": 1.2}
    assert _rounded(r["round_seconds"], 2)[3:] == (0.88, 1.74)
    rows, _, _ = read_rows([str(RESULTS / "lab-2026-11-28-tok48-timing.csv")])
    r = cost_ratios(rows, "base", "tok48")
    got = {k: _rounded(c, 2)[2:] for k, c in r.items() if k != "train_tokens"}
    assert got == {
        "round_seconds": (0.95, 0.87, 1.03),
        "sample_seconds": (0.88, 0.77, 1.0),
        "update_seconds": (0.99, 0.92, 1.06),
    }


LITE_DRGRPO = [*BASE_SEEDS_0_1, "lab-2026-12-04-lite.csv", "lab-2026-12-04-drgrpo.csv"]
WORKED_SEEDS_0_1 = ["lab-2026-12-01-worked.csv"]  # the worked prompt's rows, the default since 2026-12-05
# What the results README and experiment.md quote for each recipe-lab arm run alone and paired by
# (seed, node): (files, against, arm, pairs, start level, every level, training solve rate), each a
# (mean, lo, hi) over the pairs; None where the docs quote no such figure.
COMMITTED_ARMS = [
    (
        [*BASE_SEEDS_0_1, "lab-2026-12-04-nocurr.csv"],  # tasks.curriculum=false
        "base",
        "nocurr",
        8,
        (0.007, -0.023, 0.037),
        (0.004, -0.008, 0.016),
        (0.094, 0.074, 0.114),
    ),
    (
        [*BASE_SEEDS_0_1, "lab-2026-12-04-lite.csv"],  # train.advantage_scale=batch
        "base",
        "lite",
        8,
        (-0.014, -0.042, 0.015),
        (-0.007, -0.022, 0.007),
        (0.005, -0.005, 0.014),
    ),
    (LITE_DRGRPO, "base", "drgrpo", 8, (-0.007, -0.027, 0.014), (-0.006, -0.017, 0.006), None),  # advantage_scale=none
    (LITE_DRGRPO, "lite", "drgrpo", 8, (0.007, -0.014, 0.028), None, None),
    (
        [*BASE_SEEDS_0_1, "lab-2026-12-05-seqmean.csv"],  # train.loss_mean=sequence, one_shot like base
        "base",
        "seqmean",
        8,
        (-0.009, -0.03, 0.012),
        (-0.004, -0.013, 0.005),
        (-0.001, -0.009, 0.006),
    ),
    (
        [*WORKED_SEEDS_0_1, "lab-2026-12-06-lr2.5e-5.csv"],  # train.learning_rate=2.5e-5, half the default
        "worked",
        "lr2.5e-5",
        8,
        (-0.017, -0.033, -0.0),
        (-0.013, -0.024, -0.001),
        (-0.018, -0.03, -0.006),
    ),
    (
        [*WORKED_SEEDS_0_1, "lab-2026-12-06-refill1-nodes0-1.csv"],  # round.refill_passes=1, nodes 0-1: a pilot
        "worked",
        "refill1",
        4,
        (0.02, -0.02, 0.059),
        (0.012, -0.006, 0.03),
        None,
    ),
    (
        ["lab-2026-12-07-r64.csv"],  # model.lora_rank=64, worked beside it: a pilot of 3 pairs
        "worked",
        "r64",
        3,
        (-0.008, -0.084, 0.068),
        (-0.007, -0.05, 0.037),
        (0.006, -0.024, 0.035),
    ),
    (
        ["lab-2026-12-07-g16q2.csv"],  # 2 questions of 16 completions, worked beside it: a pilot of 3 pairs
        "worked",
        "g16q2",
        3,
        (-0.006, -0.11, 0.098),
        (-0.008, -0.045, 0.03),
        (0.003, -0.027, 0.032),
    ),
    (
        # train.reference_guide, paired with worked's rows of the same machine: a pilot of 3 pairs
        ["lab-2026-12-07-g16q2.csv", "lab-2026-12-07-ref.csv"],
        "worked",
        "ref",
        3,
        (-0.008, -0.155, 0.139),
        (-0.011, -0.087, 0.065),
        (-0.013, -0.04, 0.013),
    ),
    (
        # train.guide_alone with the reference guide: the guide without our wrong answers, 3 pairs
        ["lab-2026-12-07-g16q2.csv", "lab-2026-12-07-refalone.csv"],
        "worked",
        "refalone",
        3,
        (-0.023, -0.147, 0.101),
        (-0.014, -0.08, 0.053),
        (-0.014, -0.051, 0.023),
    ),
    (
        # the guide alone against the guide with our wrong answers (ref): the same 3 (seed, node)
        ["lab-2026-12-07-ref.csv", "lab-2026-12-07-refalone.csv"],
        "ref",
        "refalone",
        3,
        (-0.016, -0.124, 0.093),
        (-0.003, -0.034, 0.029),
        (0.0, -0.018, 0.017),
    ),
    (
        # sampler.temperature=1.1, paired with worked's rows of the same machine: a pilot of 3 pairs
        ["lab-2026-12-07-g16q2.csv", "lab-2026-12-07-t11.csv"],
        "worked",
        "t11",
        3,
        (-0.001, -0.067, 0.065),
        (0.0, -0.019, 0.02),
        (-0.003, -0.037, 0.031),
    ),
    (
        # tasks.reask_share=0.5, paired with worked's rows of the same machine: a pilot of 3 pairs
        ["lab-2026-12-07-g16q2.csv", "lab-2026-12-07-reask.csv"],
        "worked",
        "reask",
        3,
        (-0.057, -0.226, 0.112),
        (-0.021, -0.11, 0.068),
        (0.187, 0.17, 0.204),
    ),
    # train.trained_layers=15 beside worked (an AVX-512 machine), seeds 0-1 nodes 0-1: 4 pairs
    (
        ["lab-2026-12-08-top15.csv"],
        "worked",
        "top15",
        4,
        (-0.012, -0.077, 0.054),
        (-0.003, -0.022, 0.016),
        (-0.017, -0.042, 0.009),
    ),
]


@pytest.mark.parametrize(
    "names, against, arm, pairs, start, every, training", COMMITTED_ARMS, ids=[f"{a[2]}-{a[1]}" for a in COMMITTED_ARMS]
)
def test_each_committed_lab_arm_recomputes(names, against, arm, pairs, start, every, training):
    """Each arm's quoted figures against the arm it pairs with, recomputed from the committed CSVs."""
    rows = _committed(names, (against, arm))
    assert _rounded(difference(rows, against, arm)) == ("node", pairs, *start)
    if every is not None:
        assert _rounded(difference(rows, against, arm, "eval_capability"))[2:] == every
    if training is not None:
        assert _rounded(training_difference(rows, against, arm))[2:] == training


# The pilots' side-by-side costs the docs quote: (files, against, arm, {column: expected}), each
# expected (mean,) or (mean, lo, hi) of the pairs' ratios at 2 digits.
COMMITTED_PILOT_COSTS = [
    # refill1 trains 1.54x worked's tokens over the 4 pairs both have; side by side with the defaults
    # (4 nodes x 30 rounds) a node-round costs 1.50x (1.20..1.81)
    ([*WORKED_SEEDS_0_1, "lab-2026-12-06-refill1-nodes0-1.csv"], "worked", "refill1", {"train_tokens": (1.54,)}),
    (["lab-2026-12-06-refill1-timing.csv"], "base", "refill1", {"round_seconds": (1.5, 1.2, 1.81)}),
    # r64 beside worked: a node-round 1.09x (0.93..1.26), sampling 1.09x (1.01..1.18)
    (
        ["lab-2026-12-07-r64.csv"],
        "worked",
        "r64",
        {"round_seconds": (1.09, 0.93, 1.26), "sample_seconds": (1.09, 1.01, 1.18)},
    ),
    # g16q2 beside worked: a node-round 1.17x (1.05..1.29), the update 1.17x on 1.09x the tokens
    (
        ["lab-2026-12-07-g16q2.csv"],
        "worked",
        "g16q2",
        {"round_seconds": (1.17, 1.05, 1.29), "update_seconds": (1.17,), "train_tokens": (1.09,)},
    ),
    # ref against worked's rows of the same machine, not side by side: 3.61x (3.51..3.70) the tokens
    (
        ["lab-2026-12-07-g16q2.csv", "lab-2026-12-07-ref.csv"],
        "worked",
        "ref",
        {"train_tokens": (3.61, 3.51, 3.7), "round_seconds": (3.41, 2.15, 4.67)},
    ),
    # refalone likewise: 2.38x (2.25..2.51) the tokens, a round 1.93x (1.81..2.05); 0.66x ref's tokens
    (
        ["lab-2026-12-07-g16q2.csv", "lab-2026-12-07-refalone.csv"],
        "worked",
        "refalone",
        {"train_tokens": (2.38, 2.25, 2.51), "round_seconds": (1.93, 1.81, 2.05)},
    ),
    (["lab-2026-12-07-ref.csv", "lab-2026-12-07-refalone.csv"], "ref", "refalone", {"train_tokens": (0.66, 0.62, 0.7)}),
    # t11 against worked's rows: 1.29x (0.93..1.65) the tokens (its seconds ran loaded: not quoted)
    (["lab-2026-12-07-g16q2.csv", "lab-2026-12-07-t11.csv"], "worked", "t11", {"train_tokens": (1.29, 0.93, 1.65)}),
    # reask likewise: 1.41x (1.18..1.65) the tokens (loaded seconds: not quoted)
    (["lab-2026-12-07-g16q2.csv", "lab-2026-12-07-reask.csv"], "worked", "reask", {"train_tokens": (1.41, 1.18, 1.65)}),
    # top15 beside worked: a node-round 0.91x (0.80..1.02), the update 0.81x (0.73..0.89) on 1.09x the tokens
    (
        ["lab-2026-12-08-top15.csv"],
        "worked",
        "top15",
        {"round_seconds": (0.91, 0.8, 1.02), "update_seconds": (0.81, 0.73, 0.89), "train_tokens": (1.09, 0.93, 1.24)},
    ),
]


@pytest.mark.parametrize(
    "names, against, arm, expected", COMMITTED_PILOT_COSTS, ids=[f"{a[2]}-{a[1]}" for a in COMMITTED_PILOT_COSTS]
)
def test_each_committed_pilot_cost_recomputes(names, against, arm, expected):
    """Each pilot's cost per node-round against the arm beside it (its held-out in COMMITTED_ARMS),
    recomputed from the committed CSVs."""
    cost = cost_ratios(_committed(names, (against, arm)), against, arm)
    assert {k: _rounded(cost[k], 2)[2 : 2 + len(v)] for k, v in expected.items()} == expected


def test_the_group_split_pilots_defaults_repeat_the_lora_rank_pilots_round_for_round():
    """worked's rows beside g16q2 are r64's run again, round for round (the same machine's kernels,
    the same seeds): the pairs of the two pilots are the same pairs."""
    rows = _committed(["lab-2026-12-07-g16q2.csv"], ("worked",))
    again = _committed(["lab-2026-12-07-r64.csv"], ("worked",))
    key = ("seed", "node", "round", "solve_rate", "train_tokens", "eval_solve_rate")
    assert sorted(tuple(r[k] for k in key) for r in rows) == sorted(tuple(r[k] for k in key) for r in again)


def test_the_committed_worked_example_at_equal_time_recomputes():
    """The results README and experiment.md quote worked (tasks.prompt=worked) against base at equal
    time (36 minutes of rounds a node, side by side) over 8 (seed, node) pairs: start level +0.040
    (+0.011..+0.070), every level +0.020 (+0.004..+0.035), a node-round 1.05x (0.88..1.23)."""
    rows = _committed(["lab-2026-12-04-worked-equal-time.csv"], ("base", "worked"))
    assert _rounded(difference(rows, "base", "worked")) == ("node", 8, 0.04, 0.011, 0.07)
    assert _rounded(difference(rows, "base", "worked", "eval_capability"))[2:] == (0.02, 0.004, 0.035)
    cost = cost_ratios(rows, "base", "worked")["round_seconds"]
    assert _rounded(cost, 2)[2:] == (1.05, 0.88, 1.23)


def test_the_committed_worked_example_at_equal_time_over_four_seeds_recomputes():
    """The decision that made `worked` the default prompt: over 16 (seed, node) pairs at equal time,
    start level +0.035 (+0.017..+0.053), every level +0.016 (+0.007..+0.026), a node-round 1.07x
    (0.96..1.18); seeds 2-3 alone +0.030 (+0.003..+0.057)."""
    names = ["lab-2026-12-04-worked-equal-time.csv", "lab-2026-12-05-worked-equal-time-seed2-3.csv"]
    rows = _committed(names, ("base", "worked"))
    assert _rounded(difference(rows, "base", "worked")) == ("node", 16, 0.035, 0.017, 0.053)
    assert _rounded(difference(rows, "base", "worked", "eval_capability"))[2:] == (0.016, 0.007, 0.026)
    cost = cost_ratios(rows, "base", "worked")["round_seconds"]
    assert _rounded(cost, 2)[2:] == (1.07, 0.96, 1.18)
    later = _committed(names[1:], ("base", "worked"))
    assert _rounded(difference(later, "base", "worked"))[1:] == (8, 0.03, 0.003, 0.057)


def test_the_committed_sharing_with_the_worked_prompt_recomputes():
    """The results README, experiment.md and the README quote 2/2w - 4/0w (the paper's take against
    isolated, I + J = 4, the worked prompt) over 6 seeds: start level +0.030 (+0.018..+0.043), every
    level +0.011 (+0.005..+0.017), per node-hour +0.41 (+0.14..+0.68), a node-round 1.19x
    (1.10..1.29) side by side; and what seeds 0-3 said before seeds 4-5 ran."""
    files = [f"arms-ij4-worked-2026-12-05-seed{s}.csv" for s in range(6)]
    rows = _committed(files, ("4/0w", "2/2w"))
    assert _rounded(difference(rows, "4/0w", "2/2w")) == ("seed", 6, 0.03, 0.018, 0.043)
    assert _rounded(difference(rows, "4/0w", "2/2w", "eval_capability"))[2:] == (0.011, 0.005, 0.017)
    assert _rounded(hourly_difference(rows, "4/0w", "2/2w"), 2)[2:] == (0.41, 0.14, 0.68)
    cost = cost_ratios(rows, "4/0w", "2/2w")["round_seconds"]
    assert _rounded(cost, 2)[2:] == (1.19, 1.1, 1.29)
    first = _committed(files[:4], ("4/0w", "2/2w"))
    assert _rounded(difference(first, "4/0w", "2/2w")) == ("seed", 4, 0.029, 0.005, 0.053)
    assert _rounded(hourly_difference(first, "4/0w", "2/2w"), 2)[2:] == (0.44, -0.05, 0.94)


def test_the_committed_eight_node_seeds_with_the_worked_prompt_recompute():
    """experiment.md and the results README quote 1/1 - 2/0 at 8 nodes x 100 rounds with the worked
    prompt, per seed (start level, every level, per node-hour, a node-round side by side): seed 0
    +0.016, +0.017, -0.10, 1.21x; seed 1 +0.035, +0.020, -0.08, 1.39x; seed 2 +0.010, +0.009,
    -0.42, 1.46x. Seeds 0-1: +0.026 (-0.096..+0.148), per node-hour -0.09 (-0.18..+0.00); seeds
    0-2: +0.021 (-0.012..+0.053), every level +0.015 (+0.001..+0.030), per node-hour -0.20
    (-0.66..+0.27), a node-round 1.36x (1.04..1.68). The likelihood floor dropped 298 of 6,076
    honest peer completions (4.9 %), by quarter 6.1, 5.0, 2.2, 6.1 %. Seed 3 +0.010, +0.011,
    -0.59, 1.50x; seeds 0-3 +0.018 (-0.001..+0.037), every level +0.014 (+0.006..+0.022), per
    node-hour -0.30 (-0.69..+0.10), a node-round 1.39x (1.19..1.60); the floor 436 of 8,204.
    Seed 4 -0.018, +0.001, -0.74, 1.45x; seeds 0-4 +0.011 (-0.013..+0.035), every level +0.012
    (+0.003..+0.021), per node-hour -0.39 (-0.75..-0.02), a node-round 1.40x (1.26..1.54); the
    floor 514 of 10,352 (5.0 %). Seed 5 +0.013, +0.008, -0.30, 1.36x; seeds 0-5 +0.011
    (-0.007..+0.029), every level +0.011 (+0.004..+0.018), per node-hour -0.37 (-0.65..-0.10), a
    node-round 1.40x (1.29..1.51); the floor 588 of 12,426 (4.7 %)."""
    files = [f"sharing-8n-worked-2026-12-05-seed{s}.csv" for s in range(6)]
    arms = ("2/0", "1/1")
    per_seed = [(0.016, 0.017, -0.1, 1.21), (0.035, 0.02, -0.08, 1.39), (0.01, 0.009, -0.42, 1.46)]
    per_seed += [(0.01, 0.011, -0.59, 1.5), (-0.018, 0.001, -0.74, 1.45), (0.013, 0.008, -0.3, 1.36)]
    for name, want in zip(files, per_seed):
        rows = _committed([name], arms)
        assert max(int(r["round"]) for r in rows) == 100 and len({r["node"] for r in rows}) == 8
        got = (
            _rounded(difference(rows, *arms))[2],
            _rounded(difference(rows, *arms, "eval_capability"))[2],
            _rounded(hourly_difference(rows, *arms), 2)[2],
            _rounded(cost_ratios(rows, *arms)["round_seconds"], 2)[2],
        )
        assert got == want, name
    two = _committed(files[:2], arms)
    assert _rounded(difference(two, *arms)) == ("seed", 2, 0.026, -0.096, 0.148)
    assert _rounded(hourly_difference(two, *arms), 2)[2:] == (-0.09, -0.18, 0.0)
    floor = (
        "  the likelihood floor dropped {} peer completions it judged ({}); by quarter of the rounds {}; per seed {}"
    )
    pools = [  # seeds, start level, every level, per node-hour, a node-round, the floor's words
        (
            3,
            (0.021, -0.012, 0.053),
            (0.015, 0.001, 0.03),
            (-0.2, -0.66, 0.27),
            (1.36, 1.04, 1.68),
            ("298 of the 6076", "4.9 %", "6.1 %, 5.0 %, 2.2 %, 6.1 %", "4.1 %, 5.5 %, 5.0 %"),
        ),
        (
            4,
            (0.018, -0.001, 0.037),
            (0.014, 0.006, 0.022),
            (-0.3, -0.69, 0.1),
            (1.39, 1.19, 1.6),
            ("436 of the 8204", "5.3 %", "6.3 %, 5.4 %, 3.0 %, 6.4 %", "4.1 %, 5.5 %, 5.0 %, 6.5 %"),
        ),
        (
            5,
            (0.011, -0.013, 0.035),
            (0.012, 0.003, 0.021),
            (-0.39, -0.75, -0.02),
            (1.4, 1.26, 1.54),
            ("514 of the 10352", "5.0 %", "5.8 %, 4.7 %, 3.3 %, 6.0 %", "4.1 %, 5.5 %, 5.0 %, 6.5 %, 3.6 %"),
        ),
        (
            6,
            (0.011, -0.007, 0.029),
            (0.011, 0.004, 0.018),
            (-0.37, -0.65, -0.1),
            (1.4, 1.29, 1.51),
            ("588 of the 12426", "4.7 %", "5.6 %, 4.4 %, 3.5 %, 5.3 %", "4.1 %, 5.5 %, 5.0 %, 6.5 %, 3.6 %, 3.6 %"),
        ),
    ]
    for n, held, every, hourly, cost, words in pools:
        rows = _committed(files[:n], arms)
        assert _rounded(difference(rows, *arms)) == ("seed", n, *held)
        assert _rounded(difference(rows, *arms, "eval_capability"))[2:] == every, n
        assert _rounded(hourly_difference(rows, *arms), 2)[2:] == hourly, n
        assert _rounded(cost_ratios(rows, *arms)["round_seconds"], 2)[2:] == cost, n
        assert floor_words([r for r in rows if r["arm"] == "1/1"]) == floor.format(*words), n


def test_where_a_node_round_goes_by_hand(tmp_path):
    """Two node-rounds of 10 s and 6 s: update 6 and 2, sampling 3 and 3, peers' text 0.5 and 0.5
    -> means 8 s: update 4 (50 %), sampling 3 (38 %), peers 0.5 (6 %), the rest 0.5 (6 %); the
    evaluation's 20 s after the last round -> 10 s more per node-round. Written and read back, the
    same; a file of before the phase columns says nothing of them."""
    phases = [
        {"update_seconds": 6.0, "sample_seconds": 3.0, "likelihood_seconds": 0.5, "eval_seconds": 0.0},
        {"update_seconds": 2.0, "sample_seconds": 3.0, "likelihood_seconds": 0.5, "eval_seconds": 20.0},
    ]
    rows = [
        _row(0, "a", 0, 1, round_seconds=10.0, **phases[0]),
        _row(0, "a", 0, 2, held=0.3, round_seconds=6.0, **phases[1]),
    ]
    cost = arm_cost(rows, "a")
    assert cost.phases == dict(update_seconds=4.0, sample_seconds=3.0, likelihood_seconds=0.5, eval_seconds=10.0)
    want = (
        "  a node-round's 8.00 s: update 4.00 s (50 %), sampling 3.00 s (38 %), checking peers' text 0.50 s (6 %), "
        "the rest 0.50 s (6 %); held-out evaluation 10.00 s more per node-round"
    )
    assert phase_words(cost) == want
    write_outputs(rows, tmp_path, "title", ["a"], {"a": ""})
    again, _, _ = read_rows([str(tmp_path / "experiment.csv")])
    assert phase_words(arm_cost(again, "a")) == want and want in (tmp_path / "summary.txt").read_text()
    assert phase_words(arm_cost(ROWS, "lr")) is None  # no phase columns: nothing said


def test_what_completions_cut_at_the_limit_cost_by_hand(tmp_path):
    """Four node-rounds of 6, 14, 6 and 6 s, the second with 1 of 32 completions cut -> 25 % of
    them, 14 s against 6 s; the mean 8 s against 6 s without: they add 25 %. Written and read back,
    the same; a file without the column, or an arm with no round cut, says nothing."""
    cut = [0.0, 1 / 32, 0.0, 0.0]
    rows = [
        _row(0, "a", 0, i + 1, held=0.3 if i == 3 else "", round_seconds=t, completions_cut=c)
        for i, (t, c) in enumerate(zip([6, 14, 6, 6], cut))
    ]
    want = (
        "  node-rounds with a completion cut at the length limit: 25 %, 14.00 s against 6.00 s; "
        "they add 25 % to the rounds' time"
    )
    assert tail_words(rows) == want
    write_outputs(rows, tmp_path, "title", ["a"], {"a": ""})
    again, _, _ = read_rows([str(tmp_path / "experiment.csv")])
    assert tail_words(again) == want and want in (tmp_path / "summary.txt").read_text()
    assert tail_words(ROWS) is None and tail_words([r | {"completions_cut": 0.0} for r in rows]) is None


def test_outputs(tmp_path):
    specs = {"base": "no overrides", "lr": "train.learning_rate=0.0001", "share": "round.external_groups=1"}
    lines = write_outputs(ROWS, tmp_path, "title", ["base", "lr", "share"], specs)
    with open(tmp_path / "experiment.csv") as f:
        read = list(csv.DictReader(f))
    assert list(read[0]) == [*CSV_FIELDS, "eval_solve_rate_basic_arithmetic"] and len(read) == len(ROWS)
    assert (tmp_path / "experiment.png").stat().st_size > 1000
    summary = (tmp_path / "summary.txt").read_text()
    assert summary.startswith("title\narm base: no overrides\narm lr: train.learning_rate=0.0001\n")
    assert "base: final held-out solve rate 0.350 (95% CI 0.145..0.555) over 4 nodes (independent runs)" in summary
    assert "share: final held-out solve rate 0.500 (95% CI 0.500..0.500) over 2 seeds" in summary
    assert "1.75" in next(line for line in lines if line.startswith("lr: final"))  # gain per node-hour
    assert "lr - base: +0.100 (95% CI -0.030..+0.230) over 4 (seed, node) pairs" in summary
    assert "share - base: +0.150 (95% CI -0.485..+0.785) over 2 seeds" in summary
    assert "  per dataset: basic_arithmetic +0.100 (95% CI -0.030..+0.230)" in summary
    assert lines[-4].startswith("  training solve rate over all rounds")
    assert lines[-1].startswith("share: total training reward (the paper's measure) 0.00")  # no reward, no %


def test_outputs_without_matplotlib_say_what_to_install(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # `import matplotlib` raises ImportError
    lines = write_outputs(ROWS, tmp_path, "title", ["base", "lr"])
    assert lines[-1] == PLOT_NEEDS_MATPLOTLIB and "pip install 'sapo-swarm[experiment]'" in lines[-1]
    assert not (tmp_path / "experiment.png").exists()
    assert (tmp_path / "experiment.csv").is_file() and (tmp_path / "summary.txt").is_file()


OLD_FIELDS = [
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
]


def test_rows_of_several_files_are_summarised_together_old_and_new(tmp_path):
    """Seeds run at different times: --from-csv merges their rows (a later file's row replaces the
    same seed, arm, node and round) and summarises them as one run would. A file written before
    arms (a `config` column of I/J names, no `sharing` column) reads as arms of those names."""
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir()
    b.mkdir()
    old = [  # seed 0: isolated 0.2, 0.4; sharing 0.5, 0.5 -> +0.2 by seed
        (0, "2/0", 0, 0.2),
        (0, "2/0", 1, 0.4),
        (0, "1/1", 0, 0.5),
        (0, "1/1", 1, 0.5),
        (1, "2/0", 0, 0.3),  # replaced by file b's row
    ]
    with open(a / "experiment.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=OLD_FIELDS)
        writer.writeheader()
        for seed, config, node, held in old:
            row = dict.fromkeys(OLD_FIELDS, 0)
            writer.writerow(row | {"seed": seed, "config": config, "node": node, "round": 100, "eval_solve_rate": held})
    (a / "summary.txt").write_text("SAPO: 4 nodes x 100 rounds x 1 seeds, m\n1/1 - 2/0: +0.2\n")
    # seeds 1 and 2 in the new format: 0.3 against 0.3 -> 0; 0.5 against 0.4 -> -0.1
    rows = [_row(1, "2/0", 0, 100, 0.3), _row(1, "1/1", 0, 100, 0.3, 1), _row(2, "2/0", 0, 100, 0.5)]
    write_outputs(rows + [_row(2, "1/1", 0, 100, 0.4, 1)], b, "title b", ["2/0", "1/1"], {"1/1": "J=1"})
    out = tmp_path / "merged"
    assert main(["--from-csv", str(a / "experiment.csv"), str(b / "experiment.csv"), "--out", str(out)]) == 0
    with open(out / "experiment.csv") as f:
        merged = list(csv.DictReader(f))
    assert len(merged) == 8 and {r["arm"] for r in merged} == {"2/0", "1/1"}
    summary = (out / "summary.txt").read_text()
    assert summary.startswith("SAPO: 4 nodes x 100 rounds x 3 seeds, m (seeds 0, 1, 2 from 2 file(s))\n")
    assert "arm 1/1: J=1" in summary
    assert "1/1 - 2/0: +0.033 (95% CI -0.346..+0.413) over 3 seeds" in summary
    # --configs (or --arm) names pick the arms and their order
    assert main(["--from-csv", str(a / "experiment.csv"), "--configs", "1/1,2/0", "--out", str(out)]) == 0
    one = (out / "summary.txt").read_text()
    assert "2/0 - 1/1: -0.200 (no interval from one seed) over 1 seed" in one
    # one seed of a sharing arm is one replicate: no interval, rather than a zero-width one
    assert "1/1: final held-out solve rate " in one and "(no interval from one seed) over 1 seed (a sharing" in one
    assert "(the paper's measure) 0.00 (no interval from one seed) over 1 seed," in one
    (tmp_path / "bad.csv").write_text("x,y\n1,2\n")
    with pytest.raises(SystemExit, match="not an experiment.csv"):
        main(["--from-csv", str(tmp_path / "bad.csv"), "--out", str(out)])


def test_the_comparison_up_to_a_round_of_a_longer_run(tmp_path, capsys):
    """Two isolated arms over 4 rounds, held-out measured at rounds 1 (the base 0.1), 2 and 4:
    a 0.3 and 0.35 at round 2, 0.5 and 0.5 at 4; b 0.4 and 0.4, then 0.4 and 0.45. At the end
    b - a is -0.1 and -0.05 (mean -0.075); up to round 2, +0.1 and +0.05 (+0.075), and the
    hours count two rounds. Up to round 3 the round-2 figures stand in, and a warning says so."""
    held = {("a", 0): (0.3, 0.5), ("a", 1): (0.35, 0.5), ("b", 0): (0.4, 0.4), ("b", 1): (0.4, 0.45)}
    rows = []
    for (arm, node), (at2, at4) in held.items():
        rows += [
            _row(0, arm, node, 1, 0.1),
            _row(0, arm, node, 2, at2),
            _row(0, arm, node, 3),
            _row(0, arm, node, 4, at4),
        ]
    src = tmp_path / "run"
    src.mkdir()
    write_outputs(rows, src, "SAPO: 2 nodes x 4 rounds x 1 seeds, m", ["a", "b"], {"a": "", "b": "x=1"})
    csv_path, out = str(src / "experiment.csv"), str(tmp_path / "out")
    assert main(["--from-csv", csv_path, "--out", out]) == 0
    assert "b - a: -0.075 (95% CI" in (tmp_path / "out" / "summary.txt").read_text()
    assert main(["--from-csv", csv_path, "--up-to-round", "2", "--out", out]) == 0
    summary = (tmp_path / "out" / "summary.txt").read_text()
    assert summary.startswith("SAPO: 2 nodes x 4 rounds x 1 seeds, m, up to round 2 (seeds 0 from 1 file(s))\n")
    assert "b - a: +0.075 (95% CI" in summary
    assert "a: final held-out solve rate 0.325" in summary  # 0.3 and 0.35
    assert capsys.readouterr().err == ""
    assert main(["--from-csv", csv_path, "--up-to-round", "3", "--out", out]) == 0
    warned = capsys.readouterr().err
    assert "held-out not measured at round 3 for 4 node(s)" in warned and "seed 0 a node 0 at round 2" in warned
    with pytest.raises(SystemExit, match="at least 1"):
        main(["--from-csv", csv_path, "--up-to-round", "-1", "--out", out])
    with pytest.raises(SystemExit, match="--from-csv"):
        main(["--up-to-round", "2"])


_DRY = ["--model", "tiny-random", "--nodes", "2", "--rounds", "2", "--eval-questions", "1", "--eval-samples", "1"]
_DRY += ["--group-size", "2", "--max-new-tokens", "4", "--threads", "1"]


def test_what_the_likelihood_floor_dropped_by_hand(tmp_path):
    """A sharing arm of 2 seeds x 4 rounds (a quarter each), 10 peer completions judged a round;
    seed 0 judged none in round 4. Dropped: seed 0 0, 1, 2; seed 1 1, 0, 0, 4 -> 8 of 70 (11.4 %);
    by quarter 1/20, 1/20, 2/20, 4/10; per seed 3/30, 5/40. Written and read back, the same; an
    isolated arm, or a file without the columns, says nothing."""
    dropped = {0: [0, 1, 2, ""], 1: [1, 0, 0, 4]}
    rows = [
        _row(
            seed,
            "share",
            0,
            i + 1,
            held=0.3 if i == 3 else "",
            sharing=1,
            floor_judged="" if d == "" else 10.0,
            floor_dropped=d,
        )
        for seed, ds in dropped.items()
        for i, d in enumerate(ds)
    ]
    want = (
        "  the likelihood floor dropped 8 of the 70 peer completions it judged (11.4 %); by quarter of the "
        "rounds 5.0 %, 5.0 %, 10.0 %, 40.0 %; per seed 10.0 %, 12.5 %"
    )
    assert floor_words(rows) == want
    assert floor_words(rows[4:]).endswith("(12.5 %); by quarter of the rounds 10.0 %, 0.0 %, 0.0 %, 40.0 %")
    write_outputs(rows, tmp_path, "title", ["share"], {"share": ""})
    again, _, _ = read_rows([str(tmp_path / "experiment.csv")])
    assert floor_words(again) == want and want in (tmp_path / "summary.txt").read_text()
    assert floor_words(ROWS) is None and floor_words([r | {"floor_judged": ""} for r in rows]) is None


def test_a_dry_run_of_two_recipe_arms_end_to_end(tmp_path, data_dir):
    """Two isolated arms, 2 nodes x 2 seeds x 2 rounds: each arm's nodes really ran with its settings
    (the run directories' config snapshots), and the arms compare pair by pair on (seed, node)."""
    out = tmp_path / "out"
    argv = [*_DRY, "--seeds", "2", "--eval-every", "0", "--out", str(out)]
    assert main([*argv, "--arm", "base:", "--arm", "lr:train.learning_rate=1e-3,train.steps_per_round=1"]) == 0
    with open(out / "experiment.csv") as f:
        rows = list(csv.DictReader(f))
    assert [(r["seed"], r["arm"], r["round"], r["node"]) for r in rows] == [
        (str(s), a, str(r), str(n)) for s in (0, 1) for a in ("base", "lr") for r in (1, 2) for n in (0, 1)
    ]
    assert all(r["eval_solve_rate"] != "" and r["sharing"] == "0" for r in rows)
    assert all(r[f"eval_solve_rate_{d}"] != "" for r in rows for d in ("basic_arithmetic", "calendar_arithmetic"))
    # where each node-round went, and the final evaluation's time on the last round's row
    assert all(float(r["sample_seconds"]) > 0 and float(r["update_seconds"]) >= 0 for r in rows)
    assert all(float(r["eval_seconds"]) > 0 for r in rows if r["round"] == "2")
    for seed in (0, 1):
        for node in (0, 1):
            base = tomllib.loads((out / "runs" / f"seed{seed}-base" / f"node{node}" / "config.toml").read_text())
            lr = tomllib.loads((out / "runs" / f"seed{seed}-lr" / f"node{node}" / "config.toml").read_text())
            assert base["train"]["learning_rate"] == 5e-5 and base["train"]["steps_per_round"] == 2
            assert lr["train"]["learning_rate"] == 1e-3 and lr["train"]["steps_per_round"] == 1
            assert base["seed"] == lr["seed"] == seed * 1000 + node and not lr["swarm"]["enabled"]
    summary = (out / "summary.txt").read_text()
    assert "arm lr: train.learning_rate=0.001,train.steps_per_round=1 (isolated" in summary
    assert "lr - base: " in summary and "over 4 (seed, node) pairs" in summary
    assert summary.count("  a node-round's ") == 2 and "held-out evaluation" in summary
    assert (out / "experiment.png").is_file()


@pytest.mark.network
def test_a_dry_run_of_two_seeds_isolated_against_sharing(tmp_path, data_dir):
    out = tmp_path / "out"
    assert main([*_DRY, "--seeds", "2", "--configs", "1/0,1/1", "--eval-every", "1", "--out", str(out)]) == 0
    with open(out / "experiment.csv") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 2 * 2 * 2 * 2  # seeds x arms x nodes x rounds
    assert all(r["eval_solve_rate"] != "" for r in rows)
    assert {r["sharing"] for r in rows if r["arm"] == "1/1"} == {"1"}
    # the likelihood floor (on by default) judged the sharing nodes' peer text each round; alone, none
    assert {(r["floor_judged"], r["floor_dropped"]) for r in rows if r["arm"] == "1/0"} == {("", "")}
    assert all(0 <= float(r["floor_dropped"]) <= float(r["floor_judged"]) for r in rows if r["arm"] == "1/1")
    summary = (out / "summary.txt").read_text()
    assert "1/1 - 1/0: " in summary and "over 2 seeds" in summary
    assert (out / "experiment.png").is_file()


@pytest.mark.network
def test_runs_in_parallel_processes_write_the_same_rows(tmp_path, data_dir):
    """--jobs 2: each (seed, arm) in a spawned process of its own; the rows come back in the order
    one process writes them, the sharing run's identities made before the runs start."""
    out = tmp_path / "out"
    argv = [*_DRY, "--seeds", "1", "--configs", "1/0,1/1", "--eval-every", "2", "--jobs", "2", "--out", str(out)]
    assert main(argv) == 0
    with open(out / "experiment.csv") as f:
        rows = list(csv.DictReader(f))
    assert [(r["arm"], r["round"], r["node"]) for r in rows] == [
        (c, str(r), str(n)) for c in ("1/0", "1/1") for r in (1, 2) for n in (0, 1)
    ]
    assert sorted(p.name for p in (out / "identities").iterdir()) == ["seed0-node0.key", "seed0-node1.key"]
    assert "1/1 - 1/0" in (out / "summary.txt").read_text()


def _start_until_both_runs_round(tmp_path) -> tuple[subprocess.Popen, list[str]]:
    """sapo-experiment --jobs 2 (an isolated and a sharing run) of many rounds, up to the moment
    both runs have finished a round: the sharing run's p2pd daemons are up."""
    argv = [*_DRY, "--rounds", "1000", "--seeds", "1", "--configs", "1/0,1/1", "--eval-every", "0", "--jobs", "2"]
    proc = subprocess.Popen(
        [sys.executable, "-m", "sapo_core.experiment", *argv, "--out", str(tmp_path / "out")],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    lines: list[str] = []
    threading.Thread(target=lambda: lines.extend(proc.stdout), daemon=True).start()
    deadline = time.monotonic() + 240
    wanted = ("[seed 0 1/0 node1] round 1/", "[seed 0 1/1 node1] round 1/")
    while not all(any(w in line for line in list(lines)) for w in wanted):
        assert proc.poll() is None, "".join(lines)
        assert time.monotonic() < deadline, "".join(lines)
        time.sleep(0.5)
    return proc, lines


@pytest.mark.network
@pytest.mark.parametrize("how", ["SIGTERM", "SIGKILL"])
def test_a_stopped_experiment_leaves_no_run_behind(tmp_path, data_dir, how):
    """`kill` of sapo-experiment --jobs 2 mid-run: its runs close their nodes (the sharing run's
    p2pd daemons with them) and it exits 143 saying where the finished runs are. Killed with
    SIGKILL it can tell nobody: the runs see their parent gone and stop by themselves."""
    proc, lines = _start_until_both_runs_round(tmp_path)
    tree = psutil.Process(proc.pid).children(recursive=True)
    assert any(p.name() == "p2pd" for p in tree)
    if how == "SIGTERM":
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=STOP_GRACE_SECONDS + 30) == 128 + signal.SIGTERM
        time.sleep(0.5)  # the reader thread takes the last lines
        assert "sapo-experiment: stopped; the runs that had finished are in" in "".join(lines)
    else:
        proc.kill()
        proc.wait(timeout=10)
    gone, alive = psutil.wait_procs(tree, timeout=STOP_GRACE_SECONDS + 20)
    assert not alive, [p.pid for p in alive]


@pytest.mark.network
def test_every_node_in_its_own_process(tmp_path, data_dir):
    """--node-processes: each node of a run is a spawned process at its own pace; the sharing run's
    nodes meet through node 0's address, and the rows are those the in-turn run would write."""
    out = tmp_path / "out"
    argv = [*_DRY, "--seeds", "1", "--configs", "1/0,1/1", "--eval-every", "0", "--node-processes", "--out", str(out)]
    assert main(argv) == 0
    with open(out / "experiment.csv") as f:
        rows = list(csv.DictReader(f))
    assert [(r["arm"], r["round"], r["node"]) for r in rows] == [
        (c, str(r), str(n)) for c in ("1/0", "1/1") for r in (1, 2) for n in (0, 1)
    ]
    assert all(r["eval_solve_rate"] != "" for r in rows if r["round"] == "2")
    run = out / "runs" / "seed0-1-1"
    assert (run / "node1" / "config.toml").is_file()
    joined = tomllib.loads((run / "node1" / "config.toml").read_text())["swarm"]["initial_peers"]
    assert len(joined) == 1 and joined[0] == next(run.glob("join-*")).read_text()


@pytest.mark.network
def test_a_node_that_fails_stops_its_runs_others_from_waiting(tmp_path, data_dir):
    """Node 0 of the sharing run cannot start (its run directory is a file): node 1, waiting for
    its address, gives up at once instead of after JOIN_WAIT_SECONDS, and the experiment says
    which run failed."""
    out = tmp_path / "out"
    (out / "runs" / "seed0-1-1").mkdir(parents=True)
    (out / "runs" / "seed0-1-1" / "node0").write_text("in the way")
    argv = [*_DRY, "--seeds", "1", "--configs", "1/1", "--node-processes", "--out", str(out)]
    started = time.monotonic()
    with pytest.raises(SystemExit, match="seed 0 1/1: FileExistsError") as e:
        main(argv)
    assert "node0 failed" in str(e.value)
    assert time.monotonic() - started < 120


def test_minutes_end_a_run_early_with_a_final_evaluation(tmp_path, data_dir):
    """--minutes: past it the nodes take no further round and are evaluated after their last."""
    out = tmp_path / "out"
    argv = [*_DRY, "--rounds", "50", "--seeds", "1", "--arm", "base:", "--minutes", "0.001", "--out", str(out)]
    assert main(argv) == 0
    with open(out / "experiment.csv") as f:
        rows = list(csv.DictReader(f))
    assert {r["round"] for r in rows} == {"1"}
    assert all(r["eval_solve_rate"] != "" for r in rows)


@pytest.mark.network
def test_newcomers_among_veterans(tmp_path, data_dir):
    """--veterans: trained nodes (an earlier run's run directories) are copied, resume and join each
    sharing arm's swarm; the newcomers start fresh; the isolated arm runs its newcomers alone. The
    veterans' rows (round 0: their own last evaluation) stay out of the comparison, and the summary
    says when the newcomers reached the veterans' level."""
    pool = tmp_path / "pool"
    assert main([*_DRY, "--seeds", "1", "--arm", "vet:", "--rounds", "2", "--out", str(pool)]) == 0
    veterans = [str(pool / "runs" / "seed0-vet" / f"node{i}") for i in (0, 1)]
    out = tmp_path / "out"
    argv = [*_DRY, "--nodes", "1", "--seeds", "1", "--configs", "2/0,1/1", "--eval-every", "1", "--out", str(out)]
    assert main([*argv, "--veterans", *veterans, "--veterans-per-seed", "2"]) == 0
    with open(out / "experiment.csv") as f:
        rows = list(csv.DictReader(f))
    vets = [r for r in rows if r["role"] == "veteran"]
    assert sorted((r["node"], r["round"]) for r in vets) == [
        ("100", "0"),
        ("100", "1"),
        ("100", "2"),
        ("101", "0"),
        ("101", "1"),
        ("101", "2"),
    ]
    assert all(r["arm"] == "1/1" for r in vets)
    assert {(r["arm"], r["role"]) for r in rows if r["role"] != "veteran"} == {("2/0", ""), ("1/1", "newcomer")}
    run = out / "runs" / "seed0-1-1"
    assert (run / "veteran0" / "veteran-of.txt").read_text().strip() == str(Path(veterans[0]).resolve())
    assert tomllib.loads((run / "veteran0" / "config.toml").read_text())["round"]["external_groups"] == 1
    summary = (out / "summary.txt").read_text()
    assert "1/1 - 2/0: " in summary and "over 1 seed" in summary
    assert "veterans: held-out" in summary and "newcomers reach the veterans' level" in summary


@pytest.mark.node_process
def test_the_command_prints_its_comparison_after_the_runs(tmp_path, env):
    """`sapo-experiment` as a volunteer runs it (its own process): two isolated arms of the
    tiny-random node to the summary it prints last, each arm against the first."""
    argv = [*_DRY, "--seeds", "1", "--eval-every", "0", "--arm", "base:", "--arm", "lr:train.learning_rate=1e-3"]
    done = subprocess.run(
        [sys.executable, "-m", "sapo_core.experiment", *argv, "--out", str(tmp_path / "out")],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    out = done.stdout.splitlines()
    after = out[next(i for i, line in enumerate(out) if line.startswith("done in ")) :]
    assert any(line.startswith("lr - base: ") and "over 2 (seed, node) pairs" in line for line in after), after
    assert after[-1].startswith("lr: total training reward (the paper's measure) "), after[-1]
