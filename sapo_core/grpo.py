"""GRPO's math as pure functions: group advantages, the clipped surrogate, KL, log-probs.

No I/O, no globals, no model: tensors in, tensors out, shapes in comments. The update in
`trainer.py` strings these together. Departures from the GRPO paper (DeepSeekMath) here:
- the surrogate is clipped asymmetrically, 1 - eps_low .. 1 + eps_high (SAPO §4: 0.2 / 0.28,
  as in DAPO), and aggregated per token over the whole batch, not per sequence;
- no KL term unless `beta > 0` (SAPO uses none), and then the k3 estimator.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint


def group_advantages(rewards: torch.Tensor, eps: float = 1e-4, scale: str = "group") -> torch.Tensor:
    """(N, G) rewards -> (N, G) advantages: r - the group's mean, divided by the group's std
    (`scale="group"`, GRPO) or not divided (`"none"`: Dr. GRPO, arXiv 2503.20783, and the first half
    of Lite PPO's batch scaling, `batch_std` below).

    A group whose rewards are all equal carries no signal and gets exactly zero, whatever eps.
    std is the unbiased one (as in TRL / DeepSeekMath).
    """
    mean = rewards.mean(dim=1, keepdim=True)  # (N, 1)
    adv = rewards - mean
    if scale == "group":
        adv = adv / (rewards.std(dim=1, keepdim=True, unbiased=True) + eps)  # (N, 1) std
    flat = (rewards.max(dim=1, keepdim=True).values - rewards.min(dim=1, keepdim=True).values) <= 1e-9
    return torch.where(flat, torch.zeros_like(adv), adv)


def batch_std(rewards: list[float], eps: float = 1e-4) -> float:
    """The divisor of Lite PPO's advantages (group mean, batch std; arXiv 2508.08221): the
    unbiased std of every reward of the batch's groups, pooled, plus eps. Where a group's spread is
    small next to the batch's, its advantages stay small, where GRPO's per-group std would blow them
    up to the size of any other group's."""
    if len(rewards) < 2:
        return 1.0
    return float(torch.tensor(rewards, dtype=torch.float64).std(unbiased=True)) + eps


@dataclass
class SurrogateStats:
    clipped_low: torch.Tensor  # () fraction of tokens where the lower bound acted
    clipped_high: torch.Tensor  # () fraction of tokens where the upper bound acted
    ratio_mean: torch.Tensor  # () mean importance ratio


def clipped_surrogate(
    logp: torch.Tensor,  # (B, T) log-probs under the current policy
    old_logp: torch.Tensor,  # (B, T) under the policy that sampled (detached)
    advantages: torch.Tensor,  # (B,) one per sequence
    mask: torch.Tensor,  # (B, T) 1 on completion tokens
    eps_low: float,
    eps_high: float,
) -> tuple[torch.Tensor, SurrogateStats]:
    """Per-token loss (B, T), zero outside the mask: -min(r A, clip(r, 1-eps_low, 1+eps_high) A)."""
    ratio = torch.exp(logp - old_logp)  # (B, T)
    adv = advantages.unsqueeze(1)  # (B, 1)
    unclipped = ratio * adv
    clipped = torch.clamp(ratio, 1.0 - eps_low, 1.0 + eps_high) * adv
    loss = -torch.minimum(unclipped, clipped) * mask
    with torch.no_grad():
        n = mask.sum().clamp(min=1)
        # The clip "acts" where the clipped term is the smaller one and differs.
        low = ((ratio < 1.0 - eps_low) & (adv < 0)).float() * mask
        high = ((ratio > 1.0 + eps_high) & (adv > 0)).float() * mask
        stats = SurrogateStats(low.sum() / n, high.sum() / n, (ratio * mask).sum() / n)
    return loss, stats


def policy_shaping(logp: torch.Tensor, gamma: float) -> torch.Tensor:
    """(N,) LUFFY's shaped probability f(p) = p / (p + gamma) of each token (arXiv 2504.14945, §3.3),
    p = exp(logp). Its gradient, gamma / (p + gamma)^2 * grad p, peaks where p = gamma: a peer's
    token the policy finds unlikely (but not absurd) teaches most, one it already writes little."""
    p = torch.exp(logp)
    return p / (p + gamma)


def kl_k3(logp: torch.Tensor, ref_logp: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """(B, T) per-token KL(pi || ref) estimate k3 = exp(ref - logp) - (ref - logp) - 1 (>= 0)."""
    d = ref_logp - logp
    return (torch.exp(d) - d - 1.0) * mask


def token_logprobs(
    hidden: torch.Tensor,  # (N, H) hidden states that predict `targets`
    head_weight: torch.Tensor,  # (V, H) output embedding
    targets: torch.Tensor,  # (N,) token ids
    chunk: int = 1024,
    temperature: float = 1.0,
) -> torch.Tensor:
    """(N,) log p(target) without materialising N x V logits for the backward pass.

    Logits are built `chunk` rows at a time and recomputed in the backward pass
    (activation checkpointing), so peak memory is chunk x V, not N x V: with Qwen's 152k
    vocabulary and a few thousand tokens that is the difference between MBs and GBs.
    """
    out = []
    for start in range(0, hidden.shape[0], chunk):
        h = hidden[start : start + chunk]
        t = targets[start : start + chunk]
        if torch.is_grad_enabled() and (h.requires_grad or head_weight.requires_grad):
            out.append(checkpoint(_chunk_logprobs, h, head_weight, t, temperature, use_reentrant=False))
        else:
            out.append(_chunk_logprobs(h, head_weight, t, temperature))
    return torch.cat(out) if out else hidden.new_zeros(0)


def _chunk_logprobs(h: torch.Tensor, w: torch.Tensor, t: torch.Tensor, temperature: float) -> torch.Tensor:
    # in h's precision (the trainer hands fp32 hidden states): a bf16 copy of the weights is
    # widened here, chunk by chunk, rather than kept twice
    logits = F.linear(h, w.to(h.dtype)).float()  # (n, V)
    if temperature != 1.0:
        logits = logits / temperature
    picked = logits.gather(1, t.unsqueeze(1)).squeeze(1)  # (n,)
    return picked - torch.logsumexp(logits, dim=1)
