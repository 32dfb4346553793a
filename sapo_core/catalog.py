"""Which model fits this machine: the catalogue, and the choice over it.

`load_catalogue()` reads resources/catalog.toml (installed as the package `sapo_resources`).
`choose_model(profile, catalogue, config)` is a pure function of the estimates of each model
(estimates.py: memory part by part, round time): the largest model that fits (memory on the
training device, disk for its files) and finishes a round within `round.target_round_seconds`,
with a verdict for every other model. When memory is short at the configured micro-batch it
halves the micro-batch (memory only: gradients accumulate, the update is the same) and says so.
"""

from __future__ import annotations

import tomllib
from collections.abc import Iterator
from dataclasses import dataclass, fields
from importlib import resources
from typing import TYPE_CHECKING

from sapo_core.config import NodeConfig
from sapo_core.estimates import FORMULA_BASIS, MemoryEstimate, RoundEstimate, estimate_memory, estimate_round
from sapo_core.hardware import HardwareProfile

if TYPE_CHECKING:
    from sapo_core.probe import Probe

TINY_RANDOM = "tiny-random"  # a 2-layer test model with random weights (policy.py), not in the catalogue
RAM_BUDGET_SHARE = 0.8  # leave the owner a fifth of the RAM at least
GPU_BUDGET_SHARE = 0.9
FITS, SLOW, NO_FIT = "fits", "slow", "doesn't fit"


class CatalogError(ValueError):
    """The catalogue is malformed or a model id is unknown; the message lists the known ids."""


@dataclass(frozen=True)
class CatalogEntry:
    id: str
    title: str
    license: str
    source: str  # "embedded" (inside a Python package) or "hub"
    repo: str
    revision: str
    filename: str
    quant: str
    size_bytes: int
    sha256: str
    architecture: str  # GGUF general.architecture
    params: int
    layers: int
    hidden_size: int
    intermediate_size: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab_size: int
    tied_embeddings: bool
    qkv_bias: bool
    qk_norm: bool
    notes: str = ""
    package: str = ""  # embedded: the package whose directory holds `filename`

    @property
    def embedded(self) -> bool:
        return self.source == "embedded"

    def module_shapes(self) -> dict[str, tuple[int, int]]:
        """(in, out) features of each LoRA-targetable projection in one layer."""
        h, i, q, kv = (
            self.hidden_size,
            self.intermediate_size,
            self.heads * self.head_dim,
            self.kv_heads * self.head_dim,
        )
        return {
            "q_proj": (h, q),
            "k_proj": (h, kv),
            "v_proj": (h, kv),
            "o_proj": (q, h),
            "gate_proj": (h, i),
            "up_proj": (h, i),
            "down_proj": (i, h),
        }

    def computed_params(self) -> int:
        """Parameters implied by the architecture numbers (a check on `params`)."""
        shapes = self.module_shapes()
        q, kv = shapes["q_proj"][1], shapes["k_proj"][1]
        per_layer = sum(a * b for a, b in shapes.values()) + 2 * self.hidden_size
        per_layer += (q + 2 * kv) if self.qkv_bias else 0
        per_layer += 2 * self.head_dim if self.qk_norm else 0
        embeddings = self.vocab_size * self.hidden_size * (1 if self.tied_embeddings else 2)
        return self.layers * per_layer + self.hidden_size + embeddings

    def lora_params(self, rank: int, targets: list[str] | tuple[str, ...]) -> int:
        shapes = self.module_shapes()
        return self.layers * sum(rank * (shapes[t][0] + shapes[t][1]) for t in targets if t in shapes)


@dataclass(frozen=True)
class Catalogue:
    entries: tuple[CatalogEntry, ...]

    def __iter__(self) -> Iterator[CatalogEntry]:
        return iter(self.entries)

    def ids(self) -> list[str]:
        return [e.id for e in self.entries]

    def get(self, model_id: str) -> CatalogEntry:
        for e in self.entries:
            if e.id == model_id:
                return e
        raise CatalogError(f"model '{model_id}' is not in the catalogue; use 'auto' or one of: {', '.join(self.ids())}")

    @property
    def embedded(self) -> CatalogEntry:
        return next(e for e in self.entries if e.embedded)


def load_catalogue(text: str | None = None) -> Catalogue:
    """The catalogue from resources/catalog.toml, or from `text` (tests)."""
    if text is None:
        text = resources.files("sapo_resources").joinpath("catalog.toml").read_text(encoding="utf-8")
    data = tomllib.loads(text)
    known = {f.name for f in fields(CatalogEntry)}
    entries = []
    for n, raw in enumerate(data.get("model", []), 1):
        unknown = sorted(set(raw) - known)
        missing = sorted(
            f.name for f in fields(CatalogEntry) if f.name not in raw and f.name not in ("notes", "package")
        )
        if unknown or missing:
            raise CatalogError(f"catalogue entry {n} ({raw.get('id', '?')}): unknown keys {unknown}, missing {missing}")
        entry = CatalogEntry(**raw)
        if entry.source not in ("embedded", "hub") or (entry.embedded and not entry.package):
            raise CatalogError(f"catalogue entry {entry.id}: source must be 'hub', or 'embedded' with a package")
        entries.append(entry)
    if sum(e.embedded for e in entries) != 1 or len({e.id for e in entries}) != len(entries):
        raise CatalogError("the catalogue needs unique ids and exactly one embedded model")
    return Catalogue(tuple(sorted(entries, key=lambda e: e.params)))


# --- the choice -------------------------------------------------------------------------


@dataclass(frozen=True)
class Verdict:
    model_id: str
    status: str  # fits | slow | doesn't fit
    reason: str
    micro_batch_size: int
    memory: MemoryEstimate
    round: RoundEstimate


@dataclass(frozen=True)
class ModelChoice:
    entry: CatalogEntry
    reason: str
    micro_batch_size: int  # the configured one, or the largest smaller one that fits
    verdicts: tuple[Verdict, ...]  # every catalogue model, largest first
    warnings: tuple[str, ...] = ()
    explicit: bool = False  # named in the config rather than chosen

    def verdict(self, model_id: str) -> Verdict:
        return next(v for v in self.verdicts if v.model_id == model_id)


def ram_budget_gb(profile: HardwareProfile) -> float:
    return min(profile.ram_available_gb.value, RAM_BUDGET_SHARE * profile.ram_total_gb.value)


def judge(e: CatalogEntry, profile: HardwareProfile, config: NodeConfig, probe: Probe | None = None) -> Verdict:
    """Fit (memory at the largest workable micro-batch, disk) and speed of one model."""
    device = profile.device.value
    ram, gpu = ram_budget_gb(profile), GPU_BUDGET_SHARE * profile.gpu_memory_gb
    configured = config.train.micro_batch_size
    rnd = estimate_round(e, profile, config, probe)
    basis = (
        "measured on this machine, scaled by parameters"
        if rnd.basis == "probe"
        else f"{FORMULA_BASIS}, every answer max_new_tokens long and every group trained: "
        "it errs long; `sapo-node hardware --probe` measures this machine"
    )

    def fits(est: MemoryEstimate) -> bool:
        host, dev = est.placement(device)
        return host <= ram and (device != "cuda" or dev <= gpu)

    def needs(est: MemoryEstimate) -> str:
        host, dev = est.placement(device)
        gpu_part = f"{dev:.1f} of {gpu:.1f} GB GPU and " if device == "cuda" else ""
        return f"{gpu_part}{host:.1f} of {ram:.1f} GB RAM"

    est, mb = estimate_memory(e, config, configured), configured
    while not fits(est) and mb > 1:
        mb //= 2
        est = estimate_memory(e, config, mb)
    if not fits(est):
        return Verdict(e.id, NO_FIT, f"doesn't fit: needs {needs(est)} even at micro-batch 1", mb, est, rnd)
    at = f" at micro-batch {mb} ({configured} would need more)" if mb != configured else f" at micro-batch {mb}"
    if est.disk_gb > profile.disk_free_gb.value:
        return Verdict(
            e.id,
            NO_FIT,
            f"doesn't fit on disk: needs {est.disk_gb:.1f} GB, {profile.disk_free_gb.value:.1f} GB free",
            mb,
            est,
            rnd,
        )
    target = config.round.target_round_seconds
    if rnd.seconds > target:
        return Verdict(
            e.id,
            SLOW,
            f"slow: a round would take ~{rnd.seconds:.0f} s, target {target:.0f} s ({basis}); memory {needs(est)}{at}",
            mb,
            est,
            rnd,
        )
    return Verdict(
        e.id,
        FITS,
        f"fits: needs {needs(est)}{at}; "
        + (
            f"a round ~{rnd.seconds:.0f} s, ~{rnd.rounds_per_hour:.0f} an hour (measured, scaled)"
            if rnd.basis == "probe"
            else f"a round ~{rnd.seconds:.0f} s or less ({basis})"
        ),
        mb,
        est,
        rnd,
    )


def choose_model(
    profile: HardwareProfile, catalogue: Catalogue, config: NodeConfig, probe: Probe | None = None
) -> ModelChoice:
    """The largest model that fits and is fast enough; or the one the config names, with warnings."""
    verdicts = tuple(judge(e, profile, config, probe) for e in sorted(catalogue, key=lambda e: -e.params))
    by_id = {v.model_id: v for v in verdicts}
    if config.model.name != "auto":
        entry = catalogue.get(config.model.name)
        v = by_id[entry.id]
        warnings = () if v.status == FITS else (f"{entry.title} was asked for in the config but it {v.reason}",)
        return ModelChoice(
            entry,
            f"{entry.title}: named in the config (model.name); {v.reason}",
            v.micro_batch_size,
            verdicts,
            warnings,
            explicit=True,
        )
    for status, lead in (
        (FITS, "the largest model that fits"),
        (SLOW, "nothing is fast enough; the smallest model that fits memory"),
    ):
        ranked = [v for v in verdicts if v.status == status]
        if ranked:
            v = ranked[0] if status == FITS else ranked[-1]
            entry = catalogue.get(v.model_id)
            warnings = () if status == FITS else (f"rounds will be slower than the target: {v.reason}",)
            detail = v.reason.split(": ", 1)[1]
            return ModelChoice(entry, f"{entry.title}, {lead}: {detail}", v.micro_batch_size, verdicts, warnings)
    entry = catalogue.embedded
    v = by_id[entry.id]
    return ModelChoice(
        entry,
        f"{entry.title}: nothing fits; falling back to the embedded model",
        v.micro_batch_size,
        verdicts,
        (f"the embedded model {v.reason}; expect swapping or an out-of-memory stop",),
    )


__all__ = [
    "CatalogEntry",
    "Catalogue",
    "CatalogError",
    "load_catalogue",
    "Verdict",
    "ModelChoice",
    "judge",
    "choose_model",
    "ram_budget_gb",
    "FITS",
    "SLOW",
    "NO_FIT",
    "TINY_RANDOM",
]
