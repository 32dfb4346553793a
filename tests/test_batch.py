"""Scored groups -> training sequences (batch.py), on the real tiny-random policy's tokenizer."""

from __future__ import annotations

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
    assert batch.groups == 1 and batch.receipts == [("peer-a", 7, 2)]
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
