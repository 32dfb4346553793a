"""The trainer's input: a round's sequences, and the micro-batches its forward passes run over.

Three layouts of the same sequences, each giving every completion token the log-prob of its own
sequence (trainer.py's docstring says when each is used):
- padded: a row per sequence, similar lengths together;
- packed (train.pack_prompts): a row holding each prompt once, followed by its completions,
  behind a block attention mask;
- prefix (train.prompt_grad = false): a micro-batch per prompt, the prompt run once without
  gradient, then its completions packed in one row behind a block mask.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch


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
class MicroBatch:
    input_ids: torch.Tensor  # (B, L)
    attention: torch.Tensor  # (B, L) padding mask, or an additive (1, 1, L, L) packed, (1, 1, C, P-1+C) after a prefix
    pred_rows: torch.Tensor  # (N,) flat index into (B*L) of hidden states predicting a completion token
    targets: torch.Tensor  # (N,) the completion tokens
    seq_of_token: torch.Tensor  # (N,) which row of the micro-batch each token belongs to
    advantages: torch.Tensor  # (B,)
    sample_logprobs: torch.Tensor  # (N,) NaN where unknown
    n_tokens: int  # prompt + completion tokens processed
    peer_tokens: torch.Tensor | None = None  # (N,) bool: the token belongs to a peer's completion
    spread_tokens: torch.Tensor | None = None  # (N,) bool: its sequence's log-probs were spread
    guide_tokens: torch.Tensor | None = None  # (N,) bool: a guide's token (LUFFY's shaped objective)

    def to(self, device: torch.device) -> MicroBatch:
        """This micro-batch with its tensors on `device` (the model's: a CUDA GPU, or itself)."""
        if device.type == "cpu":
            return self
        moved = {
            f.name: getattr(self, f.name).to(device)
            for f in dataclasses.fields(self)
            if isinstance(getattr(self, f.name), torch.Tensor)
        }
        return dataclasses.replace(self, **moved)

    position_ids: torch.Tensor | None = None  # (B, L) when packed, or (1, C) after a prefix
    prefix_ids: torch.Tensor | None = None  # (1, P-1) a group's prompt but its last token, run without gradient


@dataclass
class _TokenLabels:
    """What each completion token of a micro-batch carries, filled sequence by sequence: its
    target, its row, its sampling log-prob and whose text it is. The same in every layout."""

    targets: list[int] = dataclasses.field(default_factory=list)
    owner: list[int] = dataclasses.field(default_factory=list)
    slp: list[float] = dataclasses.field(default_factory=list)
    peer: list[bool] = dataclasses.field(default_factory=list)
    spread: list[bool] = dataclasses.field(default_factory=list)
    guide: list[bool] = dataclasses.field(default_factory=list)

    def add(self, row: int, s: TrainSequence) -> None:
        c = len(s.completion_ids)
        self.targets.extend(s.completion_ids)
        self.owner.extend([row] * c)
        self.slp.extend(s.sample_logprobs if s.sample_logprobs is not None else [float("nan")] * c)
        self.peer.extend([s.peer] * c)
        self.spread.extend([s.spread] * c)
        self.guide.extend([s.guide] * c)

    def tensors(self) -> dict[str, torch.Tensor]:
        """MicroBatch's per-token fields."""
        return dict(
            targets=torch.tensor(self.targets, dtype=torch.long),
            seq_of_token=torch.tensor(self.owner, dtype=torch.long),
            sample_logprobs=torch.tensor(self.slp, dtype=torch.float32),
            peer_tokens=torch.tensor(self.peer, dtype=torch.bool),
            spread_tokens=torch.tensor(self.spread, dtype=torch.bool),
            guide_tokens=torch.tensor(self.guide, dtype=torch.bool),
        )


def _by_prompt(seqs: list[TrainSequence]) -> dict[tuple[int, ...], list[int]]:
    """Each prompt -> the indices of its sequences, in order of first appearance."""
    groups: dict[tuple[int, ...], list[int]] = {}
    for i, s in enumerate(seqs):
        groups.setdefault(tuple(s.prompt_ids), []).append(i)
    return groups


def _additive_mask(allowed: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """(1, 1, Q, K) attention mask of `dtype`: 0 where `allowed` (Q, K), the dtype's minimum elsewhere."""
    mask = torch.zeros((1, 1, *allowed.shape), dtype=dtype)
    return mask.masked_fill_(~allowed, torch.finfo(dtype).min)


def make_micro_batches(seqs: list[TrainSequence], size: int, pad_id: int) -> list[MicroBatch]:
    # Similar lengths together: less padding to compute (order inside a round is irrelevant).
    order = sorted(range(len(seqs)), key=lambda i: len(seqs[i].prompt_ids) + len(seqs[i].completion_ids))
    out = []
    for start in range(0, len(order), size):
        part = [seqs[i] for i in order[start : start + size]]
        length = max(len(s.prompt_ids) + len(s.completion_ids) for s in part)
        ids = torch.full((len(part), length), pad_id, dtype=torch.long)
        att = torch.zeros((len(part), length), dtype=torch.long)
        rows, tokens = [], _TokenLabels()
        for b, s in enumerate(part):
            full = s.prompt_ids + s.completion_ids
            ids[b, : len(full)] = torch.tensor(full)
            att[b, : len(full)] = 1
            p = len(s.prompt_ids)
            # hidden state at position t predicts token t+1
            rows.extend(b * length + t - 1 for t in range(p, len(full)))
            tokens.add(b, s)
        out.append(
            MicroBatch(
                input_ids=ids,
                attention=att,
                pred_rows=torch.tensor(rows, dtype=torch.long),
                advantages=torch.tensor([s.advantage for s in part], dtype=torch.float32),
                n_tokens=int(att.sum()),
                **tokens.tensors(),
            )
        )
    return out


def make_packed_micro_batches(seqs: list[TrainSequence], size: int, dtype: torch.dtype) -> list[MicroBatch]:
    """One row per micro-batch: [prompt, its completions..., next prompt, its completions...].

    A row holds at most `size` x the longest single sequence (the unpacked bound). Token i
    attends to token j <= i of its own prompt, and a completion token also to its own earlier
    tokens; positions run 0..p-1 over a prompt and p.. over each completion, as if alone.
    """
    budget = size * max(len(s.prompt_ids) + len(s.completion_ids) for s in seqs)
    by_prompt = _by_prompt(seqs)
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
        pred, tokens = [], _TokenLabels()
        for k, (a, p, b, c, i) in enumerate(spans):
            allowed[b : b + c, a : a + p] = True
            allowed[b : b + c, b : b + c] = torch.ones((c, c), dtype=torch.bool).tril()
            pred.extend([a + p - 1] + list(range(b, b + c - 1)))  # the prompt's last token predicts the first
            tokens.add(k, seqs[i])
        mask = _additive_mask(allowed, dtype)
        out.append(
            MicroBatch(
                input_ids=torch.tensor([ids], dtype=torch.long),
                attention=mask,
                pred_rows=torch.tensor(pred, dtype=torch.long),
                advantages=torch.tensor([seqs[span[4]].advantage for span in spans], dtype=torch.float32),
                n_tokens=length,
                position_ids=torch.tensor([pos], dtype=torch.long),
                **tokens.tensors(),
            )
        )
    return out


def make_prefix_micro_batches(seqs: list[TrainSequence], dtype: torch.dtype) -> list[MicroBatch]:
    """One micro-batch per prompt: the prompt but its last token as `prefix_ids` (run once, without
    gradient), then one row packing each completion as [the prompt's last token, completion[:-1]],
    predicting the completion. A block mask lets each completion see the prefix and its own earlier
    tokens; positions restart after the prefix for each one, so each completion's log-probs are those
    of one full sequence. Packed, a group's short answers cost their own tokens, not the longest's."""
    by_prompt = _by_prompt(seqs)
    out = []
    for prompt, members in by_prompt.items():
        prefix, last = list(prompt[:-1]), prompt[-1]
        p = len(prefix)
        ids: list[int] = []
        pos: list[int] = []
        tokens = _TokenLabels()
        blocks: list[tuple[int, int]] = []  # (start, length) of each completion in the row
        for k, i in enumerate(members):
            comp = seqs[i].completion_ids
            blocks.append((len(ids), len(comp)))
            ids.extend([last, *comp[:-1]])
            pos.extend(range(p, p + len(comp)))
            tokens.add(k, seqs[i])
        length = len(ids)
        allowed = torch.zeros((length, p + length), dtype=torch.bool)
        allowed[:, :p] = True
        for b, c in blocks:
            allowed[b : b + c, p + b : p + b + c] = torch.ones((c, c), dtype=torch.bool).tril()
        mask = _additive_mask(allowed, dtype)
        out.append(
            MicroBatch(
                input_ids=torch.tensor([ids], dtype=torch.long),
                attention=mask,
                pred_rows=torch.arange(length),  # every position predicts its completion's next token
                advantages=torch.tensor([seqs[i].advantage for i in members], dtype=torch.float32),
                n_tokens=p + length,
                position_ids=torch.tensor([pos], dtype=torch.long),
                prefix_ids=torch.tensor([prefix], dtype=torch.long),
                **tokens.tensors(),
            )
        )
    return out
