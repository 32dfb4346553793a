"""Three real nodes on loopback that share groups for a few rounds and train on each other's.

The light test runs the whole round (`Node.run_round`: sample, score, publish, gather,
verify, GRPO update, checkpoint, store row) with the tiny random test model. Its sampler is
the one stand-in: a random 2-layer model never answers right, every group would have equal
rewards and the paper's filter would leave nothing to share, so `ScriptedSampler` writes the
right answer in some completions (as token ids of the node's own tokenizer). The slow test
runs the real embedded model with its real sampler.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from sapo_core.config import NodeConfig
from sapo_core.contributions import receipt_totals
from sapo_core.hooks import NullHooks
from sapo_core.sampler.base import SampledSequence

pytestmark = pytest.mark.network


class ScriptedSampler:
    """G completions per prompt, 1..G-1 of them with the right answer: groups with signal. Its
    log-probs are unknown (NaN), or `LOGPROB` per token where a subclass says so."""

    name = "scripted"
    LOGPROB = math.nan

    def __init__(self, node) -> None:
        self.node = node

    def sample(self, prompts, seeds, params, hooks):
        # the node samples its questions deterministically: the same call gives the same ones
        questions = self.node.tasks.sample_questions(self.node.next_round, len(prompts))
        tok = self.node.policy.tokenizer
        out = []
        for k, q in enumerate(questions):
            right = 1 + k % (params.n - 1)
            texts = [f"Answer: {q.answer}" if i < right else "Answer: -4242" for i in range(params.n)]
            ids = [tok.encode(t, add_special_tokens=False) for t in texts]
            out.append([SampledSequence(i, [self.LOGPROB] * len(i), True) for i in ids])
        return out

    def sync_policy(self, policy) -> None:
        return None

    def set_threads(self, n: int) -> None:
        return None

    def close(self) -> None:
        return None


class ScriptedSamplerWithLogprobs(ScriptedSampler):
    LOGPROB = -0.5


def _node_config(tmp: Path, i: int, join: str | None, **over) -> NodeConfig:
    changes = {
        "run_dir": str(tmp / f"node{i}"),
        "seed": i,
        "sampler.group_size": 4,
        "sampler.max_new_tokens": 16,
        "round.local_groups": 2,
        "round.external_groups": 2,
        "round.auto_scale": False,
        "train.steps_per_round": 1,
        "eval.enabled": False,  # held-out evaluation: tests/test_evaluation.py
        "swarm.swarm_name": "training-test",
        "swarm.host_maddrs": ["/ip4/127.0.0.1/tcp/0"],
        "swarm.window_seconds": 120.0,
        "swarm.identity_path": str(tmp / f"identity{i}.key"),
        "swarm.initial_peers": [join] if join else [],
    }
    changes.update(over)
    return NodeConfig().replace(**changes)


def _start_nodes(tmp: Path, n: int, scripted: bool | type, **over) -> list:
    from sapo_core.node import Node

    nodes, join = [], None
    factory = (scripted if isinstance(scripted, type) else ScriptedSampler) if scripted else None
    for i in range(n):
        node = Node(_node_config(tmp, i, join, **over), NullHooks(), sampler_factory=factory)
        node.setup()
        join = join or node.source.join_address
        nodes.append(node)
    return nodes


def _trainable(node) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in node.policy.trainable_state_dict().items()}


def test_three_nodes_train_on_each_others_groups(tmp_path, monkeypatch):
    monkeypatch.setenv("SAPO_DATA_DIR", str(tmp_path / "data"))
    # random weights find every text implausible: the likelihood floor is for real models (off here)
    nodes = _start_nodes(tmp_path, 3, scripted=True, **{"model.name": "tiny-random", "swarm.likelihood_floor": 0.0})
    try:
        ids = {n.source.node_id for n in nodes}
        assert len(ids) == 3  # three identities, not the process-wide one
        before = [_trainable(n) for n in nodes]
        rows: dict[int, list[dict]] = {i: [] for i in range(3)}
        for _ in range(3):
            for i, node in enumerate(nodes):
                rows[i].append(node.run_round())
        for i, node in enumerate(nodes):
            last = rows[i][-1]
            # from the second round on every node has peers' records to take J = 2 groups from
            assert last["groups/external"] == 2 and last["swarm/used"] == 2, last
            assert last["groups/trained"] == 4 and last["swarm/rejected"] == 0
            assert last["swarm/published"] == 2 and last["swarm/peers"] == 2
            stored = node.store.rounds()[-1].metrics
            assert stored["swarm/used"] == 2 and "swarm/gather_s" in stored and "swarm/dht_peers" in stored
            after = _trainable(node)
            assert any(not torch.equal(before[i][k], after[k]) for k in after)  # it trained
            # credit: peers' signed receipts for our groups they trained on reach our store;
            # a peer trains on our round r in its round r (or r+1) and names it in its next record
            receipts = node.store.receipts()
            assert receipts and {peer for peer, *_ in receipts} <= ids - {node.source.node_id}, receipts
            assert all(1 <= our_round <= 3 and 0 <= grp < 2 for _, our_round, grp, _, _ in receipts), receipts
            assert receipt_totals(node.store)["peers"] >= 1
            assert "train/peer_tokens" not in last  # no correction asked for
    finally:
        for node in nodes:
            node.close()


def test_corrected_sharing_weights_peers_tokens_by_their_sent_logprobs(tmp_path, monkeypatch):
    """train.peer_correction = tis across three real nodes: every peer completion arrives with
    the sender's log-probs lined up with our tokens, and the update weights them."""
    monkeypatch.setenv("SAPO_DATA_DIR", str(tmp_path / "data"))
    over = {"model.name": "tiny-random", "swarm.likelihood_floor": 0.0, "train.peer_correction": "tis"}
    nodes = _start_nodes(tmp_path, 3, scripted=ScriptedSamplerWithLogprobs, **over)
    try:
        for _ in range(2):
            last = [node.run_round() for node in nodes]
        for m in last:
            assert m["groups/external"] == 2 and m["swarm/rejected"] == 0, m
            assert m["swarm/logprobs_unaligned"] == 0  # one tokenizer: every completion lines up
            assert m["train/peer_tokens"] > 0 and m["train/peer_uncorrected"] == 0
            # the random model's log-probs are near -log(vocabulary), far below the claimed -0.5:
            # every ratio is tiny, no token is truncated, and the rest is weighed as estimated
            assert m["train/peer_truncated_frac"] == 0.0 and 0 < m["train/peer_weight_mean"] < 1
            assert m["train/peer_kl_mean"] > 0
    finally:
        for node in nodes:
            node.close()


@pytest.mark.slow
def test_three_embedded_model_nodes_share_real_rollouts(tmp_path, monkeypatch):
    """SmolLM2-135M with its real sampler. It answers right 5-8 % of the time on the easy mix
    (docs/environment.md, 'The embedded model'), so some groups carry signal; every node
    publishes, reads its peers' records and refuses nothing but what honest peers send too:
    zero-advantage groups, groups whose completions are all one text (`duplicates`), records
    whose groups with signal lost it on our re-scoring (`no_signal`, a light strike; records
    announced without signal cost none) and a few completions under the likelihood floor (chosen
    so that ~95 % of honest text passes: docs/calibration.md, 'Likelihood floor'); it ignores no
    peer."""
    monkeypatch.setenv("SAPO_DATA_DIR", str(tmp_path / "data"))
    nodes = _start_nodes(
        tmp_path,
        3,
        scripted=False,
        **{
            "model.name": "smollm2-135m-instruct",
            "sampler.group_size": 8,
            "sampler.max_new_tokens": 48,
            "sampler.threads": 1,
            "swarm.window_seconds": 300.0,
        },
    )
    try:
        last = {}
        for _ in range(2):
            for i, node in enumerate(nodes):
                last[i] = node.run_round()
        for m in last.values():
            m_swarm = {
                k: v for k, v in m.items() if k.startswith(("swarm/rejected", "swarm/unlikely", "swarm/ignored")) and v
            }
            assert m["swarm/published"] >= 1 and m["swarm/records"] == 2, m_swarm
            honest = ("zero_advantage", "duplicates", "no_signal", "unlikely")
            expected = sum(m.get(f"swarm/rejected/{r}", 0.0) for r in honest)
            assert m["swarm/rejected"] == expected and m["swarm/ignored_peers"] == 0, m_swarm
            # a gathered group whose completions fell under the likelihood floor until it had no
            # signal left is dropped before training (`unlikely_groups`): honest, and counted
            assert m["groups/external"] + m.get("swarm/unlikely_groups", 0.0) == m["swarm/used"] <= 2, m_swarm
            # the floor's drop rate has its denominator: the used groups' distinct completions
            assert m["swarm/unlikely"] <= m["swarm/judged"] <= 8 * m["swarm/used"], m_swarm
        # every group received is accepted or refused as one unit: honestly (no spread; all one
        # text), or because we already trained on it (a record read twice); nothing else
        shared = sum(m["swarm/accepted"] for m in last.values())
        per_group = ("rejected/zero_advantage", "rejected/duplicates", "reuse_avoided")
        refused = sum(m.get(f"swarm/{k}", 0.0) for m in last.values() for k in per_group)
        assert shared == sum(m["swarm/received"] for m in last.values()) - refused
        # unlikely counts completions: at most a quarter of the honest ones received (8 per group)
        assert sum(m["swarm/unlikely"] for m in last.values()) <= 0.25 * 8 * sum(
            m["swarm/received"] for m in last.values()
        )
        # each node says its model in its index entries: what the swarm's page shows of it
        from sapo_core.swarm.observer import SwarmObserver

        src = nodes[0]._source
        observer = SwarmObserver(src.dht, src.keyspace, src.tasks, {"swarm": "t"}, history_path=None)
        observer.poll()
        seen = {n["peer_id"]: n for n in observer.status()["nodes"]}
        assert {seen[n._source.node_id]["model"] for n in nodes} == {"smollm2-135m-instruct"}
    finally:
        for node in nodes:
            node.close()
