"""Scored groups -> training sequences (batch.py), on the real tiny-random policy's tokenizer."""

from __future__ import annotations

import pytest

from sapo_core.batch import BatchRules, training_batch
from sapo_core.rollouts import Completion, Group, Question, QuestionId

Q = Question(QuestionId("basic_arithmetic", "d", 0, 0), "Calculate 2 + 2.", "4")


@pytest.fixture(scope="module")
def policy(tmp_path_factory):
    from sapo_core.config import ModelConfig
    from sapo_core.modelfiles import embedded_gguf_path
    from sapo_core.policy import load_policy

    return load_policy(
        ModelConfig(name="tiny-random"), None, tmp_path_factory.mktemp("hf"), tokenizer_gguf=embedded_gguf_path()
    )


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
