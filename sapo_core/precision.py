"""Which number format the GRPO update computes in: bf16 where the hardware has it natively.

A LoRA forward + backward of the embedded model under bf16 autocast ran 1.4-1.8x the fp32 speed
on this project's AVX-512 BF16 CPU (README, `sapo-bench training`). Autocast keeps what must stay
exact in fp32: the trainable LoRA weights and AdamW state (master weights), the norms, and the
log-probs and loss (the trainer casts the hidden states to fp32 before the output head). Matmuls
in bf16 move the trainer's log-probs ~0.03 nats/token from fp32's, inside the 0.05 the sampler
may drift (`sapo_core/sampler/resilient.py`).

Where bf16 is not native (most desktop x86 before 2023: AVX2 only; Apple M1), oneDNN emulates
it by converting back and forth, slower than fp32, so `auto` keeps fp32 there.
"""

from __future__ import annotations

import contextlib
import logging
import os
import platform
import subprocess
from dataclasses import dataclass

import torch

from sapo_core.cpu import cpu_flags

log = logging.getLogger(__name__)

PRECISIONS = ("auto", "fp32", "bf16")


@dataclass(frozen=True)
class Precision:
    autocast: torch.dtype | None  # None: fp32 throughout
    why: str

    @property
    def name(self) -> str:
        return "bf16" if self.autocast is torch.bfloat16 else "fp32"

    def context(self, device_type: str) -> contextlib.AbstractContextManager:
        if self.autocast is None:
            return contextlib.nullcontext()
        return torch.autocast(device_type, dtype=self.autocast)


def cpu_bf16_feature() -> str | None:
    """The CPU feature that makes bf16 native here ('avx512_bf16', 'amx_bf16', 'bf16' on Arm), or None.

    SAPO_CPU_BF16=0 says there is none (with ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2 this
    machine then runs as an AVX2-only desktop would); =1 says there is."""
    forced = os.environ.get("SAPO_CPU_BF16", "").strip()
    if forced in ("0", "1"):
        return "bf16 (SAPO_CPU_BF16=1)" if forced == "1" else None
    cpu = getattr(torch, "cpu", None)
    for name, probe in (("amx_bf16", "_is_amx_tile_supported"), ("avx512_bf16", "_is_avx512_bf16_supported")):
        check = getattr(cpu, probe, None)
        if check is not None:
            try:
                if check():
                    return name
            except RuntimeError:
                pass
    if platform.system() == "Darwin":
        try:
            out = subprocess.run(
                ["sysctl", "-n", "hw.optional.arm.FEAT_BF16"], capture_output=True, text=True, timeout=5
            ).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            return None
        return "bf16" if out == "1" else None
    flags = cpu_flags() or set()
    return next((name for name in ("amx_bf16", "avx512_bf16", "bf16") if name in flags), None)


def resolve_precision(setting: str, device_type: str = "cpu") -> Precision:
    """`train.precision` (auto | fp32 | bf16) on this machine's device."""
    if setting == "fp32":
        return Precision(None, "fp32 (train.precision)")
    if device_type == "cuda":
        native = torch.cuda.is_available() and torch.cuda.is_bf16_supported()
        feature = "the GPU supports bf16" if native else None
    elif device_type == "cpu":
        found = cpu_bf16_feature()
        feature = f"the CPU has {found}" if found else None
    else:  # mps: autocast support varies by macOS version; fp32 is what has been measured
        feature = None
    if setting == "bf16":
        if feature is None:
            log.warning("train.precision = bf16 on a %s without native bf16: expect it slower than fp32", device_type)
        return Precision(torch.bfloat16, "bf16 (train.precision)")
    if feature is not None:
        return Precision(torch.bfloat16, f"bf16 autocast: {feature}")
    return Precision(None, f"fp32: no native bf16 on this {device_type}")


__all__ = ["PRECISIONS", "Precision", "cpu_bf16_feature", "resolve_precision"]
