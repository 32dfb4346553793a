"""Checkpoints inside one forward or backward pass, so "pause now" holds within 2 s.

The sampler and trainer call `checkpoint()` per decoded token batch and per micro-batch,
but one micro-batch of a real model on a small CPU (8 sequences × ~250 tokens through
SmolLM2-135M, forward and backward) takes several seconds. Here every decoder layer calls
it too: a forward hook before the layer runs, and a hook on the layer's output gradient,
which autograd calls in the backward pass (on CPU in the thread that called `backward`, so
a pause blocks there and a stop's `Interrupted` propagates out of `backward()`).

Nothing changes in the computation: the hooks return None and touch no tensor.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch


def decoder_layers(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The repeated blocks of a transformers causal LM (LlamaDecoderLayer and kin)."""
    return [m for m in model.modules() if type(m).__name__.endswith(("DecoderLayer", "Block"))]


def install_layer_checkpoints(model: torch.nn.Module, checkpoint: Callable[[], None]) -> list[Any]:
    """Hook `checkpoint` into every decoder layer's forward and backward; returns the handles."""

    def before_forward(module: torch.nn.Module, args: Any) -> None:
        checkpoint()

    def after_forward(module: torch.nn.Module, args: Any, output: Any) -> None:
        out = output[0] if isinstance(output, (tuple, list)) else output
        if isinstance(out, torch.Tensor) and out.requires_grad:
            out.register_hook(lambda grad: checkpoint())

    handles = []
    for layer in decoder_layers(model):
        handles.append(layer.register_forward_pre_hook(before_forward))
        handles.append(layer.register_forward_hook(after_forward))
    return handles


__all__ = ["install_layer_checkpoints", "decoder_layers"]
