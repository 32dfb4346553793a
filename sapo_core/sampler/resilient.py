"""The node's sampler: the configured backend, kept working through crashes and drift.

Two things can go wrong with a fast sampler in a node that runs for days, and neither may stop
the node:
- llama.cpp dies (a native crash in its child process, guard.py): the round that hit it is
  sampled again on transformers, which samples from the trainer's own model, and the node
  stays there;
- its log-probs of the sampled tokens drift from the trainer's beyond `DRIFT_LIMIT` (a
  quantized copy of the model): the importance ratios are then off from the first step, so
  the sampler is rebuilt on the F16 export of the trained model (`check_drift`).

`ResilientSampler` is itself a `Sampler`, so the node, the held-out evaluation and the
experiment's shared sampler see one object whatever happened underneath.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from sapo_core.config import SamplerConfig
from sapo_core.hooks import RoundHooks
from sapo_core.sampler import Sampler, SamplerError, SamplingParams, make_fallback_sampler, make_sampler
from sapo_core.sampler.base import SampledSequence

log = logging.getLogger(__name__)

# Mean |sampler - trainer| log-prob of the sampled tokens (nats/token) above which a quantized
# export is not trusted (docs/calibration.md, 'Sampler')
DRIFT_LIMIT = 0.05


class ResilientSampler:
    def __init__(
        self, cfg: SamplerConfig, policy: Any, cache_dir: Path, inner: Sampler | None = None, reason: str = ""
    ) -> None:
        """`inner`: a sampler made by the caller (else `make_sampler` builds the configured one)."""
        self.cfg, self.policy, self.cache_dir = cfg, policy, cache_dir
        if inner is None:
            inner, reason = make_sampler(cfg, policy, cache_dir)
        self.inner, self.reason = inner, reason
        self._threads = 0
        self._f16_drift_said = False

    @property
    def name(self) -> str:
        return self.inner.name

    @property
    def kernels(self) -> str:
        return self.inner.kernels

    def sample(
        self, prompts: Sequence[Sequence[int]], seeds: Sequence[int], params: SamplingParams, hooks: RoundHooks
    ) -> list[list[SampledSequence]]:
        try:
            return self.inner.sample(prompts, seeds, params, hooks)
        except SamplerError as e:
            if self.inner.name == "transformers":
                raise
            # a native crash in llama.cpp must not kill the node: continue on transformers
            log.error(f"sampler {self.inner.name} failed ({e}); falling back to transformers")
            self.inner.close()
            self.inner, self.reason = make_fallback_sampler(self.policy), f"transformers (fallback after: {e})"
            if self._threads:
                self.inner.set_threads(self._threads)
            return self.inner.sample(prompts, seeds, params, hooks)

    def check_drift(self, drift: float | None) -> bool:
        """After an update: when llama.cpp's log-probs drift from the trainer's beyond DRIFT_LIMIT
        on a quantized copy, sample from the F16 export instead. True when it switched."""
        if drift is None or not drift > DRIFT_LIMIT or self.inner.name != "llamacpp":
            return False
        if self.cfg.quantization == "f16":
            # nothing to switch to: said once (a bf16 update drifts past the limit on a third of
            # its rounds, README 'Benchmarks'); every round's figure is sampler/logprob_drift
            say = log.debug if self._f16_drift_said else log.warning
            self._f16_drift_said = True
            say(
                f"sampler log-probs drift {drift:.3f} nats/token from the trainer's "
                f"(limit {DRIFT_LIMIT}) even on the F16 export (a bf16 update adds ~0.04: "
                "train.precision = fp32 keeps it near 0.003); later rounds' drift is in the run store"
            )
            return False
        log.warning(
            f"sampler log-probs drift {drift:.3f} nats/token from the trainer's (limit "
            f"{DRIFT_LIMIT}) with sampler.quantization = {self.cfg.quantization}: "
            'switching to the F16 export (set sampler.quantization = "f16" to keep it)'
        )
        f16 = dataclasses.replace(self.cfg, quantization="f16")
        try:
            inner, reason = make_sampler(f16, self.policy, self.cache_dir)
        except SamplerError as e:
            log.error(f"could not start the F16 sampler ({e}); keeping the old one")
            return False
        self.inner.close()
        self.cfg, self.inner, self.reason = f16, inner, reason
        if self._threads:
            inner.set_threads(self._threads)
        return True  # the caller syncs the new sampler with the policy, as after every update

    def sync_policy(self, policy: Any) -> None:
        self.inner.sync_policy(policy)

    def set_threads(self, n: int) -> None:
        self._threads = n
        self.inner.set_threads(n)

    def close(self) -> None:
        self.inner.close()

    def __getattr__(self, name: str) -> Any:  # backend extras, e.g. llama.cpp's status()
        if name == "inner":  # not set yet (a failed __init__): no recursion
            raise AttributeError(name)
        return getattr(self.inner, name)


__all__ = ["ResilientSampler", "DRIFT_LIMIT"]
