"""The trainable policy: a base model read from a GGUF file, a LoRA adapter, the tokenizer.

One GGUF serves both sides: llama.cpp samples from it, transformers trains on it after
de-quantizing it (`from_pretrained(dir, gguf_file=...)`). De-quantizing and building the
tokenizer take ~40 s on a small CPU, so the converted model is cached as safetensors
beside the node's data (keyed by the GGUF's size and mtime) and later starts take seconds.

`tiny-random` builds a 2-layer model with the embedded model's tokenizer and random
weights: the real training and sampling code paths at a fraction of the cost, for the
swarm, worker and GUI tests ("a light sampler is fine") and for nothing else.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import os
import shutil
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from sapo_core.catalog import TINY_RANDOM
from sapo_core.config import ModelConfig
from sapo_core.fsutil import atomic_write_bytes


class ModelLoadError(RuntimeError):
    """The model could not be loaded; the message says which file and what to do."""


@dataclass
class Policy:
    model: Any  # transformers PreTrainedModel, peft-wrapped when LoRA
    tokenizer: Any
    model_id: str
    gguf_path: Path | None  # None for tiny-random
    lora: bool
    lora_rank: int = 0
    lora_alpha: float = 0.0
    version: int = 0  # bumped by every optimizer step; samplers use it to know they are stale
    eos_ids: tuple[int, ...] = field(default_factory=tuple)

    # --- text <-> tokens ----------------------------------------------------------------
    def encode_prompt(self, messages: list[dict[str, str]]) -> list[int]:
        # enable_thinking=False: Qwen3's template otherwise opens a <think> block the model fills
        # until max_new_tokens cuts it; other templates ignore the variable.
        out = self.tokenizer.apply_chat_template(
            messages, add_generation_prompt=True, tokenize=True, enable_thinking=False
        )
        if hasattr(out, "keys"):  # transformers 5 returns a BatchEncoding
            out = out["input_ids"]
        return list(out)

    def encode_completion(self, text: str) -> list[int]:
        """Token ids of a peer's completion text (the paper re-tokenises external rollouts)."""
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True)

    # --- parameters ---------------------------------------------------------------------
    def trainable_parameters(self) -> list[torch.nn.Parameter]:
        return [p for p in self.model.parameters() if p.requires_grad]

    def trainable_state_dict(self) -> dict[str, torch.Tensor]:
        """The adapter's tensors with LoRA, all weights without; CPU copies."""
        named = self.model.named_parameters()
        return {n: p.detach().to("cpu", copy=True) for n, p in named if p.requires_grad}

    def load_trainable_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        params = dict(self.model.named_parameters())
        missing = [n for n, p in params.items() if p.requires_grad and n not in state]
        unknown = [n for n in state if n not in params]
        if missing or unknown:
            raise ModelLoadError(
                f"checkpoint does not match the model (missing {missing[:3]}, unknown {unknown[:3]}); "
                "was it made with another model or LoRA rank? Use a new --run-dir."
            )
        with torch.no_grad():
            for n, t in state.items():
                params[n].copy_(t)

    def head_weight(self) -> torch.Tensor:
        return self.model.get_output_embeddings().weight

    def body(self) -> torch.nn.Module:
        """The transformer without its LM head: returns hidden states."""
        base = self.model.get_base_model() if self.lora else self.model
        return base.model


def _source_key(path: Path) -> str:
    st = path.stat()
    return hashlib.sha256(f"{path.resolve()}:{st.st_size}:{st.st_mtime_ns}".encode()).hexdigest()[:16]


def _cache_entry(gguf_path: Path, cache_dir: Path, part: str) -> Path:
    """Where `part` (model or tokenizer) of this GGUF is cached; `done.json` in it once complete."""
    return cache_dir / f"{gguf_path.stem}-{_source_key(gguf_path)}" / part


def is_cached(gguf_path: Path, cache_dir: Path) -> bool:
    """Whether `load_base` would read this GGUF's model from the cache instead of converting it."""
    return (_cache_entry(gguf_path, cache_dir, "model") / "done.json").is_file()


def _cached(gguf_path: Path, cache_dir: Path, part: str, load_cached, convert) -> Any:
    """Load `part` (model or tokenizer) from the cache, or convert it from the GGUF and cache it."""
    if not gguf_path.is_file():
        raise ModelLoadError(f"model file {gguf_path} does not exist")
    where = _cache_entry(gguf_path, cache_dir, part)
    if (where / "done.json").is_file():
        try:
            return load_cached(where)
        except Exception:  # a damaged cache is rebuilt, never fatal
            shutil.rmtree(where, ignore_errors=True)
    try:
        obj = convert()
    except Exception as e:
        raise ModelLoadError(f"transformers could not read {gguf_path}: {e}") from e
    tmp = where.with_name(where.name + f".tmp{os.getpid()}")
    try:
        shutil.rmtree(tmp, ignore_errors=True)
        obj.save_pretrained(tmp)
        atomic_write_bytes(tmp / "done.json", json.dumps({"source": str(gguf_path)}).encode())
        shutil.rmtree(where, ignore_errors=True)
        os.replace(tmp, where)
    except (OSError, ValueError):
        shutil.rmtree(tmp, ignore_errors=True)  # no cache (read-only, full disk): slower next start
    return obj


def load_tokenizer(gguf_path: Path, cache_dir: Path) -> Any:
    from transformers import AutoTokenizer

    return _cached(
        gguf_path,
        cache_dir,
        "tokenizer",
        AutoTokenizer.from_pretrained,
        lambda: AutoTokenizer.from_pretrained(gguf_path.parent, gguf_file=gguf_path.name),
    )


@contextlib.contextmanager
def gguf_read_once() -> Iterator[None]:
    """While a GGUF is converted: one `gguf.GGUFReader` per file, one tensor-name map per
    architecture. transformers reads the file three times (config, tokenizer, weights), each time
    parsing all its metadata in Python (4.2 s a time on a 2-core AVX2 EPYC, docs/benchmarks.md),
    and builds the name map once per module of the model. Both are read-only; outside the block
    gguf is as it was."""
    try:
        import gguf
    except ImportError:
        yield
        return
    real_reader, real_map = gguf.GGUFReader, gguf.get_tensor_name_map
    readers: dict[tuple[str, str], Any] = {}

    def reader(path: Any, mode: str = "r") -> Any:
        key = (str(Path(path).resolve()), mode)
        if key not in readers:
            readers[key] = real_reader(path, mode)
        return readers[key]

    gguf.GGUFReader, gguf.get_tensor_name_map = reader, functools.lru_cache(maxsize=None)(real_map)
    try:
        yield
    finally:
        gguf.GGUFReader, gguf.get_tensor_name_map = real_reader, real_map


def load_base(gguf_path: Path, cache_dir: Path, dtype: torch.dtype = torch.float32) -> tuple[Any, Any]:
    """(model, tokenizer) de-quantized from a GGUF, through the safetensors cache."""
    with gguf_read_once():
        return _load_base(gguf_path, cache_dir, dtype)


def _load_base(gguf_path: Path, cache_dir: Path, dtype: torch.dtype) -> tuple[Any, Any]:
    from transformers import AutoModelForCausalLM

    def convert() -> Any:
        model = AutoModelForCausalLM.from_pretrained(gguf_path.parent, gguf_file=gguf_path.name, dtype=dtype)
        # The weights are de-quantized already; the GGUF "quantizer" marker only blocks saving.
        model.hf_quantizer = None
        model.is_quantized = False
        if hasattr(model.config, "quantization_config"):
            del model.config.quantization_config
        return model

    tok = load_tokenizer(gguf_path, cache_dir)
    model = _cached(
        gguf_path, cache_dir, "model", lambda d: AutoModelForCausalLM.from_pretrained(d, dtype=dtype), convert
    )
    return model.to(dtype), tok


def build_tiny_random(tokenizer: Any, seed: int) -> Any:
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=2048,
        tie_word_embeddings=True,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    torch.manual_seed(seed)
    return LlamaForCausalLM(cfg)


def load_policy(
    cfg: ModelConfig,
    gguf_path: Path | None,
    cache_dir: Path,
    seed: int = 0,
    tokenizer_gguf: Path | None = None,
    model_id: str | None = None,
) -> Policy:
    """The policy to train. `tiny-random` needs `tokenizer_gguf` (the embedded model's)."""
    dtype = getattr(torch, cfg.dtype)
    if cfg.name == TINY_RANDOM:
        if tokenizer_gguf is None:
            raise ModelLoadError("tiny-random needs the embedded model's tokenizer")
        tok = load_tokenizer(tokenizer_gguf, cache_dir)
        model = build_tiny_random(tok, seed).to(dtype)
        model_id, path = TINY_RANDOM, None
    else:
        assert gguf_path is not None
        model, tok = load_base(gguf_path, cache_dir, dtype)
        model_id, path = model_id or cfg.name, gguf_path
    if tok.pad_token_id is None:
        tok.pad_token = tok.eos_token
    model.config.use_cache = False
    if cfg.lora:
        from peft import LoraConfig, get_peft_model

        torch.manual_seed(seed)  # LoRA A's init is random: make it the run's
        targets = [t for t in cfg.lora_targets if any(n.endswith(t) for n, _ in model.named_modules())]
        if not targets:
            raise ModelLoadError(f"none of model.lora_targets {cfg.lora_targets} exist in {model_id}")
        lcfg = LoraConfig(
            r=cfg.lora_rank,
            lora_alpha=cfg.lora_alpha,
            lora_dropout=0.0,
            target_modules=targets,
            bias="none",
            task_type="CAUSAL_LM",
        )
        model = get_peft_model(model, lcfg)
    else:
        for p in model.parameters():
            p.requires_grad_(True)
    eos = {tok.eos_token_id}
    gen_eos = getattr(model.generation_config, "eos_token_id", None)
    eos.update(gen_eos if isinstance(gen_eos, list) else [gen_eos] if gen_eos is not None else [])
    return Policy(
        model=model,
        tokenizer=tok,
        model_id=model_id,
        gguf_path=path,
        lora=cfg.lora,
        lora_rank=cfg.lora_rank if cfg.lora else 0,
        lora_alpha=cfg.lora_alpha if cfg.lora else 0.0,
        eos_ids=tuple(sorted(e for e in eos if e is not None)),
    )
