"""Export the trained policy to GGUF so llama.cpp samples from what the trainer holds.

Two exports:
- `export_lora_adapter`: the peft LoRA adapter as a GGUF adapter (`general.type=adapter`,
  `adapter.type=lora`, `adapter.lora.alpha`, tensors `<base tensor>.lora_a` / `.lora_b`),
  the format of llama.cpp's `convert_lora_to_gguf.py`; loaded with
  `llama_adapter_lora_init` over the unchanged (possibly quantized) base. Every round.
- `export_full_gguf`: all weights (full fine-tuning, or a policy that has no GGUF), F32,
  with the metadata (tokenizer, chat template) of a template GGUF. Reloaded, not swapped.

Layouts. A GGUF tensor's numpy shape is the torch shape of the same matrix (ggml lists
dimensions fastest-first, so `ne` reads reversed): lora_a is (r, in) and lora_b (out, r),
exactly peft's `lora_A.weight` and `lora_B.weight`. llama.cpp applies
`W x + scale * B (A x)` with `scale = alpha / r`, r read from lora_b.

Q/K rows. For `llama` GGUFs, llama.cpp's converter permutes the rows of q_proj and
k_proj (`LlamaModel.permute`: rotate-half RoPE pairs -> interleaved pairs) and
transformers undoes it when it loads the GGUF (`LlamaTensorProcessor`). The policy's
weights are therefore in HF order, and an adapter's delta `B A` must get the same row
permutation: it applies to lora_B's rows (A mixes inputs, whose order is unchanged).
Other architectures (qwen2, qwen3) keep HF order. A missed permutation loads without
complaint and samples from a different model; the drift check (`logprob_drift`) catches it.
"""

from __future__ import annotations

import mmap
import os
import re
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import gguf
import numpy as np
import torch

from sapo_core.fsutil import fsync_dir

# GGUF architectures whose Q/K rows llama.cpp's converter permutes (transformers undoes it on load).
PERMUTED_ARCHES = frozenset({"llama"})
# transformers model_type -> GGUF architecture, for the architectures we export.
HF_TO_GGUF_ARCH = {"llama": "llama", "mistral": "llama", "qwen2": "qwen2", "qwen3": "qwen3"}

_LORA_PARAM = re.compile(r"^(?:base_model\.model\.)?(?P<module>.+)\.lora_(?P<ab>[AB])\.(?P<adapter>[^.]+)\.weight$")


class ExportError(RuntimeError):
    """The policy cannot be written as GGUF for llama.cpp; the message says why."""


# --- reading GGUF metadata ---------------------------------------------------------------
# gguf.GGUFReader builds numpy views for every token string (tens of seconds for a 49k-token
# vocabulary on a small CPU); a plain parse of the key-value section takes milliseconds.

_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
_NUMPY = {0: "<u1", 1: "<i1", 2: "<u2", 3: "<i2", 4: "<u4", 5: "<i4", 6: "<f4", 7: "?", 10: "<u8", 11: "<i8", 12: "<f8"}
_STRING, _ARRAY = 8, 9


@dataclass
class GGUFMetadata:
    fields: dict[str, tuple[Any, int, int | None]]  # key -> (value, value type, array item type)
    tensors: dict[str, tuple[tuple[int, ...], int, int]]  # name -> (numpy-order shape, ggml type, file offset)

    def get(self, key: str, default: Any = None) -> Any:
        return self.fields[key][0] if key in self.fields else default


def read_gguf_metadata(path: Path) -> GGUFMetadata:
    """Key-values and tensor directory of a GGUF (v2/v3, little-endian) without touching tensor data."""
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as buf:
        if buf[:4] != b"GGUF":
            raise ExportError(f"{path} is not a GGUF file")
        version, n_tensors, n_kv = struct.unpack_from("<IQQ", buf, 4)
        if version < 2:
            raise ExportError(f"{path} is GGUF v{version}; v2 or later is needed")
        pos = 24

        def string() -> str:
            nonlocal pos
            (n,) = struct.unpack_from("<Q", buf, pos)
            pos += 8 + n
            return bytes(buf[pos - n : pos]).decode("utf-8", "replace")

        def value(vtype: int) -> Any:
            nonlocal pos
            if vtype == _STRING:
                return string()
            if vtype in _SCALARS:
                (v,) = struct.unpack_from(_SCALARS[vtype], buf, pos)
                pos += struct.calcsize(_SCALARS[vtype])
                return v
            raise ExportError(f"{path}: unknown GGUF value type {vtype}")

        fields: dict[str, tuple[Any, int, int | None]] = {}
        for _ in range(n_kv):
            key = string()
            (vtype,) = struct.unpack_from("<I", buf, pos)
            pos += 4
            if vtype == _ARRAY:
                item, count = struct.unpack_from("<IQ", buf, pos)
                pos += 12
                if item in _NUMPY:  # no array may outlive the mmap: convert at once
                    dt = np.dtype(_NUMPY[item])
                    fields[key] = (np.frombuffer(buf, dtype=dt, count=count, offset=pos).tolist(), vtype, item)
                    pos += dt.itemsize * count
                else:
                    fields[key] = ([value(item) for _ in range(count)], vtype, item)
            else:
                fields[key] = (value(vtype), vtype, None)
        infos = []
        for _ in range(n_tensors):
            name = string()
            (n_dims,) = struct.unpack_from("<I", buf, pos)
            dims = struct.unpack_from(f"<{n_dims}Q", buf, pos + 4)
            ttype, offset = struct.unpack_from("<IQ", buf, pos + 4 + 8 * n_dims)
            pos += 4 + 8 * n_dims + 12
            infos.append((name, tuple(reversed(dims)), ttype, offset))
        align = int(fields.get("general.alignment", (32,))[0])
        data_start = -(-pos // align) * align
    return GGUFMetadata(fields, {n: (shape, t, data_start + off) for n, shape, t, off in infos})


def gguf_architecture(path: Path) -> str:
    arch = read_gguf_metadata(path).get(gguf.Keys.General.ARCHITECTURE)
    if arch is None:
        raise ExportError(f"{path} has no general.architecture")
    return str(arch)


def permute_qk_rows(w: np.ndarray, n_head: int) -> np.ndarray:
    """HF row order -> GGUF row order for a q/k projection (or its lora_B): (out, ...) -> (out, ...)."""
    if w.shape[0] % (2 * n_head):
        raise ExportError(f"cannot permute {w.shape[0]} rows into {n_head} heads")
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def _config(model: Any) -> Any:
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    return base.config


def _heads(config: Any) -> tuple[int, int]:
    n_head = int(config.num_attention_heads)
    return n_head, int(getattr(config, "num_key_value_heads", None) or n_head)


def _tensor_map(arch: str, n_layers: int) -> Any:
    try:
        arch_enum = next(k for k, v in gguf.MODEL_ARCH_NAMES.items() if v == arch)
    except StopIteration:
        raise ExportError(f"the gguf package does not know the architecture '{arch}'") from None
    return gguf.get_tensor_name_map(arch_enum, n_layers)


def _gguf_name(tmap: Any, hf_name: str) -> str:
    name = tmap.get_name(hf_name, try_suffixes=(".weight", ".bias"))
    if name is None:
        raise ExportError(f"no GGUF tensor corresponds to {hf_name}")
    return name


def _maybe_permute(name: str, w: np.ndarray, arch: str, n_head: int, n_kv: int, permute_qk: bool | None) -> np.ndarray:
    if not (arch in PERMUTED_ARCHES if permute_qk is None else permute_qk):
        return w
    if name.endswith("attn_q.weight"):
        return permute_qk_rows(w, n_head)
    if name.endswith("attn_k.weight"):
        return permute_qk_rows(w, n_kv)
    return w


def lora_tensors(model: Any, arch: str, permute_qk: bool | None = None) -> tuple[dict[str, np.ndarray], float]:
    """({gguf name + '.lora_a'/'.lora_b': float32 array}, alpha) of a peft model's adapter.

    `permute_qk` None follows the architecture (see the module docstring); True/False force it.
    """
    config = _config(model)
    n_head, n_kv = _heads(config)
    tmap = _tensor_map(arch, int(config.num_hidden_layers))
    pairs: dict[str, dict[str, torch.Tensor]] = {}
    for pname, p in model.named_parameters():
        m = _LORA_PARAM.match(pname)
        if m:
            pairs.setdefault(m["module"], {})[m["ab"]] = p.detach()
    if not pairs:
        raise ExportError("the policy has no LoRA parameters to export")
    scales = set()
    for module in model.modules():
        scaling = getattr(module, "scaling", None)
        if isinstance(scaling, dict) and scaling:
            scales.update(float(s) for s in scaling.values())
    if len(scales) != 1:
        raise ExportError(f"llama.cpp applies one LoRA scale per adapter; the policy has {sorted(scales)}")
    scale = scales.pop()
    out: dict[str, np.ndarray] = {}
    rank = None
    for module_name, ab in sorted(pairs.items()):
        if set(ab) != {"A", "B"}:
            raise ExportError(f"{module_name} has lora_{''.join(ab)} only")
        hf_name = module_name.removeprefix("base_model.model.") + ".weight"
        name = _gguf_name(tmap, hf_name)
        a = ab["A"].to("cpu", torch.float32).numpy()  # (r, in)
        b = ab["B"].to("cpu", torch.float32).numpy()  # (out, r)
        rank = a.shape[0]
        out[name + ".lora_a"] = np.ascontiguousarray(a)
        out[name + ".lora_b"] = np.ascontiguousarray(_maybe_permute(name, b, arch, n_head, n_kv, permute_qk))
    assert rank is not None
    return out, scale * rank  # llama.cpp scales by alpha / r: this alpha reproduces peft's scaling


def _atomic_gguf(path: Path, write: Any) -> None:
    """Write a GGUF through `write(writer_path)` to a temp file, fsync, rename."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    try:
        write(tmp)
        with open(tmp, "rb+") as f:
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()
    fsync_dir(path.parent)


def _write(writer: gguf.GGUFWriter) -> None:
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def write_adapter_gguf(path: Path, arch: str, alpha: float, tensors: dict[str, np.ndarray]) -> None:
    def write(tmp: Path) -> None:
        w = gguf.GGUFWriter(tmp, arch)
        w.add_type(gguf.GGUFType.ADAPTER)
        w.add_string(gguf.Keys.Adapter.TYPE, "lora")
        w.add_float32(gguf.Keys.Adapter.LORA_ALPHA, float(alpha))
        for name, t in tensors.items():
            w.add_tensor(name, t)
        _write(w)

    _atomic_gguf(path, write)


def lora_is_zero(model: Any) -> bool:
    """True while every lora_B is zero (peft's initial state): the adapter changes nothing."""
    return all(not bool(p.detach().any()) for n, p in model.named_parameters() if ".lora_B." in n)


def export_lora_adapter(model: Any, arch: str, path: Path, permute_qk: bool | None = None) -> None:
    """The peft adapter of `model` as a llama.cpp LoRA GGUF at `path` (atomic)."""
    tensors, alpha = lora_tensors(model, arch, permute_qk)
    write_adapter_gguf(path, arch, alpha, tensors)


# --- all weights ---------------------------------------------------------------------


def base_state_dict(model: Any) -> dict[str, torch.Tensor]:
    """HF-named weights of the model without any LoRA (peft's base_layer under its own name)."""
    out = {}
    for name, t in model.state_dict().items():
        if ".lora_" in name:
            continue
        out[name.removeprefix("base_model.model.").replace(".base_layer.", ".")] = t
    return out


def _hparams(config: Any, arch: str) -> list[tuple[str, Any, gguf.GGUFValueType]]:
    U, F = gguf.GGUFValueType.UINT32, gguf.GGUFValueType.FLOAT32
    n_head, n_kv = _heads(config)
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // n_head
    rope = getattr(config, "rope_parameters", None) or {}
    theta = getattr(config, "rope_theta", None) or rope.get("rope_theta")
    out = [
        (f"{arch}.block_count", int(config.num_hidden_layers), U),
        (f"{arch}.context_length", int(config.max_position_embeddings), U),
        (f"{arch}.embedding_length", int(config.hidden_size), U),
        (f"{arch}.feed_forward_length", int(config.intermediate_size), U),
        (f"{arch}.attention.head_count", n_head, U),
        (f"{arch}.attention.head_count_kv", n_kv, U),
        (f"{arch}.rope.dimension_count", int(head_dim), U),
        (f"{arch}.vocab_size", int(config.vocab_size), U),
        (f"{arch}.attention.layer_norm_rms_epsilon", float(config.rms_norm_eps), F),
    ]
    if theta is not None:
        out.append((f"{arch}.rope.freq_base", float(theta), F))
    return out


def export_full_gguf(model: Any, template: Path, path: Path) -> None:
    """All weights of `model` (F32) with the tokenizer and chat metadata of `template` (atomic).

    The architecture's hyper-parameters come from the model's config, so a model of another
    size than the template's (e.g. `tiny-random`) works as long as it shares the tokenizer.
    """
    config = _config(model)
    arch = HF_TO_GGUF_ARCH.get(config.model_type)
    if arch is None:
        raise ExportError(f"exporting a '{config.model_type}' model to GGUF is not supported")
    meta = read_gguf_metadata(template)
    if meta.get(gguf.Keys.General.ARCHITECTURE) != arch:
        raise ExportError(f"template {template} is '{meta.get(gguf.Keys.General.ARCHITECTURE)}', the model is '{arch}'")
    n_head, n_kv = _heads(config)
    tmap = _tensor_map(arch, int(config.num_hidden_layers))
    tied = bool(getattr(config, "tie_word_embeddings", False))
    tensors: dict[str, np.ndarray] = {}
    for hf_name, t in base_state_dict(model).items():
        if tied and hf_name == "lm_head.weight":
            continue  # llama.cpp reuses token_embd when output.weight is absent
        if hf_name.endswith("rotary_emb.inv_freq"):
            continue
        name = _gguf_name(tmap, hf_name)
        w = t.detach().to("cpu", torch.float32).numpy()
        tensors[name] = np.ascontiguousarray(_maybe_permute(name, w, arch, n_head, n_kv, None))
    hparams = _hparams(config, arch)
    overridden = {k for k, _, _ in hparams} | {
        gguf.Keys.General.ARCHITECTURE,
        gguf.Keys.General.FILE_TYPE,
        gguf.Keys.General.ALIGNMENT,
    }

    def write(tmp: Path) -> None:
        w = gguf.GGUFWriter(tmp, arch)
        for key, (value, vtype, item) in meta.fields.items():
            if key in overridden:
                continue
            w.add_key_value(key, value, gguf.GGUFValueType(vtype), None if item is None else gguf.GGUFValueType(item))
        for key, value, vtype in hparams:
            w.add_key_value(key, value, vtype)
        w.add_file_type(gguf.LlamaFileType.ALL_F32)
        for name, t in tensors.items():
            w.add_tensor(name, t)
        _write(w)

    _atomic_gguf(path, write)
