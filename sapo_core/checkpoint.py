"""Atomic checkpoints: the trained weights, the optimizer, RNG states and the round number.

A checkpoint is a directory `checkpoints/round-NNNNNN/` written under a temporary name,
fsynced, then renamed; `checkpoints/LATEST` names the newest complete one and is replaced
atomically last. A node killed at any instant finds either the previous checkpoint or the
new one, never half of one. The round's figures ride in `state.json` too, so a store row
lost to a crash between the two writes is restored on the next start.

Loading never unpickles: tensors are safetensors, the optimizer state goes through
`torch.load(weights_only=True)`, everything else is JSON.
"""

from __future__ import annotations

import json
import os
import random
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from sapo_core.fsutil import atomic_write_bytes, fsync_dir

FORMAT_VERSION = 1


class CheckpointError(RuntimeError):
    """No usable checkpoint; the message says where and what to do."""


@dataclass
class CheckpointState:
    round: int  # the last completed round
    model_id: str
    lora_rank: int
    policy_version: int
    extra: dict[str, Any] = field(default_factory=dict)  # curriculum, sampler state, round figures
    rng: dict[str, Any] = field(default_factory=dict)


def _fsync_file(path: Path) -> None:
    with open(path, "rb") as f:
        os.fsync(f.fileno())


def capture_rng() -> tuple[dict[str, Any], torch.Tensor]:
    py = random.getstate()
    np_state = np.random.get_state()
    meta = {
        "python": [py[0], list(py[1]), py[2]],
        "numpy": [np_state[0], np_state[1].tolist(), int(np_state[2]), int(np_state[3]), float(np_state[4])],
    }
    return meta, torch.get_rng_state()


def restore_rng(meta: dict[str, Any], torch_state: torch.Tensor | None) -> None:
    if "python" in meta:
        v, st, gauss = meta["python"]
        random.setstate((v, tuple(st), gauss))
    if "numpy" in meta:
        name, keys, pos, has_gauss, cached = meta["numpy"]
        np.random.set_state((name, np.array(keys, dtype=np.uint32), pos, has_gauss, cached))
    if torch_state is not None:
        torch.set_rng_state(torch_state)


class Checkpoints:
    def __init__(self, run_dir: Path, keep: int = 2) -> None:
        self.dir = Path(run_dir) / "checkpoints"
        self.keep = keep

    def save(self, state: CheckpointState, trainable: dict[str, torch.Tensor], optimizer: dict) -> Path:
        self.dir.mkdir(parents=True, exist_ok=True)
        name = f"round-{state.round:06d}"
        final = self.dir / name
        tmp = self.dir / f".{name}.tmp{os.getpid()}"
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir()
        try:
            rng_meta, torch_rng = capture_rng()
            state.rng = rng_meta
            save_file({k: v.contiguous() for k, v in trainable.items()}, str(tmp / "trainable.safetensors"))
            torch.save({"optimizer": optimizer, "torch_rng": torch_rng}, tmp / "optimizer.pt")
            body = {"format": FORMAT_VERSION, **state.__dict__}
            (tmp / "state.json").write_text(json.dumps(body, sort_keys=True), encoding="utf-8")
            for f in tmp.iterdir():
                _fsync_file(f)
            fsync_dir(tmp)
        except BaseException:  # a full disk, say: leave no half-written checkpoint taking its space
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        if final.exists():  # a re-run of the same round after a crash: replace it
            shutil.rmtree(final)
        os.replace(tmp, final)
        fsync_dir(self.dir)
        atomic_write_bytes(self.dir / "LATEST", name.encode())
        self._prune(keep_name=name)
        return final

    def _prune(self, keep_name: str) -> None:
        done = sorted(p for p in self.dir.glob("round-*") if p.is_dir())
        for p in done[: max(0, len(done) - self.keep)]:
            if p.name != keep_name:
                shutil.rmtree(p, ignore_errors=True)
        for p in self.dir.glob(".round-*.tmp*"):  # leftovers of a crash mid-save
            shutil.rmtree(p, ignore_errors=True)

    def _candidates(self) -> list[Path]:
        out = []
        latest = self.dir / "LATEST"
        if latest.is_file():
            out.append(self.dir / latest.read_text(encoding="utf-8").strip())
        out += sorted((p for p in self.dir.glob("round-*") if p.is_dir()), reverse=True)
        return out

    def exists(self) -> bool:
        return any((p / "state.json").is_file() for p in self._candidates())

    def load(self) -> tuple[CheckpointState, dict[str, torch.Tensor], dict]:
        """The newest readable checkpoint. A damaged newest one falls back to the one before."""
        errors = []
        for path in self._candidates():
            try:
                body = json.loads((path / "state.json").read_text(encoding="utf-8"))
                if body.pop("format", None) != FORMAT_VERSION:
                    raise CheckpointError("written by another version of SAPO Swarm")
                state = CheckpointState(**body)
                trainable = load_file(str(path / "trainable.safetensors"))
                extra = torch.load(path / "optimizer.pt", weights_only=True, map_location="cpu")
                restore_rng(state.rng, extra.get("torch_rng"))
                return state, trainable, extra["optimizer"]
            except (OSError, ValueError, KeyError, TypeError, RuntimeError, SafetensorError) as e:
                errors.append(f"{path.name}: {e}")
        raise CheckpointError(f"no usable checkpoint in {self.dir}: " + "; ".join(errors or ["none found"]))
