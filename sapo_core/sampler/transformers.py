"""Sampling with transformers' `generate`, batched: all prompts x G sequences in one call.

The fallback where llama.cpp is missing or crashed, and the GPU path when the installed
llama.cpp has no GPU backend. It samples from the policy's own model, so it always follows
the policy (nothing to sync). rl-swarm calls `generate` G times in a Python loop; here the
G copies of every prompt decode together.

Seeds: `generate` draws from one global generator, so a call is reproducible from the
prompts' seeds, but a sequence's tokens depend on the batch it was in (llama.cpp's backend
seeds each sequence on its own).

The sampled tokens' log-probs are read one step behind the decoding (`_ChosenLogprobs`), so only
one step's vocabulary-wide scores are held at a time: `output_scores` would keep every step's,
gigabytes for a GPU-sized batch. A batch holds at most 64 sequences on the CPU and 256 on a GPU.

On a GPU it decodes from a merged copy of the policy (LoRA folded into the weights, refreshed
when `policy.version` moves): a decode step there is bound by kernel launches, and the LoRA
layers' extra small matmuls made a step 1.8x slower (H200, SmolLM2-135M, 8 prompts x 8:
42.6 ms a step wrapped, 24.2 ms merged; docs/experiment.md, "The paper's setting on a lent
H200"). The copy costs one more set of weights, so on the CPU, where llama.cpp samples and this
backend is only the fallback, the LoRA layers stay (`merge=True` asks for the copy there too).
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from typing import Any

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


class _ChosenLogprobs:
    """A LogitsProcessor that keeps each step's log-softmax until the next step shows which token
    was drawn, and then only that token's log-prob: (B,) a step instead of (B, V). generate runs
    our processors before its temperature and top-p warpers, so it applies the same two itself:
    the log-probs of the distribution the tokens were drawn from."""

    def __init__(self, temperature: float, top_p: float) -> None:
        from transformers import TopPLogitsWarper

        self.temperature = temperature
        self._top_p = TopPLogitsWarper(top_p=top_p) if top_p < 1.0 else None
        self.picked: list[torch.Tensor] = []  # per step: (B,) log-prob of the drawn token
        self._pending: torch.Tensor | None = None  # (B, V) the last step's log-softmax
        self._width: int | None = None  # the prompt's padded length

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        if self._width is None:
            self._width = input_ids.shape[1]
        self._take(input_ids)
        warped = scores.float() / self.temperature
        if self._top_p is not None:
            warped = self._top_p(input_ids, warped)
        self._pending = torch.log_softmax(warped, dim=-1)
        return scores

    def _take(self, sequences: torch.Tensor) -> None:
        if self._pending is not None:
            drawn = sequences[:, self._width + len(self.picked)]  # (B,)
            self.picked.append(self._pending.gather(1, drawn[:, None]).squeeze(1))
            self._pending = None

    def finish(self, sequences: torch.Tensor) -> torch.Tensor:
        """(B, T) log-probs of the drawn tokens, once generate has returned its sequences."""
        if sequences.shape[1] > (self._width or 0) + len(self.picked):
            self._take(sequences)
        if not self.picked:
            return torch.zeros((sequences.shape[0], 0))
        return torch.stack(self.picked, dim=1)


class TransformersSampler:
    name = "transformers"
    kernels = ""  # no result is shipped for it (evalbase.py)

    def __init__(self, policy: Policy, max_batch_sequences: int = 0, merge: bool | None = None) -> None:
        """`max_batch_sequences`: sequences decoded together (0: 256 on a GPU, 64 on the CPU).
        `merge`: decode from a merged copy of a LoRA policy (None: on a GPU only)."""
        self.policy = policy
        on_gpu = next(policy.model.parameters()).device.type == "cuda"
        if not max_batch_sequences:
            max_batch_sequences = 256 if on_gpu else 64
        self.max_batch_sequences = max_batch_sequences
        self.merge = on_gpu if merge is None else merge
        self._merged: Any = None  # the plain model the LoRA was folded into
        self._merged_pairs: list[tuple[Any, Any]] = []  # (LoRA layer, its merged Linear)
        self._merged_for: tuple[Any, int] | None = None  # (the policy's model, its version) folded in

    def decoding_model(self) -> Any:
        """The model `generate` runs: the policy's own, or its merged copy brought up to date."""
        model = self.policy.model
        if not (self.merge and self.policy.lora):
            return model
        if self._merged_for is not None and self._merged_for[0] is model:
            if self._merged_for[1] == self.policy.version:
                return self._merged
        else:  # the first call, or another model object behind the policy: a copy of that one
            self._merged, self._merged_pairs = None, []  # drop the old copy before making one
            self._merged, self._merged_pairs = _plain_copy(model)
        with torch.no_grad():
            for layer, linear in self._merged_pairs:
                weight = layer.base_layer.weight
                for name in layer.active_adapters:
                    if name in layer.lora_A:
                        weight = weight + layer.get_delta_weight(name)
                linear.weight.copy_(weight)
        self._merged_for = (model, self.policy.version)
        return self._merged

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
        from transformers import LogitsProcessorList, StoppingCriteriaList

        model, tok = self.decoding_model(), self.policy.tokenizer
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
        if model is self.policy.model:
            model.eval()
        device = next(model.parameters()).device
        chosen = _ChosenLogprobs(params.temperature, params.top_p)
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
                logits_processor=LogitsProcessorList([chosen]),
                return_dict_in_generate=True,
                use_cache=True,
                stopping_criteria=StoppingCriteriaList(
                    [_CheckpointCriteria(hooks, len(prompts) * params.n * params.max_new_tokens)]
                ),
            )
            picked = chosen.finish(gen.sequences).cpu()  # (P*G, T)
        new = gen.sequences[:, width:].cpu()  # (P*G, T)
        steps = picked.shape[1]
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
        self._merged, self._merged_pairs, self._merged_for = None, [], None


def _plain_copy(peft_model: Any) -> tuple[Any, list[tuple[Any, Any]]]:
    """A plain copy of a peft model without its LoRA layers (`decoding_model` folds the LoRA in),
    and each LoRA layer of the original paired with the copy's Linear it folds into (the same
    module path without peft's prefix)."""
    merged = copy.deepcopy(peft_model).unload()
    merged.eval()
    for p in merged.parameters():
        p.requires_grad_(False)
    prefix = "base_model.model."
    pairs = []
    for name, module in peft_model.named_modules():
        if hasattr(module, "get_delta_weight") and hasattr(module, "base_layer"):
            pairs.append((module, merged.get_submodule(name.removeprefix(prefix))))
    return merged, pairs
