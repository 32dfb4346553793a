"""Rollout generation behind one `Sampler` protocol: llama.cpp (default on CPU) or transformers.

`make_sampler` picks the backend: 'auto' takes llama.cpp where its build loads and the model
is a GGUF, transformers otherwise; the reason is returned for the user's log.
"""

from __future__ import annotations

from pathlib import Path

from sapo_core.config import SamplerConfig
from sapo_core.sampler.base import SampledSequence, Sampler, SamplerError, SamplingParams, sequence_seed

__all__ = [
    "Sampler",
    "SamplerError",
    "SampledSequence",
    "SamplingParams",
    "sequence_seed",
    "make_sampler",
    "make_fallback_sampler",
]


def make_sampler(cfg: SamplerConfig, policy, cache_dir: Path) -> tuple[Sampler, str]:
    """(sampler, reason it was chosen)."""
    from sapo_core.sampler.transformers import TransformersSampler

    if cfg.backend == "transformers":
        return TransformersSampler(policy), "sampler.backend = transformers"
    if policy.gguf_path is None:
        if cfg.backend == "llamacpp":
            raise SamplerError(f"llama.cpp needs a GGUF model; {policy.model_id} has none")
        return TransformersSampler(policy), f"{policy.model_id} has no GGUF file: transformers"
    try:
        from sapo_core.sampler.llamacpp import LlamaCppSampler, llamacpp_available
    except ImportError as e:  # the backend module itself failed to import
        ok, why = False, f"llama.cpp backend unavailable: {e}"
    else:
        ok, why = llamacpp_available()
    if not ok:
        if cfg.backend == "llamacpp":
            raise SamplerError(f"sampler.backend = llamacpp, but {why}")
        return TransformersSampler(policy), f"{why}; using transformers"
    try:
        return LlamaCppSampler.create(policy, cfg, cache_dir), "llama.cpp (batched, CPU)"
    except SamplerError as e:
        if cfg.backend == "llamacpp":
            raise
        return TransformersSampler(policy), f"llama.cpp failed to start ({e}); using transformers"


def make_fallback_sampler(policy) -> Sampler:
    from sapo_core.sampler.transformers import TransformersSampler

    return TransformersSampler(policy)
