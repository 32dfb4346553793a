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
  keys and values cached, its last token fed again ahead of the completions) and only the
  completions run with gradient: the log-probs and hence the ratios are the same, the gradient
  leaves out the path through the prompt's keys and values (LoRA adapts k_proj and v_proj), an
  approximation that must pay on held-out per CPU-hour (docs/experiment.md, 'Recipe lab').
  Gradient checkpointing is off in that pass: the completions' activations are small.
- A guide (a peer's verified right completion added to our own all-wrong group, swarm.take =
  mixed) is off-policy text: its tokens carry LUFFY's policy-shaped objective -A p/(p + gamma)
  (arXiv 2504.14945; gamma = `train.guide_gamma`) instead of the clipped ratio, which would treat
  the peer's text as if our sampler had drawn it.
- The loss is the token-level mean over every completion token of the round's batch
  (DAPO-style), so long and short completions weigh by their tokens.
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
import dataclasses
import functools
import inspect
import time
from dataclasses import dataclass

import torch

from sapo_core import grpo
from sapo_core.config import TrainConfig
from sapo_core.hooks import RoundHooks
from sapo_core.policy import Policy
from sapo_core.precision import resolve_precision


@dataclass
class TrainSequence:
    prompt_ids: list[int]
    completion_ids: list[int]
    advantage: float
    sample_logprobs: list[float] | None = None  # the sampling log-probs (ours, or a peer's where sent); NaN: unknown
    peer: bool = False  # a peer's completion (its sample_logprobs are the peer sampler's)
    spread: bool = False  # those log-probs are the text's total spread over our tokens (verify.py)
    guide: bool = False  # a peer's right answer in our own all-wrong group: trained with policy shaping


@dataclass
class _MicroBatch:
    input_ids: torch.Tensor  # (B, L)
    attention: torch.Tensor  # (B, L) padding mask, or (B, 1, L, L) additive mask when packed
    pred_rows: torch.Tensor  # (N,) flat index into (B*L) of hidden states predicting a completion token
    targets: torch.Tensor  # (N,) the completion tokens
    seq_of_token: torch.Tensor  # (N,) which row of the micro-batch each token belongs to
    advantages: torch.Tensor  # (B,)
    sample_logprobs: torch.Tensor  # (N,) NaN where unknown
    n_tokens: int  # prompt + completion tokens processed
    peer_tokens: torch.Tensor | None = None  # (N,) bool: the token belongs to a peer's completion
    spread_tokens: torch.Tensor | None = None  # (N,) bool: its sequence's log-probs were spread
    guide_tokens: torch.Tensor | None = None  # (N,) bool: a guide's token (LUFFY's shaped objective)

    def to(self, device: torch.device) -> _MicroBatch:
        """This micro-batch with its tensors on `device` (the model's: a CUDA GPU, or itself)."""
        if device.type == "cpu":
            return self
        moved = {
            f.name: getattr(self, f.name).to(device)
            for f in dataclasses.fields(self)
            if isinstance(getattr(self, f.name), torch.Tensor)
        }
        return dataclasses.replace(self, **moved)

    position_ids: torch.Tensor | None = None  # (B, L) when packed, or (B, C) after a prefix
    prefix_ids: torch.Tensor | None = None  # (1, P-1) a group's prompt but its last token, run without gradient


def _make_micro_batches(seqs: list[TrainSequence], size: int, pad_id: int) -> list[_MicroBatch]:
    # Similar lengths together: less padding to compute (order inside a round is irrelevant).
    order = sorted(range(len(seqs)), key=lambda i: len(seqs[i].prompt_ids) + len(seqs[i].completion_ids))
    out = []
    for start in range(0, len(order), size):
        part = [seqs[i] for i in order[start : start + size]]
        length = max(len(s.prompt_ids) + len(s.completion_ids) for s in part)
        ids = torch.full((len(part), length), pad_id, dtype=torch.long)
        att = torch.zeros((len(part), length), dtype=torch.long)
        rows, targets, owner, slp, peer, spread, guide = [], [], [], [], [], [], []
        for b, s in enumerate(part):
            full = s.prompt_ids + s.completion_ids
            ids[b, : len(full)] = torch.tensor(full)
            att[b, : len(full)] = 1
            p = len(s.prompt_ids)
            # hidden state at position t predicts token t+1
            rows.extend(b * length + t - 1 for t in range(p, len(full)))
            targets.extend(s.completion_ids)
            owner.extend([b] * len(s.completion_ids))
            lp = s.sample_logprobs if s.sample_logprobs is not None else [float("nan")] * len(s.completion_ids)
            slp.extend(lp)
            peer.extend([s.peer] * len(s.completion_ids))
            spread.extend([s.spread] * len(s.completion_ids))
            guide.extend([s.guide] * len(s.completion_ids))
        out.append(
            _MicroBatch(
                input_ids=ids,
                attention=att,
                pred_rows=torch.tensor(rows, dtype=torch.long),
                targets=torch.tensor(targets, dtype=torch.long),
                seq_of_token=torch.tensor(owner, dtype=torch.long),
                advantages=torch.tensor([s.advantage for s in part], dtype=torch.float32),
                sample_logprobs=torch.tensor(slp, dtype=torch.float32),
                n_tokens=int(att.sum()),
                peer_tokens=torch.tensor(peer, dtype=torch.bool),
                spread_tokens=torch.tensor(spread, dtype=torch.bool),
                guide_tokens=torch.tensor(guide, dtype=torch.bool),
            )
        )
    return out


def _make_packed_micro_batches(seqs: list[TrainSequence], size: int, dtype: torch.dtype) -> list[_MicroBatch]:
    """One row per micro-batch: [prompt, its completions..., next prompt, its completions...].

    A row holds at most `size` x the longest single sequence (the unpacked bound). Token i
    attends to token j <= i of its own prompt, and a completion token also to its own earlier
    tokens; positions run 0..p-1 over a prompt and p.. over each completion, as if alone.
    """
    budget = size * max(len(s.prompt_ids) + len(s.completion_ids) for s in seqs)
    by_prompt: dict[tuple[int, ...], list[int]] = {}
    for i, s in enumerate(seqs):
        by_prompt.setdefault(tuple(s.prompt_ids), []).append(i)
    rows: list[list[tuple[tuple[int, ...], list[int]]]] = []  # row -> [(prompt, sequence indices)]
    used = 0
    for prompt, members in by_prompt.items():
        for i in members:
            c = len(seqs[i].completion_ids)
            if rows and rows[-1][-1][0] == prompt and used + c <= budget:
                rows[-1][-1][1].append(i)  # behind its prompt, already in this row
                used += c
            elif rows and used + len(prompt) + c <= budget:
                rows[-1].append((prompt, [i]))
                used += len(prompt) + c
            else:
                rows.append([(prompt, [i])])
                used = len(prompt) + c
    out = []
    for row in rows:
        ids: list[int] = []
        pos: list[int] = []
        prompts: list[tuple[int, int]] = []  # (start, length)
        spans: list[tuple[int, int, int, int, int]] = []  # (prompt start, prompt length, start, length, sequence)
        for prompt, members in row:
            a, p = len(ids), len(prompt)
            prompts.append((a, p))
            ids.extend(prompt)
            pos.extend(range(p))
            for i in members:
                comp = seqs[i].completion_ids
                spans.append((a, p, len(ids), len(comp), i))
                ids.extend(comp)
                pos.extend(range(p, p + len(comp)))
        length = len(ids)
        allowed = torch.zeros((length, length), dtype=torch.bool)
        for a, p in prompts:
            allowed[a : a + p, a : a + p] = torch.ones((p, p), dtype=torch.bool).tril()
        pred, targets, owner, slp, peer, spread, guide = [], [], [], [], [], [], []
        for k, (a, p, b, c, i) in enumerate(spans):
            allowed[b : b + c, a : a + p] = True
            allowed[b : b + c, b : b + c] = torch.ones((c, c), dtype=torch.bool).tril()
            s = seqs[i]
            pred.extend([a + p - 1] + list(range(b, b + c - 1)))  # the prompt's last token predicts the first
            targets.extend(s.completion_ids)
            owner.extend([k] * c)
            slp.extend(s.sample_logprobs if s.sample_logprobs is not None else [float("nan")] * c)
            peer.extend([s.peer] * c)
            spread.extend([s.spread] * c)
            guide.extend([s.guide] * c)
        mask = torch.zeros((1, 1, length, length), dtype=dtype)
        mask.masked_fill_(~allowed, torch.finfo(dtype).min)
        out.append(
            _MicroBatch(
                input_ids=torch.tensor([ids], dtype=torch.long),
                attention=mask,
                pred_rows=torch.tensor(pred, dtype=torch.long),
                targets=torch.tensor(targets, dtype=torch.long),
                seq_of_token=torch.tensor(owner, dtype=torch.long),
                advantages=torch.tensor([seqs[span[4]].advantage for span in spans], dtype=torch.float32),
                sample_logprobs=torch.tensor(slp, dtype=torch.float32),
                n_tokens=length,
                position_ids=torch.tensor([pos], dtype=torch.long),
                peer_tokens=torch.tensor(peer, dtype=torch.bool),
                spread_tokens=torch.tensor(spread, dtype=torch.bool),
                guide_tokens=torch.tensor(guide, dtype=torch.bool),
            )
        )
    return out


def _make_prefix_micro_batches(seqs: list[TrainSequence], pad_id: int) -> list[_MicroBatch]:
    """One micro-batch per prompt: the prompt but its last token as `prefix_ids` (run once, without
    gradient), then a row per completion: [the prompt's last token, completion[:-1]], predicting
    the completion. Positions continue after the prefix, so each completion's log-probs are those of
    its own row in one full sequence."""
    by_prompt: dict[tuple[int, ...], list[int]] = {}
    for i, s in enumerate(seqs):
        by_prompt.setdefault(tuple(s.prompt_ids), []).append(i)
    out = []
    for prompt, members in by_prompt.items():
        prefix, last = list(prompt[:-1]), prompt[-1]
        length = max(len(seqs[i].completion_ids) for i in members)
        ids = torch.full((len(members), length), pad_id, dtype=torch.long)
        att = torch.zeros((len(members), len(prefix) + length), dtype=torch.long)
        att[:, : len(prefix)] = 1
        rows, targets, owner, slp, peer, spread, guide = [], [], [], [], [], [], []
        for b, i in enumerate(members):
            s = seqs[i]
            c = len(s.completion_ids)
            ids[b, :c] = torch.tensor([last, *s.completion_ids[:-1]])
            att[b, len(prefix) : len(prefix) + c] = 1
            rows.extend(b * length + t for t in range(c))
            targets.extend(s.completion_ids)
            owner.extend([b] * c)
            slp.extend(s.sample_logprobs if s.sample_logprobs is not None else [float("nan")] * c)
            peer.extend([s.peer] * c)
            spread.extend([s.spread] * c)
            guide.extend([s.guide] * c)
        out.append(
            _MicroBatch(
                input_ids=ids,
                attention=att,
                pred_rows=torch.tensor(rows, dtype=torch.long),
                targets=torch.tensor(targets, dtype=torch.long),
                seq_of_token=torch.tensor(owner, dtype=torch.long),
                advantages=torch.tensor([seqs[i].advantage for i in members], dtype=torch.float32),
                sample_logprobs=torch.tensor(slp, dtype=torch.float32),
                n_tokens=len(prefix) + len(targets),
                position_ids=(torch.arange(length) + len(prefix)).repeat(len(members), 1),
                peer_tokens=torch.tensor(peer, dtype=torch.bool),
                spread_tokens=torch.tensor(spread, dtype=torch.bool),
                guide_tokens=torch.tensor(guide, dtype=torch.bool),
                prefix_ids=torch.tensor([prefix], dtype=torch.long),
            )
        )
    return out


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
    def _token_logprobs(self, mb: _MicroBatch, body: torch.nn.Module, head: torch.Tensor) -> torch.Tensor:
        with self.precision.context(mb.input_ids.device.type):
            if mb.prefix_ids is not None:
                hidden = self._after_prefix(mb, body)  # (B, C, H)
            else:
                hidden = body(
                    input_ids=mb.input_ids, attention_mask=mb.attention, position_ids=mb.position_ids
                ).last_hidden_state  # (B, L, H)
        flat = hidden.float().reshape(-1, hidden.shape[-1])  # (B*L, H); the head and log-probs in fp32
        return grpo.token_logprobs(flat[mb.pred_rows], head, mb.targets, self.cfg.logit_chunk, self.temperature)

    def _after_prefix(self, mb: _MicroBatch, body: torch.nn.Module) -> torch.Tensor:
        """(B, C, H) hidden states of the completion rows, the prefix's keys and values computed
        without gradient and shared by every row."""
        from transformers import DynamicCache

        arg = _cache_argument(type(body).forward)
        cache = DynamicCache()
        if mb.prefix_ids.shape[1]:
            with torch.no_grad():
                body(input_ids=mb.prefix_ids, use_cache=True, **{arg: cache})
            cache.batch_repeat_interleave(mb.input_ids.shape[0])
        with _checkpointing_off(body):
            out = body(
                input_ids=mb.input_ids,
                attention_mask=mb.attention,
                position_ids=mb.position_ids,
                use_cache=True,
                **{arg: cache},
            )
        return out.last_hidden_state

    def _reference_logprobs(self, mb: _MicroBatch) -> torch.Tensor:
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
        pad = self.policy.tokenizer.pad_token_id
        if not self.cfg.prompt_grad:
            mbs = _make_prefix_micro_batches(seqs, pad)
        elif self.cfg.pack_prompts:
            mbs = _make_packed_micro_batches(seqs, self.cfg.micro_batch_size, next(model.parameters()).dtype)
        else:
            mbs = _make_micro_batches(seqs, self.cfg.micro_batch_size, pad)
        device = next(model.parameters()).device
        mbs = [mb.to(device) for mb in mbs]
        total_completion = sum(len(mb.targets) for mb in mbs)
        old: list[torch.Tensor] = []
        ref: list[torch.Tensor | None] = []
        if self.cfg.kl_beta > 0:
            ref = [self._reference_logprobs(mb) for mb in mbs]
        sums = {"loss": 0.0, "kl": 0.0, "clip_low": 0.0, "clip_high": 0.0, "ratio": 0.0, "grad_norm": 0.0}
        drift_sum, drift_n, tokens, guide_tokens = 0.0, 0, 0, 0
        weights: list[torch.Tensor | None] = []
        peer_figures: dict[str, float] = {}
        t0 = time.perf_counter()
        steps = self.cfg.steps_per_round
        for step in range(steps):
            self.optimizer.zero_grad(set_to_none=True)
            body, head = self.policy.body(), self.policy.head_weight()
            for i, mb in enumerate(mbs):
                hooks.checkpoint()
                hooks.progress("update", step * len(mbs) + i, steps * len(mbs), step=step)
                logp = self._token_logprobs(mb, body, head)  # (N,)
                if step == 0:
                    old.append(logp.detach())
                    known = ~torch.isnan(mb.sample_logprobs)
                    if mb.peer_tokens is not None:
                        known &= ~mb.peer_tokens  # the drift is our sampler's against our trainer
                    weights.append(self._peer_weights(mb, old[i], peer_figures))
                    if known.any():
                        drift_sum += float((mb.sample_logprobs[known] - old[i][known]).abs().sum())
                        drift_n += int(known.sum())
                adv = mb.advantages[mb.seq_of_token]  # (N,) each token carries its sequence's advantage
                mask = torch.ones_like(logp)
                # token-flat form of grpo.clipped_surrogate: N rows of length 1
                loss_tok, st = grpo.clipped_surrogate(
                    logp[:, None], old[i][:, None], adv, mask[:, None], self.cfg.epsilon_low, self.cfg.epsilon_high
                )
                if weights[i] is not None:
                    loss_tok = loss_tok * weights[i][:, None]
                if mb.guide_tokens is not None and bool(mb.guide_tokens.any()):
                    # a guide's tokens: LUFFY's shaped objective, -A f(p), unclipped (see module docstring)
                    shaped = -adv * grpo.policy_shaping(logp, self.cfg.guide_gamma)
                    loss_tok = torch.where(mb.guide_tokens[:, None], shaped[:, None], loss_tok)
                    if step == 0:
                        guide_tokens += int(mb.guide_tokens.sum())
                loss = loss_tok.sum()
                if self.cfg.kl_beta > 0:
                    kl = grpo.kl_k3(logp, ref[i], mask).sum()
                    loss = loss + self.cfg.kl_beta * kl
                    sums["kl"] += float(kl.detach()) / total_completion / steps
                (loss / total_completion).backward()
                n = len(mb.targets)
                sums["loss"] += float(loss_tok.detach().sum()) / total_completion / steps
                sums["clip_low"] += float(st.clipped_low) * n / total_completion / steps
                sums["clip_high"] += float(st.clipped_high) * n / total_completion / steps
                sums["ratio"] += float(st.ratio_mean) * n / total_completion / steps
                tokens += mb.n_tokens
            params = self.policy.trainable_parameters()
            max_norm = self.cfg.max_grad_norm if self.cfg.max_grad_norm > 0 else float("inf")
            norm = torch.nn.utils.clip_grad_norm_(params, max_norm)
            sums["grad_norm"] += float(norm) / steps
            self.optimizer.step()
            self.policy.version += 1
        model.eval()
        seconds = time.perf_counter() - t0
        out = {
            "loss/policy": sums["loss"],
            "train/clip_low_frac": sums["clip_low"],
            "train/clip_high_frac": sums["clip_high"],
            "train/ratio_mean": sums["ratio"],
            "train/grad_norm": sums["grad_norm"],
            "train/steps": float(steps),
            "train/sequences": float(len(seqs)),
            "train/completion_tokens": float(total_completion),
            "train/tokens": float(tokens),
            "train/tok_per_s": tokens / seconds if seconds > 0 else 0.0,
        }
        if self.cfg.kl_beta > 0:
            out["loss/kl"] = sums["kl"]
        if drift_n:
            out["sampler/logprob_drift"] = drift_sum / drift_n
        if guide_tokens:
            out["train/guide_tokens"] = float(guide_tokens)
        out.update(_peer_summary(peer_figures))
        return out

    def _peer_weights(self, mb: _MicroBatch, old: torch.Tensor, figures: dict[str, float]) -> torch.Tensor | None:
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
        model = self.policy.model
        model.eval()
        if self.cfg.pack_prompts:
            mbs = _make_packed_micro_batches(tagged, self.cfg.micro_batch_size, next(model.parameters()).dtype)
        else:
            mbs = _make_micro_batches(tagged, self.cfg.micro_batch_size, self.policy.tokenizer.pad_token_id)
        device = next(model.parameters()).device
        mbs = [mb.to(device) for mb in mbs]
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
