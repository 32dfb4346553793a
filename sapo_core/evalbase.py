"""The base model's held-out results: measured once, then cached, or shipped with the app.

The held-out gain compares the policy with the base model on the same questions and per-question
seeds (evaluation.py). The base model's result depends only on the model file, the set, the
sampling settings, the prompt, the reward setting and the sampler, so it is measured once per
such key and kept in the cache directory (`base_cache_path`).

For the embedded model at the default settings it is also shipped (resources/eval-base/*.json,
written by `sapo-bench baseeval --write`): a new volunteer's first round then starts without the
minute-long base evaluation (docs/calibration.md, 'The first minutes'). A shipped result is keyed
by the model file's SHA-256 instead of its path, and used only where every other part of the key
is the same. It was measured on the reference machine (the llama.cpp build this project pins);
llama.cpp's samples are the same with 1 or 2 threads there, and `sapo-bench baseeval` (a slow
test runs it) checks that measuring again gives exactly the shipped result. On a CPU whose
kernels round differently the samples may differ, by the same chance as any re-draw.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
from collections.abc import Iterator, Sequence
from dataclasses import asdict
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


def load_shipped(key: dict, questions: Sequence[Question], files: Sequence[Path] | None = None) -> EvalScores | None:
    """The shipped result with exactly this key, or None."""
    for path in shipped_files() if files is None else files:
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        for entry in data.get("results", []) if isinstance(data, dict) else []:
            if isinstance(entry, dict) and entry.get("key") == key:
                try:
                    scores = EvalScores.from_json(entry["scores"])
                except (KeyError, TypeError):
                    continue
                if scores.keys == [q.id.key() for q in questions]:
                    return scores
    return None


def write_shipped(path: Path, entries: Sequence[tuple[dict, EvalScores]]) -> None:
    """The shipped file: its results replaced by `entries`' (key, scores)."""
    data = {"results": [{"key": key, "scores": scores.to_json()} for key, scores in entries]}
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
    "load_shipped",
    "write_shipped",
]
