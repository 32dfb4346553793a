"""The base model's held-out results: measured once, then cached, or shipped with the app.

The held-out gain compares the policy with the base model on the same questions and per-question
seeds (evaluation.py). The base model's result depends only on the model file, the set, the
sampling settings, the prompt, the reward setting and the sampler, so it is measured once per
such key and kept in the cache directory (`base_cache_path`).

For the embedded model at the default settings it is also shipped (resources/eval-base/*.json,
written by `sapo-bench baseeval --write`): a new volunteer's first round then starts without the
minute-long base evaluation (docs/calibration.md, 'The first minutes'). A shipped result is keyed
by the model file's SHA-256 instead of its path, and used only where every other part of the key
is the same. llama.cpp's samples are the same with 1 or 2 threads, but not on every CPU: a build
with other features (AVX2 against AVX-512) runs other kernels, which round differently, and a
few completions come out otherwise (1 of 216 on an AVX2-only EPYC, 2026-12-06). So each shipped
entry records the kernels it was measured with (`Sampler.kernels`, the build's CPU features), a
file holds one entry per kernel set measured, and a node takes the one of its own kernels where
there is one, else the reference machine's (the entry without kernels, measured on an AVX-512
EPYC), else any: a few completions' difference is worth not spending a minute before round 1,
and the log says which it took. `sapo-bench baseeval` (a slow test runs it) checks that measuring
again gives exactly the shipped result of these kernels.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass
from importlib import resources
from pathlib import Path
from typing import Any

from sapo_core.evaluation import EVAL_FORMAT, EvalScores, EvalSettings, set_name
from sapo_core.fsutil import atomic_write_bytes
from sapo_core.rollouts import Question
from sapo_core.tasks import TaskSet

log = logging.getLogger(__name__)

SHIPPED_FOLDER = "eval-base"  # in sapo_resources


@contextlib.contextmanager
def base_weights(policy, sampler) -> Iterator[None]:
    """The sampler follows the base model inside the block (LoRA B matrices at zero), the
    trained policy again after it. Full fine-tuning has no base copy: ValueError."""
    if not policy.lora:
        raise ValueError("the base model's weights are gone once all weights are trained")
    import torch

    saved = policy.trainable_state_dict()
    version = policy.version
    try:
        with torch.no_grad():
            for name, p in policy.model.named_parameters():
                if p.requires_grad and "lora_B" in name:
                    p.zero_()
        policy.version = -1  # a version no update has: the sampler syncs to it
        sampler.sync_policy(policy)
        yield
    finally:
        policy.load_trainable_state_dict(saved)
        policy.version = version
        sampler.sync_policy(policy)


def base_cache_path(
    cache_dir: Path, policy, questions: Sequence[Question], settings: EvalSettings, tasks: TaskSet, sampler_name: str
) -> Path:
    """One file per (model file, held-out set, sampling settings, prompt, reward setting, sampler)."""
    source = ""
    if policy.gguf_path is not None and Path(policy.gguf_path).is_file():
        st = Path(policy.gguf_path).stat()
        source = f"{Path(policy.gguf_path).resolve()}:{st.st_size}:{st.st_mtime_ns}"
    key = json.dumps(result_key(policy.model_id, source, questions, settings, tasks, sampler_name), sort_keys=True)
    digest = hashlib.blake2b(key.encode(), digest_size=10).hexdigest()
    return Path(cache_dir) / "eval" / f"base-{policy.model_id}-{digest}.json"


def load_cached(path: Path, questions: Sequence[Question]) -> EvalScores | None:
    try:
        scores = EvalScores.from_json(json.loads(path.read_text(encoding="utf-8")))
    except (OSError, ValueError, KeyError, TypeError):
        return None  # absent or damaged: measured again
    return scores if scores.keys == [q.id.key() for q in questions] else None


def save_cached(path: Path, scores: EvalScores) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_bytes(path, json.dumps(scores.to_json()).encode())


def result_key(
    model: str, source: str, questions: Sequence[Question], settings: EvalSettings, tasks: TaskSet, sampler_name: str
) -> dict[str, Any]:
    """What a base result depends on; `source` names the model file (its path and stamp for the
    cache, its SHA-256 for a shipped result)."""
    return {
        "format": EVAL_FORMAT,
        "model": model,
        "source": source,
        "set": set_name(questions),
        "settings": asdict(settings),
        "prompt": tasks.cfg.prompt,
        "system": tasks.cfg.system_prompt,
        "partial_credit": tasks.cfg.partial_credit,
        "format_reward": tasks.cfg.format_reward,
        "sampler": sampler_name,
    }


def shipped_key(model: str, sha256: str, questions, settings: EvalSettings, tasks: TaskSet, sampler_name: str) -> dict:
    return result_key(model, f"sha256:{sha256}", questions, settings, tasks, sampler_name)


def shipped_files() -> list[Path]:
    """The shipped result files (resources/eval-base/*.json)."""
    try:
        folder = resources.files("sapo_resources").joinpath(SHIPPED_FOLDER)
        return sorted(Path(str(p)) for p in folder.iterdir() if p.name.endswith(".json"))
    except (ModuleNotFoundError, FileNotFoundError, NotADirectoryError):
        return []


@dataclass(frozen=True)
class Shipped:
    scores: EvalScores
    kernels: str | None  # the build's CPU features it was measured with; None: the reference machine's


def _entries(path: Path) -> list[dict]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return []
    results = data.get("results", []) if isinstance(data, dict) else []
    return [e for e in results if isinstance(e, dict)]


def load_shipped(
    key: dict, questions: Sequence[Question], kernels: str = "", files: Sequence[Path] | None = None
) -> Shipped | None:
    """The shipped result with exactly this key: the one measured with these `kernels` where there
    is one, else the reference machine's (no kernels recorded), else any other; None if none."""
    keys = [q.id.key() for q in questions]
    found: list[tuple[int, Shipped]] = []
    for path in shipped_files() if files is None else files:
        for entry in _entries(path):
            measured_with = entry.get("kernels")
            if entry.get("key") != key or not (measured_with is None or isinstance(measured_with, str)):
                continue
            try:
                scores = EvalScores.from_json(entry["scores"])
            except (KeyError, TypeError):
                continue
            if scores.keys == keys:
                rank = 0 if measured_with == kernels else 1 if measured_with is None else 2
                found.append((rank, Shipped(scores, measured_with)))
    return min(found, key=lambda f: f[0])[1] if found else None


def measured_where(shipped_kernels: str | None, kernels: str) -> str:
    """Where a shipped result was measured, against this CPU's `kernels` (the log and baseeval say it)."""
    if shipped_kernels == kernels:
        return "measured with this CPU's kernels"
    where = "on the reference machine (AVX-512, kernels not recorded)"
    if shipped_kernels is not None:
        where = f"with other kernels ({shipped_kernels})"
    return f"measured {where}, not with this CPU's ({kernels or 'unknown'}): a few completions may differ here"


def write_shipped(path: Path, entries: Sequence[tuple[dict, EvalScores]], kernels: str) -> None:
    """The shipped file with `entries`' (key, scores) as measured with `kernels`: they replace the
    entries of the same key and kernels; entries of these keys measured with other kernels stay,
    entries of other keys (settings no longer the defaults) go."""
    keys = [key for key, _ in entries]
    kept = [e for e in _entries(path) if e.get("key") in keys and e.get("kernels") != kernels]
    written = [{"key": key, "kernels": kernels, "scores": scores.to_json()} for key, scores in entries]
    data = {"results": kept + written}
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_bytes(path, (json.dumps(data, sort_keys=True, separators=(",", ":")) + "\n").encode())


__all__ = [
    "base_weights",
    "base_cache_path",
    "load_cached",
    "save_cached",
    "result_key",
    "shipped_key",
    "shipped_files",
    "Shipped",
    "load_shipped",
    "measured_where",
    "write_shipped",
]
