"""Checkpoints: atomic, restorable, damaged ones fall back, RNG states come back."""

import random

import numpy as np
import pytest
import torch

from sapo_core.checkpoint import CheckpointError, Checkpoints, CheckpointState


def save(ck, r, value=1.0):
    state = CheckpointState(round=r, model_id="m", lora_rank=4, policy_version=r * 2, extra={"metrics": {"a": r}})
    ck.save(state, {"w": torch.full((2, 2), value)}, {"state": {}, "param_groups": [{"lr": 0.1, "params": [0]}]})


def test_roundtrip_restores_everything(tmp_path):
    ck = Checkpoints(tmp_path)
    random.seed(5)
    np.random.seed(5)
    torch.manual_seed(5)
    save(ck, 3, 7.0)
    expected = (random.random(), float(np.random.rand()), torch.rand(1).item())
    random.seed(0)
    np.random.seed(0)
    torch.manual_seed(0)
    state, trainable, opt = ck.load()
    assert state.round == 3 and state.policy_version == 6 and state.extra["metrics"] == {"a": 3}
    assert torch.equal(trainable["w"], torch.full((2, 2), 7.0))
    assert opt["param_groups"][0]["lr"] == 0.1
    assert (random.random(), float(np.random.rand()), torch.rand(1).item()) == expected


def test_keeps_the_newest_two(tmp_path):
    ck = Checkpoints(tmp_path, keep=2)
    for r in range(1, 5):
        save(ck, r)
    assert sorted(p.name for p in (tmp_path / "checkpoints").glob("round-*")) == ["round-000003", "round-000004"]
    assert ck.load()[0].round == 4


def test_damaged_newest_falls_back_to_previous(tmp_path):
    ck = Checkpoints(tmp_path)
    save(ck, 1, 1.0)
    save(ck, 2, 2.0)
    (tmp_path / "checkpoints" / "round-000002" / "trainable.safetensors").write_bytes(b"garbage")
    state, trainable, _ = ck.load()
    assert state.round == 1 and trainable["w"][0, 0].item() == 1.0


def test_half_written_checkpoint_is_ignored(tmp_path):
    ck = Checkpoints(tmp_path)
    save(ck, 1)
    tmp = tmp_path / "checkpoints" / ".round-000002.tmp123"
    tmp.mkdir()
    (tmp / "state.json").write_text("{")
    assert ck.load()[0].round == 1


def test_nothing_usable_is_a_clear_error(tmp_path):
    ck = Checkpoints(tmp_path)
    assert not ck.exists()
    (tmp_path / "checkpoints" / "round-000001").mkdir(parents=True)
    (tmp_path / "checkpoints" / "round-000001" / "state.json").write_text("not json")
    with pytest.raises(CheckpointError, match="no usable checkpoint"):
        ck.load()
