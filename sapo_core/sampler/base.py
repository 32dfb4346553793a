"""The `Sampler` protocol: G completions per prompt, with token ids and sampling log-probs.

Prompts arrive as token ids made by the trainer's tokenizer, so the trainer later scores
exactly the tokens that were sampled (no re-tokenisation of our own completions). Every
sequence has its own seed derived from (round, question, sample), so a round is
reproducible whatever the batch layout.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from sapo_core.hooks import RoundHooks

if TYPE_CHECKING:  # no torch at import time
    from sapo_core.config import SamplerConfig
    from sapo_core.policy import Policy


class SamplerError(RuntimeError):
    """The sampler failed (a native crash, a missing build); the node may fall back."""


@dataclass(frozen=True)
class SamplingParams:
    n: int  # completions per prompt, G
    max_new_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    stop_token_ids: tuple[int, ...] = ()

    @classmethod
    def for_config(cls, cfg: SamplerConfig, n: int, stop_token_ids: tuple[int, ...]) -> SamplingParams:
        """`n` completions per prompt with the node's sampler settings (length, temperature, top-p)."""
        return cls(n, cfg.max_new_tokens, cfg.temperature, cfg.top_p, tuple(stop_token_ids))


@dataclass
class SampledSequence:
    token_ids: list[int]  # completion tokens only, the stop token excluded
    logprobs: list[float]  # the sampler's log-prob of each token (after temperature / top-p)
    finished: bool  # True when it stopped at a stop token, False when cut at max_new_tokens


def sequence_seed(prompt_seed: int, sample_index: int) -> int:
    """A 31-bit seed for one sequence, stable across backends and batch layouts."""
    h = hashlib.blake2b(f"{prompt_seed}:{sample_index}".encode(), digest_size=4).digest()
    return int.from_bytes(h, "little") & 0x7FFFFFFF


def build_features(system_info: str) -> str:
    """llama.cpp's `llama_print_system_info()` -> the CPU features its build uses, sorted:
    'CPU : SSE3 = 1 | AVX2 = 1 | AVX512 = 0 |' -> 'AVX2 SSE3'. Builds with the same features run
    the same kernels, so they sample the same tokens from the same seeds (evalbase.py)."""
    parts = [p.rsplit(":", 1)[-1].strip() for p in system_info.split("|")]  # 'CPU : SSE3 = 1' -> 'SSE3 = 1'
    return " ".join(sorted({p.split("=")[0].strip() for p in parts if p.endswith("= 1")}))


class Sampler(Protocol):
    name: str  # "llamacpp" or "transformers"
    kernels: str  # llama.cpp: its build's CPU features (`build_features`); "" where not known

    def sample(
        self,
        prompts: Sequence[Sequence[int]],
        seeds: Sequence[int],
        params: SamplingParams,
        hooks: RoundHooks,
    ) -> list[list[SampledSequence]]:
        """For each prompt (token ids) and its seed, `params.n` completions."""

    def sync_policy(self, policy: Policy) -> None:
        """Follow the trained policy after an update (hot-swap an adapter, reload weights)."""

    def set_threads(self, n: int) -> None:
        """Threads to use from the next call on (the throttle uses this)."""

    def close(self) -> None:
        """Free native resources."""
