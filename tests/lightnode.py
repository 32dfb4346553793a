"""The light node the control and app tests drive: a real node process on the tiny-random test
model (random weights, the transformers sampler), one group of two short completions per round,
swarm off, so a round takes about a second and the tests exercise the process, not the model."""

from __future__ import annotations

import os
from pathlib import Path

from sapo_core.config import NodeConfig


def light_config(run_dir: str | Path, max_new_tokens: int = 16, **changes) -> NodeConfig:
    """The light node's config in `run_dir`; `changes` are dotted config keys ("train.kl_beta")."""
    base = {"model.name": "tiny-random", "sampler.backend": "transformers", "swarm.enabled": False,
            "round.local_groups": 1, "round.external_groups": 0, "sampler.group_size": 2,
            "sampler.max_new_tokens": max_new_tokens, "round.auto_scale": False, "run_dir": str(run_dir),
            "eval.enabled": False}  # a random model's held-out evaluation would only slow the process tests
    return NodeConfig().replace(**{**base, **changes})


def light_env(tmp_path: Path, tmp_path_factory) -> dict[str, str]:
    """A node process's environment: a fresh data directory per test, one converted-model cache
    for the whole session."""
    return {**os.environ, "SAPO_DATA_DIR": str(tmp_path / "data"),
            "SAPO_CACHE_DIR": str(tmp_path_factory.getbasetemp() / "sapo-cache")}
