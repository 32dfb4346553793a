"""Scored groups -> training sequences (batch.py), on the real tiny-random policy's tokenizer."""

from __future__ import annotations

import math

import pytest

from sapo_core.batch import BatchRules, training_batch
from sapo_core.rollouts import Completion, Group, Question, QuestionId

from helpers import tiny_random_policy

Q = Question(QuestionId("basic_arithmetic", "d", 0, 0), "Calculate 2 + 2.", "4")


@pytest.fixture(scope="module")
def policy(tmp_path_factory):
    return tiny_random_policy(cache_dir=tmp_path_factory.mktemp("hf"))


def ours(rewards, finished=True):
    return Group(
        Q,
        [
            Completion(
                f"Answer: {i}", token_ids=[10 + i, 11], sample_logprobs=[-0.1, -0.2], finished=finished, reward=r
            )
            for i, r in enumerate(rewards)
        ],
    )


def theirs(peer, index, rewards):
    return Group(
        Q,
        [Completion(f"Answer: {i}", finished=True, reward=r) for i, r in enumerate(rewards)],
        source=peer,
        round=7,
        index=index,
    )


def test_advantages_stop_tokens_flat_groups_and_receipts(policy):
    eos = policy.tokenizer.eos_token_id
    b = training_batch(
        policy,
        lambda q: [1, 2, 3],
        [ours([1.0, 0.0]), ours([0.0, 0.0])],
        [[5, 6], [5, 6]],
        [theirs("peerA", 0, [0.0, 1.0]), theirs("peerB", 1, [1.0, 1.0])],
        BatchRules(max_new_tokens=64, skip_flat=True, external_token_budget=0),
    )
    assert b.groups == 2 and b.receipts == [("peerA", 7, 0)] and b.capped == 0  # flat groups left out
    own = b.sequences[:2]
    assert [s.advantage for s in own] == pytest.approx([0.5 / 0.7071068, -0.5 / 0.7071068], rel=1e-3)
    assert own[0].completion_ids == [10, 11, eos] and own[0].prompt_ids == [5, 6]  # learns to stop
    peer = b.sequences[2:]
    assert peer[0].prompt_ids == [1, 2, 3] and peer[0].completion_ids == policy.encode_completion("Answer: 0") + [eos]
    assert peer[0].sample_logprobs is None and peer[1].advantage > 0


def test_with_a_kl_term_flat_groups_train_and_the_token_budget_takes_whole_groups(policy):
    one = len(policy.encode_completion("Answer: 0")) + 1
    b = training_batch(
        policy,
        lambda q: [1],
        [ours([0.0, 0.0], finished=False)],
        [[5]],
        [theirs("peerA", 0, [0.0, 1.0]), theirs("peerB", 1, [1.0, 0.0])],
        BatchRules(max_new_tokens=64, skip_flat=False, external_token_budget=2 * one + 1),
    )
    assert b.groups == 2 and b.capped == 1 and b.receipts == [("peerA", 7, 0)]
    assert [s.advantage for s in b.sequences[:2]] == [0.0, 0.0] and b.sequences[0].completion_ids == [10, 11]


def test_a_mixed_group_spans_our_completions_and_the_guide(policy):
    """Our four wrong completions and a peer's right one: the advantages are those of the five
    rewards together, ours train as ours (our ids, our log-probs, the stop token), the guide as the
    peer's re-tokenised text flagged guide (and peer, so it never counts as our sampler's drift)."""
    from sapo_core.batch import Mixed

    own = ours([0.0, 0.0, 0.0, 0.0])
    guide = Completion("Answer: 4", finished=True, reward=1.0)
    m = Mixed(own, [1, 2, 3], [guide], ("peer-a", 7, 2))
    batch = training_batch(policy, lambda q: [9], [], [], [], BatchRules(128, True, 0), [m])
    assert batch.groups == 1 and batch.receipts == [("peer-a", 7, 2)] and batch.reference_guided == 0
    advantages = [s.advantage for s in batch.sequences]
    # rewards 0 0 0 0 1: mean 0.2, unbiased std sqrt(0.2): (r - 0.2) / 0.4472
    assert advantages == pytest.approx([-0.4472] * 4 + [1.7889], abs=1e-3)
    assert [s.guide for s in batch.sequences] == [False] * 4 + [True]
    assert all(s.prompt_ids == [1, 2, 3] for s in batch.sequences)
    assert batch.sequences[0].completion_ids == [10, 11, policy.tokenizer.eos_token_id]
    g = batch.sequences[-1]
    assert g.peer and g.sample_logprobs is None
    assert g.completion_ids == policy.encode_completion("Answer: 4") + [policy.tokenizer.eos_token_id]
    flat = Mixed(ours([1.0, 1.0]), [1], [Completion("Answer: 4", reward=1.0)], ("peer-a", 7, 3))
    assert training_batch(policy, lambda q: [9], [], [], [], BatchRules(128, True, 0), [flat]).groups == 0
    reference = Mixed(ours([0.0, 0.0, 0.0, 0.0]), [1, 2, 3], [guide])  # train.reference_guide: no peer
    batch = training_batch(policy, lambda q: [9], [], [], [], BatchRules(128, True, 0), [reference])
    assert batch.groups == 1 and batch.receipts == [] and [s.guide for s in batch.sequences][-1]
    assert batch.reference_guided == 1


def test_guide_alone_trains_the_guide_at_its_advantage_in_the_whole_group(policy):
    """train.guide_alone: the mixed group of four wrong completions and a right guide trains the
    guide alone, at the advantage it has among all five (1.7889, above), our completions left out;
    a group of ours with spread is untouched, and a flat mixed group still trains nothing."""
    from sapo_core.batch import Mixed

    rules = BatchRules(128, True, 0, guide_alone=True)
    guide = Completion("Answer: 4", finished=True, reward=1.0)
    m = Mixed(ours([0.0, 0.0, 0.0, 0.0]), [1, 2, 3], [guide])
    batch = training_batch(policy, lambda q: [9], [ours([1.0, 0.0])], [[5]], [], rules, [m])
    assert batch.groups == 2 and batch.reference_guided == 1
    assert [(s.prompt_ids, s.guide) for s in batch.sequences] == [([5], False), ([5], False), ([1, 2, 3], True)]
    assert [s.advantage for s in batch.sequences] == pytest.approx([0.7071, -0.7071, 1.7889], abs=1e-3)
    flat = Mixed(ours([1.0, 1.0]), [1], [guide])
    assert training_batch(policy, lambda q: [9], [], [], [], rules, [flat]).sequences == []


def test_advantage_scales_hand_computed(policy):
    """Two local groups, 1 0 0 0 and 1 1 0 0 (and a flat one, left out): group divides each by its
    own std (0.5 and sqrt(1/3)), none by nothing, batch by the pooled std sqrt(15/56) of the eight."""
    local = [ours([1.0, 0.0, 0.0, 0.0]), ours([1.0, 1.0, 0.0, 0.0]), ours([0.0, 0.0, 0.0, 0.0])]

    def advantages(scale):
        b = training_batch(policy, lambda q: [1], local, [[5]] * 3, [], BatchRules(64, True, 0, scale))
        return [s.advantage for s in b.sequences]

    centred = [0.75, -0.25, -0.25, -0.25, 0.5, 0.5, -0.5, -0.5]
    s1, s2, pooled = 0.5 + 1e-4, math.sqrt(1 / 3) + 1e-4, math.sqrt(15 / 56) + 1e-4
    assert advantages("group") == pytest.approx([a / s1 for a in centred[:4]] + [a / s2 for a in centred[4:]])
    assert advantages("none") == pytest.approx(centred)
    assert advantages("batch") == pytest.approx([a / pooled for a in centred])


def test_under_batch_scale_a_peer_changes_no_weight_of_ours(policy):
    """Hostile peers: groups whose rewards differ by a hair (which the group's own std would blow up
    to the size of any other group's) and many all-but-one-wrong ones. Under batch scale our own
    advantages are those without them, and the hair stays a hair."""
    local = [ours([1.0, 0.0, 0.0, 0.0]), ours([1.0, 1.0, 0.0, 0.0])]
    hostile = [theirs("evil", 0, [0.0, 0.001, 0.0, 0.0])] + [
        theirs("evil", i, [1.0, 0.0, 0.0, 0.0]) for i in range(1, 9)
    ]

    def batch(external, scale="batch"):
        return training_batch(policy, lambda q: [1], local, [[5]] * 2, external, BatchRules(64, True, 0, scale))

    alone, attacked = batch([]), batch(hostile)
    assert [s.advantage for s in attacked.sequences[:8]] == [s.advantage for s in alone.sequences]
    hair = [abs(s.advantage) for s in attacked.sequences[8:12]]
    assert max(hair) < 0.002
    assert max(abs(s.advantage) for s in batch(hostile, "group").sequences[8:12]) == pytest.approx(
        1.25
    )  # 0.00075 / (0.0005 + eps)


def test_an_unknown_advantage_scale_is_refused_by_name():
    from sapo_core.config import NodeConfig
    from sapo_core.config_schema import ConfigError

    with pytest.raises(ConfigError, match="train.advantage_scale"):
        NodeConfig().replace(**{"train.advantage_scale": "token"})
