"""Sampling with transformers' `generate`, batched: all prompts x G sequences in one call.

The fallback where llama.cpp is missing or crashed, and the GPU path when the installed
llama.cpp has no GPU backend. It samples from the policy's own model, so it always follows
the policy (nothing to sync). rl-swarm calls `generate` G times in a Python loop; here the
G copies of every prompt decode together.

Seeds: `generate` draws from one global generator, so a call is reproducible from the
prompts' seeds, but a sequence's tokens depend on the batch it was in (llama.cpp's backend
seeds each sequence on its own).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from sapo_core.hooks import RoundHooks
from sapo_core.policy import Policy
from sapo_core.sampler.base import SampledSequence, SamplingParams


class _CheckpointCriteria:
    """A StoppingCriteria that gives the round hooks a chance every decoded token."""

    def __init__(self, hooks: RoundHooks, total: int) -> None:
        self.hooks, self.total, self.steps = hooks, total, 0

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor, **kwargs) -> torch.Tensor:
        self.steps += 1
        self.hooks.checkpoint()
        self.hooks.progress("sample", self.steps * input_ids.shape[0], self.total)
        return torch.zeros(input_ids.shape[0], dtype=torch.bool, device=input_ids.device)


class TransformersSampler:
    name = "transformers"

    def __init__(self, policy: Policy, max_batch_sequences: int = 64) -> None:
        self.policy = policy
        self.max_batch_sequences = max_batch_sequences

    def sample(
        self, prompts: Sequence[Sequence[int]], seeds: Sequence[int], params: SamplingParams, hooks: RoundHooks
    ) -> list[list[SampledSequence]]:
        per_call = max(1, self.max_batch_sequences // params.n)
        out: list[list[SampledSequence]] = []
        for start in range(0, len(prompts), per_call):
            out.extend(
                self._sample_batch(prompts[start : start + per_call], seeds[start : start + per_call], params, hooks)
            )
        return out

    def _sample_batch(
        self, prompts: Sequence[Sequence[int]], seeds: Sequence[int], params: SamplingParams, hooks: RoundHooks
    ) -> list[list[SampledSequence]]:
        from transformers import StoppingCriteriaList

        model, tok = self.policy.model, self.policy.tokenizer
        pad = tok.pad_token_id
        width = max(len(p) for p in prompts)
        # left padding: every prompt ends where generation starts
        ids = torch.full((len(prompts), width), pad, dtype=torch.long)
        att = torch.zeros((len(prompts), width), dtype=torch.long)
        for i, p in enumerate(prompts):
            ids[i, width - len(p) :] = torch.tensor(list(p))
            att[i, width - len(p) :] = 1
        torch.manual_seed(hash(tuple(seeds)) & 0x7FFFFFFF)
        eos = list(params.stop_token_ids or self.policy.eos_ids)
        model.eval()
        device = next(model.parameters()).device
        with torch.inference_mode():
            gen = model.generate(
                input_ids=ids.to(device),
                attention_mask=att.to(device),
                do_sample=True,
                temperature=params.temperature,
                top_p=params.top_p,
                top_k=0,
                max_new_tokens=params.max_new_tokens,
                num_return_sequences=params.n,
                eos_token_id=eos,
                pad_token_id=pad,
                output_scores=True,
                return_dict_in_generate=True,
                use_cache=True,
                stopping_criteria=StoppingCriteriaList(
                    [_CheckpointCriteria(hooks, len(prompts) * params.n * params.max_new_tokens)]
                ),
            )
        new = gen.sequences[:, width:]  # (P*G, T), on the model's device
        steps = len(gen.scores)
        # one step at a time: (P*G, T, V) log-probs at once would be GBs
        picked = torch.stack(
            [
                torch.log_softmax(sc.float(), dim=-1).gather(1, new[:, t : t + 1]).squeeze(1)
                for t, sc in enumerate(gen.scores)
            ],
            dim=1,
        ).cpu()  # (P*G, T)
        new = new.cpu()
        out: list[list[SampledSequence]] = []
        eos_set = set(eos)
        for i in range(len(prompts)):
            group = []
            for j in range(params.n):
                row = i * params.n + j
                toks, lps, finished = [], [], False
                for t in range(steps):
                    tid = int(new[row, t])
                    if tid in eos_set:
                        finished = True
                        break
                    toks.append(tid)
                    lps.append(float(picked[row, t]))
                group.append(SampledSequence(token_ids=toks, logprobs=lps, finished=finished))
            out.append(group)
        return out

    def sync_policy(self, policy: Policy) -> None:
        self.policy = policy  # samples from the live model: always in sync

    def set_threads(self, n: int) -> None:
        if n > 0:
            torch.set_num_threads(n)

    def close(self) -> None:
        return None
