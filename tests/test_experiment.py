"""sapo-experiment's pure parts: parsing configurations, the cumulative measure, its outputs.
(The run itself is real nodes in processes: `sapo-experiment --model tiny-random` is its dry run.)"""

from __future__ import annotations

import csv

import pytest

from sapo_core.experiment import CSV_FIELDS, cumulative, node_config, build_parser, parse_configs, write_outputs


def test_parse_configs():
    assert parse_configs("4/0, 2/2") == [(4, 0), (2, 2)]
    for bad in ("4", "0/4", "a/b", "4/-1"):
        with pytest.raises(SystemExit):
            parse_configs(bad)


def _row(config, node, rnd, reward):
    return {"config": config, "node": node, "round": rnd, "reward_mean": reward, "accuracy": 0.0,
            "groups_local_with_signal": 0, "groups_external": 2 if config == "2/2" else 0,
            "groups_trained": 1, "round_seconds": 1.0}


def test_cumulative_sums_nodes_then_accumulates_rounds():
    rows = [_row("4/0", 0, 1, 0.1), _row("4/0", 1, 1, 0.2), _row("4/0", 0, 2, 0.5), _row("4/0", 1, 2, 0.0),
            _row("2/2", 0, 1, 0.3)]
    curves = cumulative(rows)
    assert curves["4/0"] == pytest.approx([0.3, 0.8])
    assert curves["2/2"] == pytest.approx([0.3])


def test_outputs(tmp_path):
    rows = [_row("4/0", 0, 1, 0.1), _row("2/2", 0, 1, 0.4), _row("2/2", 0, 2, 0.2)]
    lines = write_outputs(rows, tmp_path, "title")
    with open(tmp_path / "experiment.csv") as f:
        read = list(csv.DictReader(f))
    assert list(read[0]) == list(CSV_FIELDS) and len(read) == 3
    assert (tmp_path / "experiment.png").stat().st_size > 1000
    assert "2/2: cumulative reward 0.600" in lines[1]
    assert (tmp_path / "summary.txt").read_text().startswith("title\n")


def test_node_configs_share_identities_across_configurations_not_swarms(tmp_path):
    args = build_parser().parse_args(["--nodes", "2"])
    args.stamp = "x"
    a = node_config(args, tmp_path, "4/0", 1, 4, 0, None, 1)
    b = node_config(args, tmp_path, "2/2", 1, 2, 2, "/ip4/127.0.0.1/tcp/1/p2p/QmX", 1)
    assert a.swarm.identity_path == b.swarm.identity_path
    assert not a.swarm.enabled and b.swarm.enabled and b.swarm.initial_peers
    assert a.run_dir != b.run_dir
    assert a.round.local_groups + a.round.external_groups == b.round.local_groups + b.round.external_groups
