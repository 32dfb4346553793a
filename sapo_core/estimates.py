"""What a model needs here: memory and round-time estimates from its architecture numbers.

`estimate_memory(entry, config)` says what training and sampling need, part by part;
`estimate_round(entry, profile, config)` how long a round would take. catalog.py's
`choose_model` judges every catalogue model with them.

Memory: the parts (runtime, weights, the de-quantizing transient, LoRA or full-model
activations, AdamW state, the log-prob chunk, the sampler's copy and KV cache) scale with the
architecture numbers in catalog.toml; the factors below were calibrated on measured peak RSS of
the embedded model (docs/calibration.md, 'Memory estimates', has the figures and the method).
Round time: with a probe of this machine (probe.py: two real rounds of the embedded model,
cached) the estimate uses its measured tokens/s, answer and prompt lengths and per-round
overhead, scaled by parameters (and cores when the profile differs); every group counts as
trained (a node trains only groups with reward variance: the estimate errs long). Without
one, the formula below: throughput anchors measured on 2 cores (`ANCHOR_*`; docs/calibration.md,
'Round-time estimates'), scaled by parameters and cores: an estimate, and the verdicts say so.
GPUs are not measured here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from sapo_core.config import NodeConfig
from sapo_core.hardware import HardwareProfile

if TYPE_CHECKING:
    from sapo_core.probe import Probe

GB = 1e9
PROMPT_TOKENS = 128  # ReasoningGYM prompts with the chat template: median 76-89 tokens, max 98 on the default mix
RUNTIME_GB = 0.5  # python + torch + transformers + peft + hivemind + reasoning-gym + llama_cpp, measured 0.48
LORA_ACTIVATION_FACTOR = 1.8  # peak RSS growth / saved activations, LoRA step (measured: docs/calibration.md)
FULL_ACTIVATION_FACTOR = 1.1  # the same for full fine-tuning (measured)
LOAD_TRANSIENT_FACTOR = 0.8  # extra RAM while de-quantizing a GGUF, x the fp32 weights (measured)
LOGIT_COPIES = 3  # one chunk's logits, their log-softmax and its gradient, fp32
LLAMA_BUFFERS_GB = 0.04  # llama.cpp compute buffers (measured ~35 MB)
CUDA_CONTEXT_GB = 0.5  # CUDA context + allocator slack (not measured here: no GPU)
Q8_0_BYTES_PER_PARAM = 34 / 32  # Q8_0 packs 32 weights in 34 bytes
SAMPLER_COPY_BYTES_PER_PARAM = {"Q8_0": Q8_0_BYTES_PER_PARAM, "F16": 2.0}
ANCHOR_PARAMS = 134_515_008  # the embedded model
ANCHOR_CORES = 2
ANCHOR_TRAIN_TOK_S = 200.0
# F16 samples on a par with Q8_0 at 32 sequences (docs/calibration.md, 'Round-time estimates')
ANCHOR_SAMPLE_TOK_S = {"Q8_0": 205.0, "F16": 205.0, "Q4_1": 125.0, "transformers": 39.0}
# how a verdict names the formula's round time (catalog.py); the terminal display (commands/live.py)
# reads it in the node's model line and then says what this machine's rounds measured
FORMULA_BASIS = "estimate from parameters and cores"
GPU_TRAIN_SPEEDUP = 25.0  # vs 2 CPU cores; an assumption (no GPU here), deliberately modest
MPS_TRAIN_SPEEDUP = 4.0  # likewise
DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}


class ModelNumbers(Protocol):
    """What the estimates read of a model: catalog.py's `CatalogEntry` (this module imports no
    catalogue, which imports it)."""

    params: int
    layers: int
    hidden_size: int
    intermediate_size: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab_size: int
    quant: str
    size_bytes: int

    @property
    def embedded(self) -> bool: ...

    def lora_params(self, rank: int, targets: list[str] | tuple[str, ...]) -> int: ...


# --- memory -----------------------------------------------------------------------------


@dataclass(frozen=True)
class MemoryEstimate:
    micro_batch_size: int
    train: dict[str, float]  # GB on the training device, part by part
    load_transient_gb: float  # extra host RAM while the GGUF is de-quantized (first start)
    sample: dict[str, float]  # GB of the sampler (host RAM)
    disk: dict[str, float]  # GB of disk
    overlap_gb: float = 0.0  # parts of `train` never alive together (AdamW state is made after the backward)
    runtime_gb: float = RUNTIME_GB

    @property
    def train_gb(self) -> float:
        """Peak of the training step."""
        return sum(self.train.values()) - self.overlap_gb

    @property
    def sample_gb(self) -> float:
        return sum(self.sample.values())

    @property
    def disk_gb(self) -> float:
        return sum(self.disk.values())

    def placement(self, device: str) -> tuple[float, float]:
        """(host RAM GB, GPU GB) on `device`; MPS memory is the host's (unified)."""
        load_peak = self.train["weights"] + self.load_transient_gb
        if device == "cuda":
            return self.runtime_gb + load_peak + self.sample_gb, self.train_gb + CUDA_CONTEXT_GB
        return self.runtime_gb + max(self.train_gb, load_peak) + self.sample_gb, 0.0


def _saved_floats_per_token(e: ModelNumbers, lora_rank: int, n_targets: int) -> int:
    """Activations one token leaves for the backward pass, all layers (counted at 2 x 256:
    norms' inputs and outputs, q/k/v, attention output and log-sum-exp, the MLP's four
    intermediate-size tensors, the LoRA rank-r projections)."""
    q, kv = e.heads * e.head_dim, e.kv_heads * e.head_dim
    per_layer = 4 * e.hidden_size + 3 * q + 2 * kv + 4 * e.intermediate_size + e.heads + lora_rank * n_targets
    return e.layers * per_layer


def sampled_quant(e: ModelNumbers, config: NodeConfig) -> str:
    """The weight type llama.cpp samples from: the converted copy's, or the file's own."""
    q = config.sampler.quantization
    return e.quant if q == "as-is" else q.upper()


def sampled_weights_bytes(e: ModelNumbers, config: NodeConfig) -> float:
    quant = sampled_quant(e, config)
    if quant != e.quant:
        return e.params * SAMPLER_COPY_BYTES_PER_PARAM[quant]
    return float(e.size_bytes)


def estimate_memory(e: ModelNumbers, config: NodeConfig, micro_batch_size: int | None = None) -> MemoryEstimate:
    m, t, s = config.model, config.train, config.sampler
    mb = micro_batch_size or t.micro_batch_size
    nbytes = DTYPE_BYTES[m.dtype]
    seq = PROMPT_TOKENS + s.max_new_tokens
    train: dict[str, float] = {"weights": e.params * nbytes / GB}
    if m.lora:
        lora = e.lora_params(m.lora_rank, m.lora_targets)
        train["LoRA adapter, gradients, AdamW state"] = lora * nbytes * 4 / GB
        saved = _saved_floats_per_token(e, m.lora_rank, len(m.lora_targets))
        factor = LORA_ACTIVATION_FACTOR
    else:
        train["gradients"] = e.params * nbytes / GB
        train["AdamW state"] = 2 * e.params * nbytes / GB
        if t.kl_beta > 0:
            train["reference model (KL)"] = e.params * nbytes / GB
        saved = _saved_floats_per_token(e, 0, 0)
        factor = FULL_ACTIVATION_FACTOR
    if t.gradient_checkpointing:
        # a checkpointed layer keeps only its input, and one layer's activations are rebuilt at a
        # time; the others (1 - checkpoint_share of them) keep theirs
        on = round(t.checkpoint_share * e.layers)
        per_layer = saved // e.layers
        saved = on * e.hidden_size + (e.layers - on) * per_layer + (per_layer if on else 0)
    activations = factor * mb * seq * saved * nbytes / GB
    train[f"activations ({mb} x {seq} tokens{', checkpointed' if t.gradient_checkpointing else ''})"] = activations
    chunk_tokens = min(t.logit_chunk, mb * s.max_new_tokens)  # log-probs only at completion positions
    logits = LOGIT_COPIES * chunk_tokens * e.vocab_size * 4 / GB
    train[f"log-prob chunk ({chunk_tokens} x {e.vocab_size} vocab)"] = logits
    # Full fine-tuning: the step's AdamW state is allocated once the backward has freed the
    # activations (measured: docs/calibration.md, 'Memory estimates').
    overlap = 0.0 if m.lora else min(train["AdamW state"], activations + logits)

    ctx = s.group_size * seq
    kv_elems = 2 * e.layers * e.kv_heads * e.head_dim * ctx  # K and V
    if s.backend == "transformers":  # samples with the policy itself: no second copy of the weights
        sample = {f"KV cache ({s.group_size} x {seq})": kv_elems * nbytes / GB}
    else:
        sample = {
            f"GGUF weights ({sampled_quant(e, config)})": sampled_weights_bytes(e, config) / GB,
            f"KV cache f16 ({s.group_size} x {seq})": kv_elems * 2 / GB,
            "llama.cpp buffers": LLAMA_BUFFERS_GB,
        }

    disk = {"download": 0.0 if e.embedded else e.size_bytes / GB}
    if sampled_quant(e, config) != e.quant:
        disk[f"{sampled_quant(e, config)} copy for the sampler"] = sampled_weights_bytes(e, config) / GB
    disk["converted weights cache"] = e.params * nbytes / GB
    if m.lora:
        disk["checkpoint (adapter + AdamW)"] = e.lora_params(m.lora_rank, m.lora_targets) * 4 * 3 / GB
    else:
        disk["checkpoint (weights + AdamW)"] = e.params * 4 * 3 / GB
        disk["weights exported to the sampler (f16)"] = e.params * 2 / GB
    return MemoryEstimate(mb, train, LOAD_TRANSIENT_FACTOR * e.params * 4 / GB, sample, disk, overlap)


# --- round time -------------------------------------------------------------------------


@dataclass(frozen=True)
class RoundEstimate:
    sampled_tokens: int
    trained_tokens: int
    sample_tok_s: float
    train_tok_s: float
    overhead_seconds: float = 0.0  # scoring, syncing, saving (measured by a probe)
    basis: str = "formula"  # "probe": measured on this machine; "formula": anchors and parameters

    @property
    def sample_seconds(self) -> float:
        return self.sampled_tokens / self.sample_tok_s

    @property
    def train_seconds(self) -> float:
        return self.trained_tokens / self.train_tok_s

    @property
    def seconds(self) -> float:
        return self.sample_seconds + self.train_seconds + self.overhead_seconds

    @property
    def rounds_per_hour(self) -> float:
        return 3600.0 / self.seconds if self.seconds > 0 else 0.0


def estimate_round(
    e: ModelNumbers, profile: HardwareProfile, config: NodeConfig, probe: Probe | None = None
) -> RoundEstimate:
    """Seconds of one round: I x G completions sampled, (I + J) x G sequences trained K times.
    With a probe: its measured figures, scaled by parameters (and cores); without: tokens per
    second scale as cores / parameters from the measured anchors (docs/calibration.md,
    'Round-time estimates'; an estimate). Sampling counts
    on the CPU even with a GPU (the portable llama.cpp build): pessimistic."""
    if probe is not None and probe.sample_tok_s > 0 and probe.train_tok_s > 0:
        return _estimate_from_probe(e, profile, config, probe)
    s, r = config.sampler, config.round
    cores = s.threads or profile.cpu_physical.value
    scale = (ANCHOR_PARAMS / e.params) * (cores / ANCHOR_CORES)
    if s.backend == "transformers":
        sample_anchor = ANCHOR_SAMPLE_TOK_S["transformers"]
    else:
        quant = sampled_quant(e, config)
        sample_anchor = ANCHOR_SAMPLE_TOK_S.get(quant, ANCHOR_SAMPLE_TOK_S["Q4_1"])
    train_tok_s = ANCHOR_TRAIN_TOK_S * scale
    device = profile.device.value
    if device in ("cuda", "mps"):
        speedup = GPU_TRAIN_SPEEDUP if device == "cuda" else MPS_TRAIN_SPEEDUP
        train_tok_s = ANCHOR_TRAIN_TOK_S * (ANCHOR_PARAMS / e.params) * speedup
    external = r.external_groups if config.swarm.enabled else 0
    # a forward is ~1/3 of a step; checkpointing runs the checkpointed layers' forward twice
    per_step = 1 + config.train.checkpoint_share / 3 if config.train.gradient_checkpointing else 1.0
    passes = config.train.steps_per_round * per_step + (1 / 3 if config.train.kl_beta > 0 else 0)
    # packed prompts: a group's prompt is processed once, not once per completion
    prompt = PROMPT_TOKENS if config.train.pack_prompts else PROMPT_TOKENS * s.group_size
    trained = int((r.local_groups + external) * (prompt + s.group_size * s.max_new_tokens) * passes)
    return RoundEstimate(r.local_groups * s.group_size * s.max_new_tokens, trained, sample_anchor * scale, train_tok_s)


def _estimate_from_probe(e: ModelNumbers, profile: HardwareProfile, config: NodeConfig, probe: Probe) -> RoundEstimate:
    s, r, t = config.sampler, config.round, config.train
    threads = s.threads or probe.threads
    scale = (probe.params / e.params) * (min(threads, profile.cpu_physical.value) / max(1, probe.threads))
    answer = min(float(s.max_new_tokens), probe.completion_tokens)
    external = r.external_groups if config.swarm.enabled else 0
    groups = r.local_groups + external
    prompt = probe.prompt_tokens or PROMPT_TOKENS
    per_group = prompt + s.group_size * (answer + 1) if t.pack_prompts else s.group_size * (prompt + answer + 1)
    trained = int(groups * per_group * t.steps_per_round)
    train_tok_s = probe.train_tok_s * scale
    if profile.device.value in ("cuda", "mps"):
        train_tok_s *= GPU_TRAIN_SPEEDUP if profile.device.value == "cuda" else MPS_TRAIN_SPEEDUP
    # scoring and saving grow little with the model; syncing the sampler grows with the adapter
    overhead = probe.overhead_seconds * max(1.0, e.params / probe.params) ** 0.5
    return RoundEstimate(
        int(r.local_groups * s.group_size * answer), trained, probe.sample_tok_s * scale, train_tok_s, overhead, "probe"
    )


__all__ = [
    "ModelNumbers",
    "MemoryEstimate",
    "estimate_memory",
    "RoundEstimate",
    "estimate_round",
    "sampled_quant",
    "sampled_weights_bytes",
    "PROMPT_TOKENS",
    "FORMULA_BASIS",
    "GB",
]
