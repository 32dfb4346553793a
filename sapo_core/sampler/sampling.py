"""Token sampling from raw logits in numpy, one random generator per sequence.

llama.cpp's own samplers draw from one state per sampler chain and do not report the
probability of what they picked; we sample here instead, so that (1) each sequence's
draws depend only on its own seed (`base.sequence_seed`) and its logits, whatever else
is in the batch, and (2) the returned log-prob is exactly that of the distribution the
token was drawn from (temperature, then nucleus truncation renormalised), which the
GRPO importance ratio and the drift check compare with the trainer.

One uniform number per token, inverse-CDF over the vocabulary in token-id order.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

# A nucleus is looked for first among this many most likely tokens (one argpartition),
# and only when they do not hold `top_p` of the mass among all of them (one full sort).
_NUCLEUS_CANDIDATES = 1024


def sequence_rng(seed: int) -> np.random.Generator:
    """The generator of one sequence; `seed` comes from `base.sequence_seed`."""
    return np.random.Generator(np.random.PCG64(seed))


def _nucleus(weights: np.ndarray, top_p: float) -> np.ndarray:
    """Indices of the smallest set of most likely tokens holding at least `top_p` of the mass.

    weights: (V,) unnormalised, non-negative.
    """
    total = float(weights.sum(dtype=np.float64))
    k = min(_NUCLEUS_CANDIDATES, weights.shape[0])
    cand = np.argpartition(weights, -k)[-k:] if k < weights.shape[0] else np.arange(weights.shape[0])
    order = cand[np.argsort(-weights[cand], kind="stable")]
    cum = np.cumsum(weights[order], dtype=np.float64)
    if cum[-1] < top_p * total and k < weights.shape[0]:
        order = np.argsort(-weights, kind="stable")
        cum = np.cumsum(weights[order], dtype=np.float64)
    n_keep = int(np.searchsorted(cum, top_p * total, side="left")) + 1
    return np.sort(order[: min(n_keep, order.shape[0])])


def sample_rows(
    logits: np.ndarray, rngs: Sequence[np.random.Generator], temperature: float, top_p: float = 1.0
) -> tuple[np.ndarray, np.ndarray]:
    """One token per row and its log-prob under the distribution it was drawn from.

    logits: (N, V) float32, one row per live sequence; rngs: N generators, advanced by one
    draw each. Returns (tokens (N,) int64, logprobs (N,) float64).
    """
    assert logits.ndim == 2 and logits.shape[0] == len(rngs)
    assert temperature > 0 and 0 < top_p <= 1
    z = logits.astype(np.float32, copy=False) / np.float32(temperature)  # (N, V)
    z = z - z.max(axis=1, keepdims=True)
    w = np.exp(z)  # (N, V), the largest entry of each row is 1
    tokens = np.empty(logits.shape[0], dtype=np.int64)
    logprobs = np.empty(logits.shape[0], dtype=np.float64)
    for i, rng in enumerate(rngs):
        u = rng.random()
        if top_p < 1.0:
            keep = _nucleus(w[i], top_p)  # (K,) sorted token ids
            cum = np.cumsum(w[i, keep], dtype=np.float64)
            j = min(int(np.searchsorted(cum, u * cum[-1], side="right")), keep.shape[0] - 1)
            tok = int(keep[j])
        else:
            cum = np.cumsum(w[i], dtype=np.float64)
            tok = min(int(np.searchsorted(cum, u * cum[-1], side="right")), w.shape[1] - 1)
        while w[i, tok] == 0.0:  # u landed on a flat stretch of the CDF: take the next token with mass
            tok -= 1
        tokens[i] = tok
        logprobs[i] = float(z[i, tok]) - float(np.log(cum[-1]))
    return tokens, logprobs


def log_softmax_at(logits: np.ndarray, tokens: np.ndarray, temperature: float) -> np.ndarray:
    """log p(token) under softmax(logits / T), per row; logits (N, V), tokens (N,) -> (N,)."""
    z = logits.astype(np.float64) / temperature
    m = z.max(axis=1, keepdims=True)
    lse = m[:, 0] + np.log(np.exp(z - m).sum(axis=1))
    return z[np.arange(z.shape[0]), tokens] - lse
