"""train.trained_layers: only the top N layers train, and the backward stops beneath them.

On the small real Llama (2 layers, tied embeddings) of tests/helpers.py: the top layer's gradient
is the full update's, the layer beneath gets none and its weights stay as they were, the backward
never runs through it, and every parameter requires gradients again after the update.
"""

from types import SimpleNamespace

import pytest
import torch

from sapo_core.bench.training import update_gradient
from sapo_core.config import ConfigError, TrainConfig
from sapo_core.hooks import NullHooks
from sapo_core.policy import Policy
from sapo_core.trainer import Trainer

from helpers import sequences, small_policy, tiny_llama

# the full update's backward reaches layer 0 from its outputs alone (LoRA: no input requires a gradient)
pytestmark = pytest.mark.filterwarnings("ignore:Full backward hook is firing")


def _update(policy, trained_layers: int, **cfg):
    """The policy's named gradients after one fp32 step (None where a parameter got none), the
    backward calls that reached layer 0, and the figures."""
    reached = []
    hook = policy.body().layers[0].register_full_backward_hook(lambda *a: reached.append(1))
    config = TrainConfig(precision="fp32", steps_per_round=1, trained_layers=trained_layers, **cfg)
    try:
        figures = Trainer(policy, config).update(sequences(), NullHooks())
    finally:
        hook.remove()
    named = {n: (None if p.grad is None else p.grad.clone()) for n, p in policy.model.named_parameters()}
    return named, len(reached), figures


def _policy(model, lora: bool) -> Policy:
    return Policy(model=model, tokenizer=SimpleNamespace(pad_token_id=0), model_id="small", gguf_path=None, lora=lora)


def _layer(name: str) -> int | None:
    parts = name.split(".")
    return int(parts[parts.index("layers") + 1]) if "layers" in parts else None


@pytest.mark.parametrize("prompt_grad", [True, False])
@pytest.mark.parametrize("checkpointing", [True, False])
def test_the_top_layer_gets_the_full_gradient_and_the_one_beneath_none(prompt_grad, checkpointing):
    cfg = dict(prompt_grad=prompt_grad, gradient_checkpointing=checkpointing)
    full, reached_full, want = _update(small_policy(), 0, **cfg)
    assert reached_full > 0
    policy = small_policy()
    before = {n: p.detach().clone() for n, p in policy.model.named_parameters()}
    top, reached, got = _update(policy, 1, **cfg)
    assert reached == 0  # the backward stopped above layer 0
    assert got["loss/policy"] == pytest.approx(want["loss/policy"], rel=1e-6, abs=1e-8)  # same forward
    trainable = {n for n, p in policy.model.named_parameters() if p.requires_grad}
    assert trainable == {n for n, g in full.items() if g is not None}  # all of them again after
    assert {_layer(n) for n in trainable} == {0, 1}
    for name in trainable:
        if _layer(name) == 1:
            assert torch.allclose(top[name], full[name], atol=1e-7, rtol=1e-5), name
        else:
            assert top[name] is None, name
            assert torch.equal(dict(policy.model.named_parameters())[name], before[name]), name


@pytest.mark.parametrize("n", [0, 2, 5])
def test_zero_or_as_many_layers_as_the_model_has_train_every_layer(n):
    full, _, want = _update(small_policy(), 0)
    got, reached, figures = _update(small_policy(), n)
    assert reached > 0
    assert figures["train/grad_norm"] == pytest.approx(want["train/grad_norm"], rel=1e-6)
    for name, g in full.items():
        assert (g is None) == (got[name] is None), name
        if g is not None:
            assert torch.allclose(got[name], g, atol=1e-7), name


def test_a_new_adapter_stays_zero_beneath_the_trained_layers():
    """peft's own initialisation (B = 0): after steps with one layer trained, the adapter of the layer
    beneath is still exactly zero, so the node's model there is the base model's."""
    policy = _policy(tiny_llama(0, 97, init_lora_weights=True), lora=True)
    Trainer(policy, TrainConfig(precision="fp32", steps_per_round=2, trained_layers=1)).update(sequences(), NullHooks())
    b = {n: p for n, p in policy.model.named_parameters() if "lora_B" in n}
    assert b and all(_layer(n) in (0, 1) for n in b)
    assert all(not p.any() for n, p in b.items() if _layer(n) == 0)
    assert all(p.any() for n, p in b.items() if _layer(n) == 1)


def test_without_lora_the_backward_stops_too_though_the_embeddings_train():
    """All weights train (model.lora = false) and the embeddings are tied to the head, so they take a
    gradient from it; the detached output of layer 0 keeps the backward from running through it."""
    policy = _policy(tiny_llama(0, 97, lora_modules=()), lora=False)
    for p in policy.model.parameters():
        p.requires_grad_(True)
    got, reached, _ = _update(policy, 1)
    assert reached == 0
    assert got["model.embed_tokens.weight"] is not None  # through the tied head
    assert all(g is None for n, g in got.items() if _layer(n) == 0)
    assert all(g is not None for n, g in got.items() if _layer(n) == 1)


def test_the_benchmarks_gradient_counts_a_left_out_layer_as_zero():
    seqs = sequences()
    full, _ = update_gradient(Trainer(small_policy(), TrainConfig(precision="fp32", steps_per_round=1)), seqs)
    policy = small_policy()
    top, _ = update_gradient(Trainer(policy, TrainConfig(precision="fp32", steps_per_round=1, trained_layers=1)), seqs)
    layers = [_layer(n) for n, p in policy.model.named_parameters() if p.requires_grad for _ in range(p.numel())]
    upper = torch.tensor([k == 1 for k in layers])
    assert top.shape == full.shape and not top[~upper].any()
    assert torch.allclose(top[upper], full[upper], atol=1e-7, rtol=1e-5)


def test_a_negative_count_is_refused_by_name():
    with pytest.raises(ConfigError, match="train.trained_layers"):
        TrainConfig(trained_layers=-1)
