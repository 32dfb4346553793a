"""Step 5 of the round: scored groups -> the sequences the update trains on, with advantages.

Each group's advantages are its rewards centred and normalised within the group (grpo.py). What trains:
- our own groups with their sampled token ids and the sampler's log-probs (the trainer checks
  its own against them); a completion that stopped by itself carries the stop token, so the
  policy learns when to stop;
- peers' groups re-tokenised with our tokenizer, as if our policy had written them (SAPO §3):
  exactly the text that was scored (cut to our max_new_tokens), with our stop token only when
  the peer says it finished and we did not cut it. Whole groups only (a group's advantages need
  all of it), within `swarm.max_external_tokens`; each one trained yields a receipt naming it.
  Where the peer sent its sampler's log-probs and they line up with our tokens (verify.py), they
  travel as the sequence's behaviour log-probs, marked as a peer's: with
  `train.peer_correction = tis` the update weights those tokens by the truncated importance
  ratio (trainer.py).
- mixed groups (swarm.take = mixed): our own completions to a peer's question that we got all
  wrong, with a peer's verified right completion added as a guide (LUFFY's mixed group, arXiv
  2504.14945): the group's advantages span both, our completions train as ours, the guide as a
  peer's text with `guide` set (the trainer shapes its tokens). Each yields a receipt. With
  `train.reference_guide` our own groups without a right completion are mixed groups too, the
  question's reference answer their guide (no receipt: no peer is named). With `train.guide_alone`
  a mixed group trains its guides alone, at the advantages they have in the whole group.
With `train.advantage_scale = batch` every group's centred rewards are divided by one std, that of
the rewards of our own local groups in the batch pooled (Lite PPO; grpo.batch_std); peers' and mixed
groups take that scale too, so nothing a peer sends changes the weight of our own completions
(with no local group in the batch, the std of every group's rewards). `none` divides by nothing.
Groups without reward spread are left out when there is no KL term: their advantage is exactly
0 and they would change no weight.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

import torch

from sapo_core import grpo
from sapo_core.config import NodeConfig
from sapo_core.rollouts import Completion, Group, Question
from sapo_core.trainer import TrainSequence


@dataclass
class Batch:
    sequences: list[TrainSequence] = field(default_factory=list)
    groups: int = 0  # groups trained, ours and peers'
    receipts: list[tuple[str, int, int]] = field(default_factory=list)  # (peer, its round, group index) trained
    capped: int = 0  # peers' groups left out by the external token budget
    reference_guided: int = 0  # mixed groups trained with the reference answer as guide (no receipt)


@dataclass
class Mixed:
    """Our own group on a peer's question, and the peer's right completions that join it."""

    own: Group  # our completions, scored by us
    prompt: list[int]  # the question's prompt, encoded
    guides: list[Completion]  # a peer's verified right completions (text re-tokenised by us)
    receipt: tuple[str, int, int] | None = None  # the peer's group it came from: (peer, its round, group index)


def external_token_ids(policy, c: Completion, max_new_tokens: int) -> list[int]:
    """A peer's completion as we train it (see the module docstring)."""
    full = list(c.token_ids) if c.token_ids is not None else policy.encode_completion(c.text)
    ids = full[:max_new_tokens]
    return ids + [policy.tokenizer.eos_token_id] if c.finished and len(full) <= max_new_tokens else ids


@dataclass(frozen=True)
class BatchRules:
    max_new_tokens: int  # peers' completions are cut to this (sampler.max_new_tokens)
    skip_flat: bool  # leave out groups without reward spread (no KL term: train.kl_beta == 0)
    external_token_budget: int  # peers' tokens per update, 0 for no limit (swarm.max_external_tokens)
    advantage_scale: str = "group"  # train.advantage_scale: group, batch or none
    guide_alone: bool = False  # train.guide_alone: a mixed group trains its guides, not our completions

    @classmethod
    def for_config(cls, cfg: NodeConfig) -> BatchRules:
        t = cfg.train
        max_new, ext = cfg.sampler.max_new_tokens, cfg.swarm.max_external_tokens
        return cls(max_new, t.kl_beta == 0, ext, t.advantage_scale, t.guide_alone)


def training_batch(
    policy,
    prompt_of: Callable[[Question], list[int]],
    local: Sequence[Group],
    prompts: Sequence[list[int]],
    external: Sequence[Group],
    rules: BatchRules,
    mixed: Sequence[Mixed] = (),
) -> Batch:
    """`local` groups with their encoded `prompts`, then `external` ones (prompts from `prompt_of`),
    then `mixed` ones."""
    batch = Batch()
    own_rewards: list[float] = []  # of the local groups trained (advantage_scale = batch)
    all_rewards: list[float] = []
    for g, prompt in zip(local, prompts):
        if rules.skip_flat and not g.has_signal():
            continue
        batch.groups += 1
        own_rewards += g.rewards
        for c, a in zip(g.completions, _advantages(g, rules)):
            batch.sequences.append(_own_sequence(policy, prompt, c, a))
    budget = rules.external_token_budget or float("inf")
    for g in external:
        if rules.skip_flat and not g.has_signal():
            continue
        ids = [external_token_ids(policy, c, rules.max_new_tokens) for c in g.completions]
        tokens = sum(len(x) for x in ids)
        if tokens > budget:
            batch.capped += 1
            continue
        budget -= tokens
        all_rewards += g.rewards
        batch.groups += 1
        batch.receipts.append((g.source, g.round, g.index))
        prompt = prompt_of(g.question)
        for c, x, a in zip(g.completions, ids, _advantages(g, rules)):
            lps = None
            if c.sample_logprobs is not None:  # lined up with our tokens; the stop token's is not sent
                lps = (list(c.sample_logprobs) + [float("nan")] * len(x))[: len(x)]
            batch.sequences.append(TrainSequence(prompt, x, a, lps, peer=True, spread=c.logprobs_spread))
    for m in mixed:
        whole = Group(m.own.question, [*m.own.completions, *m.guides])
        if rules.skip_flat and not whole.has_signal():
            continue
        batch.groups += 1
        if m.receipt is not None:  # a peer's guide
            batch.receipts.append(m.receipt)
        else:  # the reference answer's (train.reference_guide): no peer to name
            batch.reference_guided += 1
        all_rewards += whole.rewards
        advantages = _advantages(whole, rules)
        if not rules.guide_alone:  # train.guide_alone leaves our wrong completions out
            for c, a in zip(m.own.completions, advantages):
                batch.sequences.append(_own_sequence(policy, m.prompt, c, a))
        for c, a in zip(m.guides, advantages[len(m.own.completions) :]):
            ids = external_token_ids(policy, c, rules.max_new_tokens)
            batch.sequences.append(TrainSequence(m.prompt, ids, a, None, peer=True, guide=True))
    if rules.advantage_scale == "batch" and batch.sequences:
        std = grpo.batch_std(own_rewards or all_rewards)
        batch.sequences = [replace(x, advantage=x.advantage / std) for x in batch.sequences]
    return batch


def _own_sequence(policy, prompt: list[int], c: Completion, advantage: float) -> TrainSequence:
    """One of our completions as it trains: its sampled ids and the sampler's log-probs; one that
    stopped by itself with the stop token (the policy learns when to stop)."""
    ids, lps = list(c.token_ids or []), list(c.sample_logprobs or [])
    if c.finished:
        ids, lps = ids + [policy.tokenizer.eos_token_id], lps + [float("nan")]  # its sampling log-prob is not reported
    return TrainSequence(prompt, ids, advantage, lps if c.sample_logprobs is not None else None)


def _advantages(g: Group, rules: BatchRules) -> list[float]:
    """Centred and divided by the group's std (scale group), or only centred (batch: divided later)."""
    scale = "group" if rules.advantage_scale == "group" else "none"
    return grpo.group_advantages(torch.tensor([g.rewards]), scale=scale)[0].tolist()  # (1, G) -> (G,)


__all__ = ["Batch", "BatchRules", "Mixed", "training_batch", "external_token_ids"]
