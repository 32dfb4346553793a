"""GRPO math against hand-computed values."""

import math

import pytest
import torch

from sapo_core import grpo


def test_group_advantages_hand_computed():
    # mean 0.25, unbiased std sqrt((0.75² + 3·0.25²)/3) = 0.5
    adv = grpo.group_advantages(torch.tensor([[1.0, 0.0, 0.0, 0.0]]), eps=0.0)
    assert adv.tolist() == [[1.5, -0.5, -0.5, -0.5]]


def test_zero_variance_group_gives_exactly_zero():
    adv = grpo.group_advantages(torch.tensor([[0.0, 0.0, 0.0], [1.0, 1.0, 1.0], [0.5, 0.5, 0.5]]))
    assert torch.equal(adv, torch.zeros(3, 3))


def test_groups_are_normalised_independently():
    adv = grpo.group_advantages(torch.tensor([[0.0, 1.0], [0.0, 3.0]]), eps=0.0)
    # each group: mean in the middle, unbiased std = |a-b|/sqrt(2)
    s = 1 / math.sqrt(2)
    assert adv[0].tolist() == pytest.approx([-s, s])
    assert adv[1].tolist() == pytest.approx([-s, s])


def test_advantages_without_the_std_are_only_centred():
    # Dr. GRPO: mean 0.25, nothing divided; a flat group still exactly zero
    adv = grpo.group_advantages(torch.tensor([[1.0, 0.0, 0.0, 0.0], [1.0, 1.0, 1.0, 1.0]]), scale="none")
    assert adv.tolist() == [[0.75, -0.25, -0.25, -0.25], [0.0, 0.0, 0.0, 0.0]]


def test_batch_std_pools_every_reward():
    # 1 0 0 0 and 1 1 0 0: mean 3/8, squared deviations 3 x (5/8)^2 + 5 x (3/8)^2 = 15/8, / 7 -> sqrt(15/56)
    assert grpo.batch_std([1.0, 0.0, 0.0, 0.0, 1.0, 1.0, 0.0, 0.0], eps=0.0) == pytest.approx(math.sqrt(15 / 56))
    assert grpo.batch_std([1.0]) == 1.0 and grpo.batch_std([]) == 1.0  # nothing to pool: divide by 1


@pytest.mark.parametrize(
    "ratio, adv, loss, low, high",
    [
        (1.5, 1.0, -1.28, 0.0, 1.0),  # above 1 + eps_high with A > 0: clipped at 1.28
        (1.5, -1.0, 1.5, 0.0, 0.0),  # A < 0: min picks the unclipped -1.5
        (0.5, -1.0, 0.8, 1.0, 0.0),  # below 1 - eps_low with A < 0: clipped at 0.8
        (0.5, 1.0, -0.5, 0.0, 0.0),  # A > 0: unclipped 0.5 is smaller
        (1.1, 2.0, -2.2, 0.0, 0.0),  # inside the band: plain ratio x A
    ],
)
def test_clipped_surrogate_is_asymmetric(ratio, adv, loss, low, high):
    logp = torch.tensor([[math.log(ratio)]])
    out, st = grpo.clipped_surrogate(logp, torch.zeros(1, 1), torch.tensor([adv]), torch.ones(1, 1), 0.2, 0.28)
    assert out.item() == pytest.approx(loss, rel=1e-6)
    assert st.clipped_low.item() == low
    assert st.clipped_high.item() == high


def test_clipped_tokens_carry_no_gradient():
    logp = torch.tensor([[math.log(1.5), math.log(1.1)]], requires_grad=True)
    out, _ = grpo.clipped_surrogate(logp, torch.zeros(1, 2), torch.tensor([1.0]), torch.ones(1, 2), 0.2, 0.28)
    out.sum().backward()
    # d(-r A)/d logp = -r A: 0 for the clipped token, -1.1 for the other
    assert logp.grad[0, 0].item() == 0.0
    assert logp.grad[0, 1].item() == pytest.approx(-1.1)


def test_padding_is_masked():
    logp = torch.tensor([[0.1, 5.0]])
    out, st = grpo.clipped_surrogate(
        logp, torch.zeros(1, 2), torch.tensor([1.0]), torch.tensor([[1.0, 0.0]]), 0.2, 0.28
    )
    assert out[0, 1].item() == 0.0
    assert st.clipped_high.item() == 0.0  # the padded token's huge ratio is not counted


def test_kl_k3():
    logp = torch.tensor([0.0, math.log(2.0)])
    ref = torch.tensor([0.0, 0.0])
    kl = grpo.kl_k3(logp, ref, torch.ones(2))
    # d = ref - logp = -log 2: exp(d) - d - 1 = 0.5 + log 2 - 1
    assert kl.tolist() == pytest.approx([0.0, 0.5 + math.log(2) - 1])


def test_chunked_logprobs_match_full_softmax_and_gradients():
    torch.manual_seed(0)
    h = torch.randn(37, 8, requires_grad=True)
    w = torch.randn(50, 8, requires_grad=True)
    t = torch.randint(0, 50, (37,))
    got = grpo.token_logprobs(h, w, t, chunk=16, temperature=0.7)
    full = torch.log_softmax((h @ w.T) / 0.7, dim=-1).gather(1, t[:, None]).squeeze(1)
    assert torch.allclose(got, full, atol=1e-5)
    g1 = torch.autograd.grad(got.sum(), (h, w))
    g2 = torch.autograd.grad(full.sum(), (h, w))
    for a, b in zip(g1, g2):
        assert torch.allclose(a, b, atol=1e-5)


def test_policy_shaping_by_hand():
    """LUFFY's f(p) = p / (p + gamma): 0.5 at p = gamma, its gradient in logp p*gamma/(p+gamma)^2
    largest there (0.25) and small for tokens the policy already writes (p near 1)."""
    from sapo_core.grpo import policy_shaping

    logp = torch.log(torch.tensor([0.1, 0.9, 0.01], requires_grad=False)).requires_grad_(True)
    f = policy_shaping(logp, 0.1)
    assert f.tolist() == pytest.approx([0.5, 0.9 / 1.0, 0.01 / 0.11], rel=1e-5)
    f.sum().backward()
    assert logp.grad.tolist() == pytest.approx([0.25, 0.9 * 0.1 / 1.0**2, 0.01 * 0.1 / 0.11**2], rel=1e-4)
