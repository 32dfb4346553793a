"""The llama.cpp side of the sampler; runs only inside the worker process (see guard.py).

`python -m sapo_core.sampler.llamacpp_engine` serves the requests of `LlamaCppSampler`.
Batched multi-sequence decoding through llama.cpp's low-level API (the high-level `Llama`
ignores `n_seq_max`: docs/environment.md, 'llama.cpp: many sequences in one context'):

- one context with `n_seq_max` sequences; up to 32 of them share a unified KV cache
  (`kv_unified`), where `llama_memory_seq_cp` shares a prompt's cells with its G sequences
  instead of copying them; more get a cache each (see `_UNIFIED_MAX_SEQS`);
- each prompt is decoded once, on the first sequence of its group, then shared; the part it
  shares with an earlier prompt of the call (chat template, the task's one-shot example) is not
  decoded again but taken from that prompt's cells;
- every step decodes one token for every live sequence of every question in one batch;
- tokens are drawn in numpy from the logits (`sampling.sample_rows`), one generator per
  sequence, so log-probs are exact and a sequence depends only on its seed.

The parent drives decoding one step per request so it can run the round hooks (pause,
throttle, stop) between steps. This module imports no torch.
"""

from __future__ import annotations

import ctypes
import os
import sys
from dataclasses import dataclass, field
from typing import Any

import llama_cpp as L
import numpy as np

from sapo_core.sampler.base import sequence_seed
from sapo_core.sampler.guard import serve
from sapo_core.sampler.sampling import sample_rows, sequence_rng

_FTYPES = {"q8_0": L.LLAMA_FTYPE_MOSTLY_Q8_0, "f16": L.LLAMA_FTYPE_MOSTLY_F16}
_PREFILL_CHUNK = 512
# Sequences per call that share one KV cache: above this, separate caches decode faster (the
# shared cache's attention over every cell grows each step; docs/calibration.md, 'Sampler').
_UNIFIED_MAX_SEQS = 32


@L.llama_log_callback
def _log_warnings_only(level: int, text: bytes, user_data: ctypes.c_void_p) -> None:
    if level in (3, 4):  # GGML_LOG_LEVEL_WARN, _ERROR (ggml.h); loading chatter stays out of the tail
        sys.stderr.write(text.decode("utf-8", "replace"))


def shared_prefix(earlier: list[list[int]], prompt: list[int]) -> tuple[int, int]:
    """(index of the earlier prompt, tokens) sharing the longest prefix with `prompt`; at most
    all but its last token, whose logits the first draw needs. (-1, 0) when none is shared."""
    best, src = 0, -1
    for r, other in enumerate(earlier):
        n = min(len(other), len(prompt) - 1)
        a, b = np.asarray(other[:n]), np.asarray(prompt[:n])
        differ = np.flatnonzero(a != b)
        common = int(differ[0]) if len(differ) else n
        if common > best:
            best, src = common, r
    return src, best


@dataclass
class _Seq:
    seq_id: int
    prompt_index: int
    rng: np.random.Generator
    pos: int  # position of the next token fed to the model
    tokens: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    finished: bool = False
    active: bool = True


def quantize(src: str, dst: str, ftype: str, threads: int) -> None:
    """Re-quantize a GGUF (`allow_requantize`: Q4_1 -> Q8_0 loses ~nothing, docs/environment.md); atomic."""
    params = L.llama_model_quantize_default_params()
    params.ftype = _FTYPES[ftype]
    params.allow_requantize = True
    params.nthread = threads
    tmp = f"{dst}.tmp{os.getpid()}"
    rc = L.llama_model_quantize(src.encode(), tmp.encode(), ctypes.byref(params))
    if rc != 0 or not os.path.isfile(tmp):
        raise RuntimeError(f"llama_model_quantize({src} -> {ftype}) returned {rc}")
    os.replace(tmp, dst)


class Engine:
    def __init__(self) -> None:
        L.llama_log_set(_log_warnings_only, ctypes.c_void_p(0))
        L.llama_backend_init()
        self.model: Any = None
        self.vocab: Any = None
        self.ctx: Any = None
        self.batch: Any = None
        self.batch_cap = 0
        self.n_ctx = 0
        self.n_seq_ctx = 0
        self.kv_unified = True
        self.n_vocab = 0
        self.threads = max(1, os.cpu_count() or 1)
        self.model_path = ""
        self.adapter: Any = None
        self.adapter_path: str | None = None
        self.adapter_scale = 1.0
        self.seqs: list[_Seq] = []
        self.shared_tokens = 0  # prompt tokens the last start took from an earlier prompt's cells
        self.params: dict[str, Any] = {}

    # --- model, context, adapter -----------------------------------------------------
    def op_load(self, path: str, threads: int, quantize_to: str = "", ftype: str = "q8_0") -> dict[str, Any]:
        """Load (or reload, after full fine-tuning) the model; quantize it first when asked."""
        self.threads = max(1, threads)
        if quantize_to and not os.path.isfile(quantize_to):
            quantize(path, quantize_to, ftype, self.threads)
        use = quantize_to or path
        self._free_context()
        if self.adapter is not None:  # an adapter belongs to the model it was made for
            L.llama_adapter_lora_free(self.adapter)
            self.adapter, self.adapter_path = None, None
        if self.model is not None:
            L.llama_model_free(self.model)
            self.model = None
        mparams = L.llama_model_default_params()
        gpu = bool(L.llama_supports_gpu_offload())
        mparams.n_gpu_layers = -1 if gpu else 0
        model = L.llama_model_load_from_file(use.encode(), mparams)
        if not model:
            raise RuntimeError(f"llama.cpp could not load {use}")
        self.model, self.model_path = model, use
        self.vocab = L.llama_model_get_vocab(model)
        self.n_vocab = L.llama_vocab_n_tokens(self.vocab)
        return {
            "model_path": use,
            "n_vocab": self.n_vocab,
            "gpu_offload": gpu,
            "n_ctx_train": L.llama_model_n_ctx_train(model),
            "max_sequences": int(L.llama_max_parallel_sequences()),
            "shared_cache_sequences": _UNIFIED_MAX_SEQS,
            "system_info": L.llama_print_system_info().decode("utf-8", "replace").strip(),
        }

    def _free_context(self) -> None:
        if self.batch is not None:
            L.llama_batch_free(self.batch)
            self.batch, self.batch_cap = None, 0
        if self.ctx is not None:
            L.llama_free(self.ctx)
            self.ctx, self.n_ctx, self.n_seq_ctx = None, 0, 0

    def _ensure_context(self, prompt_lens: list[int], n: int, max_new_tokens: int) -> None:
        """A context for len(prompt_lens) prompts x n sequences; grown, never shrunk.

        Up to _UNIFIED_MAX_SEQS sequences share one KV cache (a prompt's cells are shared by
        its group, not copied); above that, each sequence gets its own cache (its own copy of
        the prompt), since in a shared cache every token attends over all cells, masked.
        """
        n_seqs = len(prompt_lens) * n
        unified = n_seqs <= _UNIFIED_MAX_SEQS
        same = self.ctx is not None and self.kv_unified == unified
        if unified:
            need = sum(prompt_lens) + n_seqs * max_new_tokens + 8
            if same and self.n_ctx >= need and self.n_seq_ctx >= n_seqs:
                return
            n_seq = max(n_seqs, self.n_seq_ctx if same else 0)
            n_ctx = -(-max(need, self.n_ctx * 3 // 2 if same else 0, 1024) // 256) * 256
        else:
            per_seq = max(prompt_lens) + max_new_tokens + 8
            if same and self.n_ctx // self.n_seq_ctx >= per_seq and self.n_seq_ctx >= n_seqs:
                return
            n_seq = max(n_seqs, self.n_seq_ctx if same else 0)
            per_seq = -(-max(per_seq, self.n_ctx // self.n_seq_ctx if same else 0) // 256) * 256
            n_ctx = per_seq * n_seq
        self._free_context()
        cparams = L.llama_context_default_params()
        cparams.n_ctx = n_ctx
        cparams.n_batch = max(_PREFILL_CHUNK, n_seq)
        cparams.n_ubatch = max(_PREFILL_CHUNK, n_seq)
        cparams.n_seq_max = n_seq
        cparams.kv_unified = unified
        cparams.n_threads = cparams.n_threads_batch = self.threads
        cparams.no_perf = True
        ctx = L.llama_init_from_model(self.model, cparams)
        if not ctx:
            raise RuntimeError(
                f"llama.cpp could not make a context of {n_ctx} tokens x {n_seq} sequences "
                "(out of memory?); lower sampler.group_size or round.local_groups"
            )
        self.ctx, self.n_ctx, self.n_seq_ctx, self.kv_unified = ctx, n_ctx, n_seq, unified
        self.batch_cap = max(_PREFILL_CHUNK, n_seq)
        self.batch = L.llama_batch_init(self.batch_cap, 0, 1)
        self._apply_adapter(self.adapter, self.adapter_scale)

    def _apply_adapter(self, adapter: Any, scale: float) -> None:
        if self.ctx is None:
            return
        if adapter is None:
            rc = L.llama_set_adapters_lora(self.ctx, None, 0, None)
        else:
            arr = (L.llama_adapter_lora_p_ctypes * 1)(adapter)
            rc = L.llama_set_adapters_lora(self.ctx, arr, 1, (ctypes.c_float * 1)(scale))
        if rc != 0:
            raise RuntimeError(f"llama_set_adapters_lora returned {rc}")

    def op_adapter(self, path: str | None, scale: float = 1.0) -> dict[str, Any]:
        """Hot-swap the LoRA adapter (None: none); the base model stays loaded."""
        if self.model is None:
            raise RuntimeError("no model loaded")
        new = None
        if path:
            new = L.llama_adapter_lora_init(self.model, path.encode())
            if not new:
                raise RuntimeError(f"llama.cpp rejected the adapter {path} (shapes or names do not match the model)")
        try:
            self._apply_adapter(new, scale)  # the context lets go of the old one before it is freed
        except Exception:
            if new is not None:
                L.llama_adapter_lora_free(new)
            raise
        if self.adapter is not None:
            L.llama_adapter_lora_free(self.adapter)
        self.adapter, self.adapter_path, self.adapter_scale = new, path or None, scale
        return {}

    def op_threads(self, n: int) -> dict[str, Any]:
        self.threads = max(1, n)
        if self.ctx is not None:
            L.llama_set_n_threads(self.ctx, self.threads, self.threads)
        return {}

    def op_status(self) -> dict[str, Any]:
        return {
            "model_path": self.model_path,
            "adapter_path": self.adapter_path,
            "threads": self.threads,
            "ctx_threads": int(L.llama_n_threads(self.ctx)) if self.ctx is not None else None,
            "n_ctx": self.n_ctx,
            "n_seq_max": self.n_seq_ctx,
            "kv_unified": self.kv_unified,
            "pid": os.getpid(),
        }

    def op_ping(self) -> dict[str, Any]:
        return {}

    # --- decoding ----------------------------------------------------------------------
    def _decode(self, items: list[tuple[int, int, int, bool]]) -> None:
        """One llama_decode of (token, pos, seq_id, wants_logits) items."""
        b = self.batch
        assert len(items) <= self.batch_cap
        for i, (tok, pos, sid, out) in enumerate(items):
            b.token[i] = tok
            b.pos[i] = pos
            b.n_seq_id[i] = 1
            b.seq_id[i][0] = sid
            b.logits[i] = 1 if out else 0
        b.n_tokens = len(items)
        rc = L.llama_decode(self.ctx, b)
        if rc != 0:
            raise RuntimeError(f"llama_decode returned {rc} ({len(items)} tokens, context {self.n_ctx})")

    def _logits(self, n_rows: int) -> np.ndarray:
        """(n_rows, V) logits of the last decode's outputs, in batch order (a view: use at once)."""
        ptr = L.llama_get_logits(self.ctx)
        return np.ctypeslib.as_array(ptr, shape=(n_rows, self.n_vocab))

    def op_start(
        self,
        prompts: list[list[int]],
        seeds: list[int],
        n: int,
        max_new_tokens: int,
        temperature: float,
        top_p: float,
        stop_ids: list[int],
    ) -> dict[str, Any]:
        """Decode the prompts, share each with its n sequences, draw every first token."""
        if self.model is None:
            raise RuntimeError("no model loaded")
        if any(len(p) == 0 for p in prompts):
            raise ValueError("empty prompt")
        bad = [t for p in prompts for t in p if not 0 <= t < self.n_vocab]
        if bad:
            raise ValueError(f"token id {bad[0]} is outside the model's vocabulary of {self.n_vocab}")
        n_seqs = len(prompts) * n
        self._ensure_context([len(p) for p in prompts], n, max_new_tokens)
        mem = L.llama_get_memory(self.ctx)
        L.llama_memory_clear(mem, True)
        self.params = {
            "n": n,
            "max_new_tokens": max_new_tokens,
            "temperature": temperature,
            "top_p": top_p,
            "stop": set(stop_ids),
            "n_prompts": len(prompts),
        }
        self.seqs = []
        first = np.empty((n_seqs, self.n_vocab), dtype=np.float32)
        self.shared_tokens = 0
        for q, (prompt, seed) in enumerate(zip(prompts, seeds)):
            base = q * n
            # the chat template and the task's example open many prompts alike: take those cells
            # from an earlier prompt of this call (same weights, so the same keys and values)
            # (one shared cache only: llama.cpp copies between separate caches only whole sequences)
            src, done = shared_prefix(prompts[:q], prompt) if self.kv_unified else (-1, 0)
            if done:
                L.llama_memory_seq_cp(mem, src * n, base, 0, done)
                self.shared_tokens += done
            for start in range(done, len(prompt), _PREFILL_CHUNK):
                chunk = prompt[start : start + _PREFILL_CHUNK]
                last = start + len(chunk) == len(prompt)
                self._decode([(t, start + i, base, last and i == len(chunk) - 1) for i, t in enumerate(chunk)])
            first[base : base + n] = self._logits(1)[0]
            for j in range(n):
                if j:
                    L.llama_memory_seq_cp(mem, base, base + j, -1, -1)
                self.seqs.append(_Seq(base + j, q, sequence_rng(sequence_seed(seed, j)), len(prompt)))
        self._accept(self.seqs, first)
        return {"live": sum(s.active for s in self.seqs), "shared_tokens": self.shared_tokens}

    def _accept(self, seqs: list[_Seq], logits: np.ndarray) -> None:
        p = self.params
        toks, lps = sample_rows(logits, [s.rng for s in seqs], p["temperature"], p["top_p"])
        for s, t, lp in zip(seqs, toks.tolist(), lps.tolist()):
            if t in p["stop"]:
                s.finished, s.active = True, False
                continue
            s.tokens.append(t)
            s.logprobs.append(lp)
            if len(s.tokens) >= p["max_new_tokens"]:
                s.active = False

    def op_step(self) -> dict[str, Any]:
        """Feed every live sequence its last token, draw the next; returns how many still run."""
        live = [s for s in self.seqs if s.active]
        if live:
            self._decode([(s.tokens[-1], s.pos, s.seq_id, True) for s in live])
            for s in live:
                s.pos += 1
            self._accept(live, self._logits(len(live)))
        return {"live": sum(s.active for s in self.seqs)}

    def op_collect(self) -> dict[str, Any]:
        """Per prompt, per sequence: [token ids, log-probs, finished]."""
        n = self.params.get("n", 0)
        out: list[list[list[Any]]] = [[] for _ in range(self.params.get("n_prompts", 0))]
        for s in self.seqs:
            out[s.prompt_index].append([s.tokens, s.logprobs, s.finished])
        assert all(len(g) == n for g in out)
        self.seqs = []
        return {"results": out}

    def op_abort(self) -> dict[str, Any]:
        self.seqs = []
        if self.ctx is not None:
            L.llama_memory_clear(L.llama_get_memory(self.ctx), True)
        return {}

    def handlers(self) -> dict[str, Any]:
        return {name[3:]: getattr(self, name) for name in dir(self) if name.startswith("op_")}


def main() -> int:
    return serve(Engine().handlers())


if __name__ == "__main__":
    sys.exit(main())
