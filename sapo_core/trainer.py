"""The GRPO update: K optimizer steps over a round's sequences, memory-bounded.

- Old log-probs come from the first step's own forward pass: before the first optimizer
  step the policy *is* the old policy, so detaching those log-probs costs nothing extra
  (no separate pass), and external completions, which arrive as text, get theirs the same way.
- Peers' completions were sampled by another policy. With `train.peer_correction = tis`
  (F-TIS, arXiv 2605.22537) each peer token whose sampling log-prob the peer sent carries the
  weight min(pi_old / pi_peer, C) (truncated importance sampling; C = `peer_ratio_cap`) on its
  clipped surrogate, and a peer completion with negative advantage whose mean per-token KL
  estimate (k3) from our policy exceeds `peer_kl_max` gets weight 0. A peer's log-probs are
  untrusted: a lie moves a token's weight to at most C, or drops its own completion. The
  normaliser stays every completion token of the round, so a left-out completion counts as a
  zero, not as a smaller batch.
- Sequences run in micro-batches with gradient accumulation; log-probs are computed only
  at completion positions, chunk by chunk over the vocabulary (`grpo.token_logprobs`), so
  the batch x length x vocabulary logits never exist at once.
- Prompts are packed (train.pack_prompts): a micro-batch is one row holding each prompt
  once, followed by its completions; a block attention mask lets every completion see its
  prompt and itself only, and position ids restart after the prompt, so each completion's
  log-probs are those of its own row. A group's G completions share one prompt, and the
  untrained model's answers are a few tokens next to a prompt of hundreds: the round trains
  ~6x fewer tokens. Rows hold at most micro_batch_size x the longest sequence, as unpacked.
- With `train.prompt_grad = false` each group's prompt runs once per step without gradient (its
  keys and values cached, its last token fed again ahead of each completion, the completions
  packed in one row behind a block mask) and only the completions run with gradient: the
  log-probs and hence the ratios are the same, the gradient leaves out the path through the
  prompt's keys and values (LoRA adapts k_proj and v_proj), an approximation that must pay on
  held-out per CPU-hour (docs/experiment.md, 'Recipe lab').
  Gradient checkpointing is off in that pass: the completions' activations are small.
- A guide (a peer's verified right completion added to our own all-wrong group, swarm.take =
  mixed) is off-policy text: its tokens carry LUFFY's policy-shaped objective -A p/(p + gamma)
  (arXiv 2504.14945; gamma = `train.guide_gamma`) instead of the clipped ratio, which would treat
  the peer's text as if our sampler had drawn it.
- The loss is the token-level mean over every completion token of the round's batch
  (DAPO-style), so long and short completions weigh by their tokens; with `train.loss_mean =
  sequence` each completion's tokens are averaged first and the completions then (GRPO as
  published): a token of a completion of n tokens weighs 1 / n of its completion.
- With KL (beta > 0) the reference is the base model: the LoRA adapter switched off.
- The transformer body runs under bf16 autocast where the hardware has native bf16
  (train.precision, `sapo_core/precision.py`); the output head, log-probs, loss, LoRA weights
  and optimizer state stay fp32.
- Gradient checkpointing recomputes the activations of `train.checkpoint_share` of the layers
  (spread evenly) in the backward: 1 is the least memory, 0.5 keeps the node under 2.5 GB at
  about half the recompute (docs/calibration.md, 'Memory estimates').
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import time
from dataclasses import dataclass, field

import torch

from sapo_core import grpo
from sapo_core.config import TrainConfig
from sapo_core.hooks import RoundHooks
from sapo_core.microbatch import (
    MicroBatch,
    TrainSequence,
    make_micro_batches,
    make_packed_micro_batches,
    make_prefix_micro_batches,
)
from sapo_core.policy import Policy
from sapo_core.precision import resolve_precision


@functools.cache
def _cache_argument(forward) -> str:
    """The name transformers' model forward takes a KV cache by: `cache` (5.2x) or `past_key_values`."""
    return "cache" if "cache" in inspect.signature(forward).parameters else "past_key_values"


@contextlib.contextmanager
def _checkpointing_off(model: torch.nn.Module):
    """Gradient checkpointing off for the block: a checkpointed layer drops the KV cache it is given."""
    layers = [m for m in model.modules() if getattr(m, "gradient_checkpointing", False) is True]
    for m in layers:
        m.gradient_checkpointing = False
    try:
        yield
    finally:
        for m in layers:
            m.gradient_checkpointing = True


@contextlib.contextmanager
def _top_layers_only(body: torch.nn.Module, n: int):
    """Only the top `n` of `body`'s layers train inside the block (0, or n >= the layers: all of
    them, as without it): the layers beneath stop requiring gradients, so their forward records no
    graph, and the output of the highest of them is detached, so the backward stops there even where
    the embeddings train (tied to the head without LoRA). Their parameters get no gradient (the
    optimizer skips them: a new LoRA adapter's stay zero) and require gradients again after."""
    layers = getattr(body, "layers", None)
    if not n or layers is None or n >= len(layers):
        yield
        return
    below = layers[: len(layers) - n]
    frozen = [p for layer in below for p in layer.parameters() if p.requires_grad]
    for p in frozen:
        p.requires_grad_(False)
    handle = below[-1].register_forward_hook(_detached)
    try:
        yield
    finally:
        handle.remove()
        for p in frozen:
            p.requires_grad_(True)


def _detached(module: torch.nn.Module, args, output):
    """A forward hook's replacement output: a layer's hidden states cut from the graph."""
    if isinstance(output, tuple):
        return (output[0].detach(), *output[1:])
    return output.detach()


@dataclass
class _Tally:
    """What an update counts over its micro-batches and steps, and the figures it reports."""

    steps: int
    completion_tokens: int  # the loss's normaliser: every completion token of the round
    sequences: int  # the round's completions (train.loss_mean = sequence)
    sums: dict[str, float] = field(
        default_factory=lambda: dict.fromkeys(("loss", "kl", "clip_low", "clip_high", "ratio", "grad_norm"), 0.0)
    )
    tokens: int = 0  # prompt + completion tokens processed, every step
    drift_sum: float = 0.0
    drift_n: int = 0
    guide_tokens: int = 0
    peer: dict[str, float] = field(default_factory=dict)  # tis_weights' counts, for _peer_summary

    def first_pass(self, mb: MicroBatch, old: torch.Tensor) -> None:
        """The first step's counts of `mb`: our sampler's drift from the old log-probs `old` (N,),
        the guides' tokens."""
        known = ~torch.isnan(mb.sample_logprobs)
        if mb.peer_tokens is not None:
            known &= ~mb.peer_tokens  # the drift is our sampler's against our trainer
        if known.any():
            self.drift_sum += float((mb.sample_logprobs[known] - old[known]).abs().sum())
            self.drift_n += int(known.sum())
        if mb.guide_tokens is not None:
            self.guide_tokens += int(mb.guide_tokens.sum())

    def figures(self, sequences: int, seconds: float, kl: bool) -> dict[str, float]:
        sums = self.sums
        out = {
            "loss/policy": sums["loss"],
            "train/clip_low_frac": sums["clip_low"],
            "train/clip_high_frac": sums["clip_high"],
            "train/ratio_mean": sums["ratio"],
            "train/grad_norm": sums["grad_norm"],
            "train/steps": float(self.steps),
            "train/sequences": float(sequences),
            "train/completion_tokens": float(self.completion_tokens),
            "train/tokens": float(self.tokens),
            "train/tok_per_s": self.tokens / seconds if seconds > 0 else 0.0,
        }
        if kl:
            out["loss/kl"] = sums["kl"]
        if self.drift_n:
            out["sampler/logprob_drift"] = self.drift_sum / self.drift_n
        if self.guide_tokens:
            out["train/guide_tokens"] = float(self.guide_tokens)
        out.update(_peer_summary(self.peer))
        return out


class Trainer:
    def __init__(self, policy: Policy, cfg: TrainConfig, temperature: float = 1.0) -> None:
        self.policy = policy
        self.cfg = cfg
        self.temperature = temperature  # the sampler's: ratios compare like with like
        self.optimizer = torch.optim.AdamW(
            policy.trainable_parameters(), lr=cfg.learning_rate, weight_decay=cfg.weight_decay
        )
        configure_checkpointing(policy.model, cfg)
        self.precision = resolve_precision(cfg.precision, next(policy.model.parameters()).device.type)
        self._ref_model = None
        if cfg.kl_beta > 0 and not policy.lora:
            import copy

            self._ref_model = copy.deepcopy(policy.model).eval().requires_grad_(False)

    # --- log-probs ----------------------------------------------------------------------
    def _token_logprobs(self, mb: MicroBatch, body: torch.nn.Module, head: torch.Tensor) -> torch.Tensor:
        with self.precision.context(mb.input_ids.device.type):
            if mb.prefix_ids is not None:
                hidden = self._after_prefix(mb, body)  # (B, C, H)
            else:
                hidden = body(
                    input_ids=mb.input_ids, attention_mask=mb.attention, position_ids=mb.position_ids
                ).last_hidden_state  # (B, L, H)
        flat = hidden.float().reshape(-1, hidden.shape[-1])  # (B*L, H); the head and log-probs in fp32
        return grpo.token_logprobs(flat[mb.pred_rows], head, mb.targets, self.cfg.logit_chunk, self.temperature)

    def _after_prefix(self, mb: MicroBatch, body: torch.nn.Module) -> torch.Tensor:
        """(1, C, H) hidden states of the packed completions, the prefix's keys and values computed
        without gradient and seen by every completion."""
        from transformers import DynamicCache

        arg = _cache_argument(type(body).forward)
        cache = DynamicCache()
        if mb.prefix_ids.shape[1]:
            with torch.no_grad():
                body(input_ids=mb.prefix_ids, use_cache=True, **{arg: cache})
        with _checkpointing_off(body):
            out = body(
                input_ids=mb.input_ids,
                attention_mask=mb.attention,
                position_ids=mb.position_ids,
                use_cache=True,
                **{arg: cache},
            )
        return out.last_hidden_state

    def _reference_logprobs(self, mb: MicroBatch) -> torch.Tensor:
        with torch.no_grad():
            if self._ref_model is not None:
                return self._token_logprobs(mb, self._ref_model.model, self._ref_model.get_output_embeddings().weight)
            with self.policy.model.disable_adapter():
                return self._token_logprobs(mb, self.policy.body(), self.policy.head_weight())

    # --- the update ---------------------------------------------------------------------
    def update(self, seqs: list[TrainSequence], hooks: RoundHooks) -> dict[str, float]:
        """K optimizer steps over `seqs`; returns namespaced figures for the store."""
        seqs = [s for s in seqs if s.completion_ids]
        if not seqs:
            return {"train/steps": 0.0}
        model = self.policy.model
        model.train()
        mbs = self._micro_batches(seqs, prefix=not self.cfg.prompt_grad)
        steps = self.cfg.steps_per_round
        tally = _Tally(steps, sum(len(mb.targets) for mb in mbs), len(seqs))
        ref: list[torch.Tensor] = [self._reference_logprobs(mb) for mb in mbs] if self.cfg.kl_beta > 0 else []
        t0 = time.perf_counter()
        body, head = self.policy.body(), self.policy.head_weight()
        with _top_layers_only(body, self.cfg.trained_layers):
            self._steps(mbs, body, head, hooks, tally, ref)
        model.eval()
        return tally.figures(len(seqs), time.perf_counter() - t0, kl=self.cfg.kl_beta > 0)

    def _steps(self, mbs: list[MicroBatch], body, head, hooks: RoundHooks, tally: _Tally, ref: list) -> None:
        """The K optimizer steps over the round's micro-batches."""
        steps = tally.steps
        old: list[torch.Tensor] = []
        weights: list[torch.Tensor | None] = []
        for step in range(steps):
            self.optimizer.zero_grad(set_to_none=True)
            for i, mb in enumerate(mbs):
                hooks.checkpoint()
                hooks.progress("update", step * len(mbs) + i, steps * len(mbs), step=step)
                logp = self._token_logprobs(mb, body, head)  # (N,)
                if step == 0:  # the policy is still the old one (module docstring)
                    old.append(logp.detach())
                    weights.append(self._peer_weights(mb, old[i], tally.peer))
                    tally.first_pass(mb, old[i])
                loss = self._loss(mb, logp, old[i], weights[i], ref[i] if ref else None, tally)
                (loss / tally.completion_tokens).backward()
                tally.tokens += mb.n_tokens
            params = self.policy.trainable_parameters()
            max_norm = self.cfg.max_grad_norm if self.cfg.max_grad_norm > 0 else float("inf")
            norm = torch.nn.utils.clip_grad_norm_(params, max_norm)
            tally.sums["grad_norm"] += float(norm) / steps
            self.optimizer.step()
            self.policy.version += 1

    def _loss(
        self,
        mb: MicroBatch,
        logp: torch.Tensor,  # (N,) the current policy's
        old: torch.Tensor,  # (N,) the first step's, detached
        weight: torch.Tensor | None,  # (N,) F-TIS weights, or None
        ref: torch.Tensor | None,  # (N,) the reference's, with KL
        tally: _Tally,
    ) -> torch.Tensor:
        """The summed loss of one micro-batch's tokens (not yet divided by the round's tokens); its
        figures go to `tally`."""
        adv = mb.advantages[mb.seq_of_token]  # (N,) each token carries its sequence's advantage
        mask = torch.ones_like(logp)
        # token-flat form of grpo.clipped_surrogate: N rows of length 1
        loss_tok, st = grpo.clipped_surrogate(
            logp[:, None], old[:, None], adv, mask[:, None], self.cfg.epsilon_low, self.cfg.epsilon_high
        )
        if weight is not None:
            loss_tok = loss_tok * weight[:, None]
        if mb.guide_tokens is not None and bool(mb.guide_tokens.any()):
            # a guide's tokens: LUFFY's shaped objective, -A f(p), unclipped (see module docstring)
            shaped = -adv * grpo.policy_shaping(logp, self.cfg.guide_gamma)
            loss_tok = torch.where(mb.guide_tokens[:, None], shaped[:, None], loss_tok)
        sums, total, steps = tally.sums, tally.completion_tokens, tally.steps
        token_weight = mask  # each token's share of the round's mean, the KL term's too
        if self.cfg.loss_mean == "sequence":  # the mean over completions of each one's token mean
            token_weight = sequence_mean_weights(mb.seq_of_token, len(mb.advantages), total, tally.sequences)
            loss_tok = loss_tok * token_weight[:, None]
        loss = loss_tok.sum()
        if self.cfg.kl_beta > 0:
            kl = grpo.kl_k3(logp, ref, token_weight).sum()
            loss = loss + self.cfg.kl_beta * kl
            sums["kl"] += float(kl.detach()) / total / steps
        n = len(mb.targets)
        sums["loss"] += float(loss_tok.detach().sum()) / total / steps
        sums["clip_low"] += float(st.clipped_low) * n / total / steps
        sums["clip_high"] += float(st.clipped_high) * n / total / steps
        sums["ratio"] += float(st.ratio_mean) * n / total / steps
        return loss

    def _micro_batches(self, seqs: list[TrainSequence], prefix: bool) -> list[MicroBatch]:
        """`seqs` in micro-batches on the model's device: each prompt's prefix run once without
        gradient (`prefix`), packed behind their prompts (train.pack_prompts), or padded rows."""
        weight = next(self.policy.model.parameters())
        if prefix:
            mbs = make_prefix_micro_batches(seqs, weight.dtype)
        elif self.cfg.pack_prompts:
            mbs = make_packed_micro_batches(seqs, self.cfg.micro_batch_size, weight.dtype)
        else:
            mbs = make_micro_batches(seqs, self.cfg.micro_batch_size, self.policy.tokenizer.pad_token_id)
        return [mb.to(weight.device) for mb in mbs]

    def _peer_weights(self, mb: MicroBatch, old: torch.Tensor, figures: dict[str, float]) -> torch.Tensor | None:
        """(N,) the F-TIS weight of each token of `mb` (1 for ours), or None where nothing is
        corrected; adds to `figures` what `_peer_summary` reports."""
        peer = mb.peer_tokens
        if self.cfg.peer_correction != "tis" or peer is None or not bool(peer.any()):
            return None
        w, stats = tis_weights(
            old,
            mb.sample_logprobs,
            peer,
            mb.seq_of_token,
            mb.advantages,
            self.cfg.peer_ratio_cap,
            self.cfg.peer_kl_max,
            mb.spread_tokens,
        )
        for k, v in stats.items():
            figures[k] = figures.get(k, 0.0) + v
        return w

    def completion_logprobs(self, seqs: list[TrainSequence], hooks: RoundHooks | None = None) -> list[list[float]]:
        """Log-likelihood of each completion token of each sequence under the current policy (at
        the sampler's temperature, as the update sees it), without gradients. The node's
        likelihood floor on peers' text (docs/calibration.md, 'Likelihood floor') reads this.

        The micro-batches are the update's own; each sequence's position rides in the
        `advantage` slot (unused here) to map tokens back to it."""
        out: list[list[float]] = [[] for _ in seqs]
        tagged = [
            TrainSequence(s.prompt_ids, s.completion_ids, float(i)) for i, s in enumerate(seqs) if s.completion_ids
        ]
        if not tagged:
            return out
        self.policy.model.eval()
        mbs = self._micro_batches(tagged, prefix=False)
        with torch.no_grad():
            body, head = self.policy.body(), self.policy.head_weight()
            for mb in mbs:
                if hooks is not None:
                    hooks.checkpoint()
                logp = self._token_logprobs(mb, body, head).tolist()  # (N,) in completion order per sequence
                owner = mb.advantages[mb.seq_of_token].long().tolist()  # (N,) index into seqs
                for i, lp in zip(owner, logp):
                    out[i].append(lp)
        return out

    # --- checkpoint state ---------------------------------------------------------------
    def state_dict(self) -> dict:
        return self.optimizer.state_dict()

    def load_state_dict(self, state: dict) -> None:
        self.optimizer.load_state_dict(state)


def tis_weights(
    old: torch.Tensor,  # (N,) our log-probs at the start of the update
    behaviour: torch.Tensor,  # (N,) the sampler's log-probs, NaN where unknown
    peer: torch.Tensor,  # (N,) bool, the token is a peer's
    seq_of_token: torch.Tensor,  # (N,) sequence index of each token
    advantages: torch.Tensor,  # (S,) one per sequence
    cap: float,
    kl_max: float,
    spread: torch.Tensor | None = None,  # (N,) bool, the token's sequence has spread log-probs
) -> tuple[torch.Tensor, dict[str, float]]:
    """(N,) F-TIS token weights and their counts (module docstring). Our own tokens and peer
    tokens without a sent log-prob weigh 1; a peer token min(exp(old - behaviour), cap); every
    token of a peer sequence with advantage < 0 whose mean k3 = r - 1 - log r over its known
    tokens (r = pi_old / pi_peer, an estimate of KL(peer || ours) per token) exceeds kl_max, 0.
    A sequence whose log-probs were spread (another tokenizer: only their total is the peer's)
    uses its mean log-ratio for every token: the geometric-mean ratio of the whole text."""
    dev = old.device
    behaviour, peer, seq_of_token, advantages = (t.to(dev) for t in (behaviour, peer, seq_of_token, advantages))
    n_seq = advantages.shape[0]
    w = torch.ones_like(old)
    known = peer & ~torch.isnan(behaviour)
    log_r = torch.where(known, old - torch.nan_to_num(behaviour), torch.zeros_like(old))
    if spread is not None and bool(spread.any()):
        spread = spread.to(dev) & known
        total = old.new_zeros(n_seq).index_add_(0, seq_of_token, torch.where(spread, log_r, torch.zeros_like(log_r)))
        count = old.new_zeros(n_seq).index_add_(0, seq_of_token, spread.to(old.dtype)).clamp(min=1)
        log_r = torch.where(spread, (total / count)[seq_of_token], log_r)
    log_r = log_r.clamp(max=80.0)  # exp stays finite in fp32
    r = torch.exp(log_r)
    w = torch.where(known, r.clamp(max=cap), w)
    k3 = torch.where(known, r - 1.0 - log_r, torch.zeros_like(r))
    kl_sum = old.new_zeros(n_seq).index_add_(0, seq_of_token, k3)
    kl_n = old.new_zeros(n_seq).index_add_(0, seq_of_token, known.to(old.dtype))
    kl = kl_sum / kl_n.clamp(min=1)
    judged = kl_n > 0
    peer_seq = old.new_zeros(n_seq).index_add_(0, seq_of_token, peer.to(old.dtype)) > 0
    drop = judged & (advantages < 0) & (kl > kl_max)
    w = torch.where(drop[seq_of_token] & peer, torch.zeros_like(w), w)
    stats = {
        "peer_tokens": float(peer.sum()),
        "corrected_tokens": float(known.sum()),
        "truncated_tokens": float((known & (r > cap)).sum()),
        "weight_sum": float(w[peer].sum()),
        "kl_sum": float(kl[judged].sum()),
        "kl_sequences": float(judged.sum()),
        "dropped_sequences": float(drop.sum()),
        "uncorrected_sequences": float((peer_seq & ~judged).sum()),
    }
    return w, stats


def sequence_mean_weights(seq_of_token: torch.Tensor, n_seq: int, total: int, sequences: int) -> torch.Tensor:
    """(N,) each token's weight total / (sequences x its completion's tokens): a round's loss summed
    with these weights and divided by its `total` tokens is the mean over its `sequences`
    completions of each one's token mean (train.loss_mean = sequence)."""
    lengths = torch.bincount(seq_of_token, minlength=n_seq).clamp(min=1)
    return total / (sequences * lengths[seq_of_token].to(torch.float32))


def _peer_summary(f: dict[str, float]) -> dict[str, float]:
    """The round's F-TIS figures (`train/peer_*`) from `tis_weights`' counts over micro-batches."""
    if not f.get("peer_tokens"):
        return {}
    out = {
        "train/peer_tokens": f["peer_tokens"],
        "train/peer_uncorrected": f["uncorrected_sequences"],
        "train/peer_weight_mean": f["weight_sum"] / f["peer_tokens"],
        "train/peer_dropped": f["dropped_sequences"],
    }
    if f["corrected_tokens"]:
        out["train/peer_truncated_frac"] = f["truncated_tokens"] / f["corrected_tokens"]
    if f["kl_sequences"]:
        out["train/peer_kl_mean"] = f["kl_sum"] / f["kl_sequences"]
    return out


def configure_checkpointing(model: torch.nn.Module, cfg: TrainConfig) -> None:
    """train.gradient_checkpointing on `train.checkpoint_share` of the layers, or off."""
    if not cfg.gradient_checkpointing:
        if any(getattr(m, "gradient_checkpointing", False) is True for m in model.modules()):
            off = getattr(model, "activation_checkpointing_disable", None) or model.gradient_checkpointing_disable
            off()
        return
    # non-reentrant: works with frozen inputs (LoRA) and with our own checkpointed head
    kwargs = {"use_reentrant": False}
    if hasattr(model, "activation_checkpointing_enable"):  # transformers >= 5
        model.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)
    checkpoint_share_of_layers(model, cfg.checkpoint_share)


def checkpoint_share_of_layers(model: torch.nn.Module, share: float) -> int:
    """Leave checkpointing on for `share` of the model's checkpointable layers, spread evenly
    (transformers' layers read their own `gradient_checkpointing` flag at each forward); the
    count left on."""
    from transformers.modeling_layers import GradientCheckpointingLayer

    layers = [m for m in model.modules() if isinstance(m, GradientCheckpointingLayer) and m.gradient_checkpointing]
    on = round(share * len(layers))
    for k, layer in enumerate(layers):
        # layer k is on when the running count k * on / n steps up across it: `on` of n, evenly
        layer.gradient_checkpointing = (k * on) // len(layers) != ((k + 1) * on) // len(layers)
    return on


@contextlib.contextmanager
def inference(policy: Policy):
    """Eval mode and no autograd, for sampling with the policy's own model."""
    policy.model.eval()
    with torch.inference_mode():
        yield
