"""Node configuration: one frozen dataclass per concern, nested in `NodeConfig`.

Every field has a default and a help string (in `field(metadata={"help": ...})`);
`__post_init__` rejects nonsense with a message saying what to change. The user's
config is a TOML file whose tables mirror the dataclasses (`[train]`, `[round]`, ...);
`load_config` reports unknown keys and wrong types by their dotted name.

The `[swarm]` table, the largest, is `SwarmConfig` in `sapo_core.config_swarm`, and `[control]`
(the power rules) is `ControlConfig` in `sapo_core.config_control`; how fields are declared,
checked and read from TOML (`ConfigError` among it) is `sapo_core.config_schema`. All three are
re-exported here, so callers import every config name from this module.

This module imports only the standard library (and tomli_w to write), so the GUI and
the control protocol can use it without pulling in torch.
"""

from __future__ import annotations

import dataclasses
import os
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sapo_core.config_control import ControlConfig
from sapo_core.config_schema import ConfigError, build, check, merge, read_toml, setting, undot
from sapo_core.config_swarm import SwarmConfig

# The paper's nine ReasoningGYM specialties (SAPO §4). A weight of 0 disables one.
PAPER_SPECIALTIES = (
    "base_conversion",
    "basic_arithmetic",
    "arc_1d",
    "bf",
    "propositional_logic",
    "fraction_simplification",
    "decimal_arithmetic",
    "calendar_arithmetic",
    "binary_matrix",
)

# A small model learns nothing from tasks it never solves: these three are the ones the embedded
# model sometimes solves on easy levels, and it solves none of the other six
# (docs/calibration.md, 'Default task mix and prompt'; re-measure with `sapo-bench tasks`).
DEFAULT_TASK_WEIGHTS = {
    "basic_arithmetic": 1.0,
    "fraction_simplification": 1.0,
    "calendar_arithmetic": 1.0,
}


@dataclass(frozen=True)
class ModelConfig:
    name: str = setting("Catalogue id of the model to train, or 'auto' to pick the largest that fits.", "auto")
    gguf_path: str = setting("Use this GGUF file instead of the catalogue's (advanced).", "")
    lora: bool = setting("Train a LoRA adapter (true) or all weights (false).", True)
    lora_rank: int = setting("LoRA rank r.", 16)
    lora_alpha: float = setting("LoRA alpha (scale = alpha / r).", 32.0)
    lora_targets: list = setting(
        "Module names LoRA adapts.",
        ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"],
    )
    dtype: str = setting("Training dtype: float32 (CPU default) or bfloat16 (GPU).", "float32")

    def __post_init__(self) -> None:
        check(self.lora_rank >= 1, "model.lora_rank", "must be at least 1")
        check(self.lora_alpha > 0, "model.lora_alpha", "must be positive")
        check(
            self.dtype in ("float32", "bfloat16", "float16"),
            "model.dtype",
            f"'{self.dtype}' is not one of float32, bfloat16, float16",
        )
        check(len(self.lora_targets) > 0, "model.lora_targets", "name at least one module")


# Difficulty levels every dataset has, easiest first (the configs are tasks.LEVELS).
LEVEL_NAMES = ("easy", "medium", "hard")
# Prompt styles of tasks.PROMPTS (named here so the config can be checked without it).
PROMPT_STYLES = ("answer_line", "one_shot", "plain", "tags", "worked")


@dataclass(frozen=True)
class TaskConfig:
    weights: dict = setting(
        "ReasoningGYM dataset -> sampling weight. The paper's nine: " + ", ".join(PAPER_SPECIALTIES),
        DEFAULT_TASK_WEIGHTS,
    )
    difficulty: str = setting(
        "Level each dataset starts at, and the lowest the curriculum goes: 'easy' (SmolLM2-135M "
        "sometimes solves it), 'medium' or 'hard' (about ReasoningGYM's own settings).",
        "easy",
    )
    levels: dict = setting("Start level per dataset, overriding 'difficulty', e.g. {bf = 'medium'}.", {})
    curriculum: bool = setting(
        "Raise a dataset's level when the model masters it; fall back when its accuracy collapses.", True
    )
    curriculum_window: int = setting(
        "Own completions per dataset the rolling accuracy covers; a level changes only on a full window.", 64
    )
    curriculum_rule: str = setting(
        "'step': a dataset sits on one level, raised at curriculum_raise, lowered at curriculum_lower. 'band': "
        "each question draws its level in proportion to how often that level's recent groups had reward spread "
        "(the next level unlocks at curriculum_raise; levels without spread are only probed): the round goes "
        "where there is something to learn (sapo_core/curriculum.py).",
        "step",
    )
    curriculum_raise: float = setting("Rolling accuracy (share fully right) at which a dataset's level rises.", 0.5)
    curriculum_lower: float = setting("Rolling accuracy at or below which a raised level falls back.", 0.02)
    prompt: str = setting(
        "How questions are asked: 'worked' (a solved example of the same dataset and level, then the "
        "question; asks for a final 'Answer: ...' line; the example's answer shows its working where the "
        "question's expression is that working: '9 - 8 = 1' above 'Answer: 1' in basic_arithmetic), "
        "'one_shot' (the same example with its answer alone), 'answer_line' (without the example), 'plain' "
        "(the question only) or 'tags' (<answer> tags).",
        "worked",
    )
    partial_credit: bool = setting(
        "Train on ReasoningGYM's partial credit (e.g. 0.1 for any wrong weekday, 0.5 for '13' when the answer is "
        "'3') instead of correctness (1 right, 0 wrong). Off: partial credit divided by a group's small std "
        "weighs as much as a right answer (docs/environment.md, 'ReasoningGYM').",
        False,
    )
    format_reward: float = setting(
        "Weight of a reward for answering in the requested format (the paper dropped it).", 0.0
    )
    system_prompt: str = setting("System prompt; empty leaves the model's chat template to its default.", "")
    reask_share: float = setting(
        "Share of a round's own questions asked again from its recent ones whose groups had reward spread "
        "(ExGRPO's replay of medium questions, sampled anew; 0 = off; sapo_core/reask.py).",
        0.0,
    )

    def __post_init__(self) -> None:
        check(bool(self.weights), "tasks.weights", "name at least one dataset")
        for name, w in self.weights.items():
            check(
                name in PAPER_SPECIALTIES,
                f"tasks.weights.{name}",
                "is not a known dataset; use one of " + ", ".join(PAPER_SPECIALTIES),
            )
            check(
                isinstance(w, (int, float)) and not isinstance(w, bool) and w >= 0,
                f"tasks.weights.{name}",
                "must be a number >= 0",
            )
        check(sum(self.weights.values()) > 0, "tasks.weights", "at least one weight must be above 0")
        check(
            self.difficulty in LEVEL_NAMES,
            "tasks.difficulty",
            f"'{self.difficulty}' is not one of " + ", ".join(LEVEL_NAMES),
        )
        for name, level in self.levels.items():
            check(name in PAPER_SPECIALTIES, f"tasks.levels.{name}", "is not a known dataset")
            check(level in LEVEL_NAMES, f"tasks.levels.{name}", f"'{level}' is not one of " + ", ".join(LEVEL_NAMES))
        check(self.curriculum_window >= 1, "tasks.curriculum_window", "must be at least 1")
        check(self.curriculum_rule in ("step", "band"), "tasks.curriculum_rule", "must be step or band")
        check(
            0 <= self.curriculum_lower < self.curriculum_raise <= 1,
            "tasks.curriculum_lower",
            "need 0 <= curriculum_lower < curriculum_raise <= 1",
        )
        check(
            self.prompt in PROMPT_STYLES, "tasks.prompt", f"'{self.prompt}' is not one of " + ", ".join(PROMPT_STYLES)
        )
        check(0 <= self.format_reward <= 1, "tasks.format_reward", "must be between 0 and 1")
        check(0 <= self.reask_share <= 1, "tasks.reask_share", "must be between 0 and 1")


@dataclass(frozen=True)
class SamplerConfig:
    backend: str = setting("'auto' (llama.cpp where it works), 'llamacpp' or 'transformers'.", "auto")
    group_size: int = setting("Completions per question, G.", 8)
    max_new_tokens: int = setting("Longest completion, in tokens.", 128)
    temperature: float = setting("Sampling temperature.", 1.0)
    top_p: float = setting("Nucleus sampling threshold (1 = off).", 1.0)
    quantization: str = setting(
        "Weights llama.cpp samples from: 'f16' (the trainer's own weights: log-probs within 0.002 nats of "
        "the trainer's), 'q8_0' (half the memory, ~0.06 nats off) or 'as-is'.",
        "f16",
    )
    threads: int = setting(
        "Threads for sampling and training; 0 = chosen from what the CPU has free (within "
        "control.max_cpus_percent and control.leave_cores), and adapted while running.",
        0,
    )

    def __post_init__(self) -> None:
        check(
            self.backend in ("auto", "llamacpp", "transformers"),
            "sampler.backend",
            f"'{self.backend}' is not auto, llamacpp or transformers",
        )
        check(2 <= self.group_size <= 64, "sampler.group_size", "must be 2..64 (GRPO needs at least 2)")
        check(1 <= self.max_new_tokens <= 4096, "sampler.max_new_tokens", "must be 1..4096")
        check(0 < self.temperature <= 2, "sampler.temperature", "must be in (0, 2]")
        check(0 < self.top_p <= 1, "sampler.top_p", "must be in (0, 1]")
        check(self.quantization in ("f16", "q8_0", "as-is"), "sampler.quantization", "must be 'f16', 'q8_0' or 'as-is'")
        check(self.threads >= 0, "sampler.threads", "must be >= 0")


@dataclass(frozen=True)
class TrainConfig:
    learning_rate: float = setting("Adam learning rate.", 5e-5)
    steps_per_round: int = setting("Optimizer steps per round over the round's batch, K (>1 lets clipping act).", 2)
    micro_batch_size: int = setting("Sequences per forward/backward pass (memory bound).", 2)
    gradient_checkpointing: bool = setting(
        "Recompute each layer's activations in the backward pass: ~1/3 more compute, a fraction of the "
        "memory (docs/calibration.md, 'Memory estimates').",
        True,
    )
    checkpoint_share: float = setting(
        "With gradient_checkpointing: the share of the transformer's layers recomputed in the backward "
        "(spread evenly; 1 = all, the least memory; 0.5 about half the extra compute for ~0.2 GB more).",
        0.5,
    )
    device: str = setting(
        "Where the update runs: auto (a CUDA GPU where torch sees one, SAPO_DEVICE overrides; else the "
        "CPU), cpu or cuda.",
        "auto",
    )
    precision: str = setting(
        "Number format of the update's matmuls: auto (bf16 autocast where the CPU or GPU has native bf16, "
        "else fp32), fp32 or bf16. LoRA weights, optimizer state and log-probs stay fp32.",
        "auto",
    )
    epsilon_low: float = setting("Lower clip of the importance ratio, 1 - eps_low (paper: 0.2).", 0.2)
    epsilon_high: float = setting("Upper clip of the importance ratio, 1 + eps_high (paper: 0.28).", 0.28)
    kl_beta: float = setting("Weight of the KL penalty to the base model (paper: 0).", 0.0)
    max_grad_norm: float = setting("Gradient norm clip (0 = off).", 1.0)
    weight_decay: float = setting("AdamW weight decay.", 0.0)
    logit_chunk: int = setting("Tokens per chunk when computing log-probs over the vocabulary.", 256)
    pack_prompts: bool = setting(
        "Process each group's prompt once per micro-batch, its completions attending to that one copy "
        "(a block attention mask): the same log-probs as one row per completion, several times fewer "
        "tokens when answers are short next to the prompt.",
        True,
    )
    prompt_grad: bool = setting(
        "Backpropagate through the prompt (true: the exact gradient) or run each group's prompt once per "
        "step without gradient, its keys and values reused by the completions (false: the same log-probs, "
        "fewer tokens through the backward; the gradient through the prompt's keys and values is left out).",
        True,
    )
    trained_layers: int = setting(
        "Train the top N of the transformer's layers only (0 = every layer): the backward stops below them, "
        "the layers beneath keep their weights (a new LoRA adapter's are zero), a cheaper update whose "
        "gradient leaves the lower layers out.",
        0,
    )
    advantage_scale: str = setting(
        "What a group's centred rewards are divided by: group (its own std, GRPO and the SAPO paper), batch "
        "(the std of every reward of the round's own groups pooled, Lite PPO, arXiv 2508.08221; peers' groups "
        "take that scale too) or none (no division, Dr. GRPO, arXiv 2503.20783).",
        "group",
    )
    loss_mean: str = setting(
        "How the round's token losses are averaged: token (every completion token of the round weighs the "
        "same, DAPO, arXiv 2503.14476) or sequence (each completion's tokens averaged, then the completions: "
        "GRPO as published, a short completion's tokens weigh more).",
        "token",
    )
    guide_gamma: float = setting(
        "With swarm.take = mixed: the gamma of LUFFY's policy shaping p / (p + gamma) on the tokens of a peer's "
        "right answer added to our own all-wrong group (arXiv 2504.14945 uses 0.1).",
        0.1,
    )
    reference_guide: bool = setting(
        "Where none of our own completions to a question is right, its reference answer (written as the "
        "prompt's example writes one) joins the group as a guide, its tokens shaped as guide_gamma says: "
        "a group that would teach nothing trains (hints where the learner fails, arXiv 2506.13923).",
        False,
    )
    guide_alone: bool = setting(
        "A guided group (a right answer added to our all-wrong group) trains its guide alone, at its advantage "
        "in the group, our completions left out: fine-tuning on what we fail (ReLIFT, arXiv 2506.07527).",
        False,
    )
    peer_correction: str = setting(
        "Off-policy correction of peers' completions: none (trained as if ours, the SAPO paper) or tis "
        "(F-TIS: each peer token weighted by min(our prob / the peer sampler's, peer_ratio_cap), and "
        "negative-advantage peer completions further than peer_kl_max from our policy left out).",
        "none",
    )
    peer_ratio_cap: float = setting("With peer_correction = tis: the truncation C of a peer token's weight.", 2.0)
    peer_kl_max: float = setting(
        "With peer_correction = tis: a negative-advantage peer completion whose estimated KL from our "
        "policy (nats per token, the k3 estimator) exceeds this is not trained on.",
        0.5,
    )

    def __post_init__(self) -> None:
        check(0 < self.learning_rate < 1, "train.learning_rate", "must be in (0, 1)")
        check(self.steps_per_round >= 1, "train.steps_per_round", "must be at least 1")
        check(self.micro_batch_size >= 1, "train.micro_batch_size", "must be at least 1")
        check(0 <= self.epsilon_low < 1, "train.epsilon_low", "must be in [0, 1)")
        check(self.epsilon_high >= 0, "train.epsilon_high", "must be >= 0")
        check(self.kl_beta >= 0, "train.kl_beta", "must be >= 0")
        check(self.max_grad_norm >= 0, "train.max_grad_norm", "must be >= 0")
        check(self.logit_chunk >= 16, "train.logit_chunk", "must be at least 16")
        check(0 <= self.checkpoint_share <= 1, "train.checkpoint_share", "must be in [0, 1]")
        check(self.trained_layers >= 0, "train.trained_layers", "must be >= 0 (0 = every layer)")
        check(self.precision in ("auto", "fp32", "bf16"), "train.precision", "must be auto, fp32 or bf16")
        check(self.device in ("auto", "cpu", "cuda"), "train.device", "must be auto, cpu or cuda")
        check(
            self.advantage_scale in ("group", "batch", "none"), "train.advantage_scale", "must be group, batch or none"
        )
        check(self.loss_mean in ("token", "sequence"), "train.loss_mean", "must be token or sequence")
        check(self.peer_correction in ("none", "tis"), "train.peer_correction", "must be none or tis")
        check(self.peer_ratio_cap >= 1, "train.peer_ratio_cap", "must be at least 1")
        check(self.peer_kl_max > 0, "train.peer_kl_max", "must be positive")
        check(0 < self.guide_gamma <= 10, "train.guide_gamma", "must be in (0, 10]")


@dataclass(frozen=True)
class RoundConfig:
    local_groups: int = setting("Own question groups per round, I (paper's best: 4).", 4)
    external_groups: int = setting("Groups taken from peers per round, J (paper's best: 4; 0 = train alone).", 4)
    auto_scale: bool = setting("Shrink I, J and G where this machine cannot finish a round in time.", True)
    target_round_seconds: float = setting("Round length auto_scale aims for.", 240.0)
    max_rounds: int = setting("Stop after this many rounds in total (0 = run until stopped).", 0)
    refill_passes: int = setting(
        "Dynamic sampling (DAPO): while fewer than I of our groups have reward spread, draw as many new "
        "questions as are missing, at most this many times a round (0 = off). Groups without spread teach "
        "nothing; this fills the update with ones that do, at the cost of more sampling.",
        0,
    )

    def __post_init__(self) -> None:
        check(self.local_groups >= 1, "round.local_groups", "must be at least 1")
        check(self.external_groups >= 0, "round.external_groups", "must be >= 0")
        check(self.target_round_seconds > 0, "round.target_round_seconds", "must be positive")
        check(self.max_rounds >= 0, "round.max_rounds", "must be >= 0")
        check(0 <= self.refill_passes <= 8, "round.refill_passes", "must be 0..8")


@dataclass(frozen=True)
class EvalConfig:
    enabled: bool = setting(
        "Measure the policy on held-out questions (never trained on) against the base model: before the first "
        "round, every eval.every_rounds rounds (within eval.max_share) and after the last round of a run of set "
        "length.",
        True,
    )
    every_rounds: int = setting(
        "Held-out evaluations fall on rounds that are multiples of this (0 = only before the first round and at "
        "the end), when eval.max_share allows. One evaluation takes several rounds' time "
        "(docs/calibration.md, 'Held-out evaluation schedule').",
        70,
    )
    max_share: float = setting(
        "Most of the node's time evaluation may take: a due evaluation is skipped (to the next multiple of "
        "every_rounds) until the rounds since the last one took (1 - share) / share times as long as it did "
        "(docs/calibration.md, 'Held-out evaluation schedule').",
        0.1,
    )
    questions: int = setting(
        "Held-out questions per dataset and level (training skips every one of them; at most 512).", 32
    )
    level_questions: int = setting(
        "Held-out questions per dataset at each level above the start level, for the all-levels figure "
        "(eval/capability: what the model can do at every level, not only where it started); 0 = none. "
        "At most eval.questions of them are used: training skips the first eval.questions of every level.",
        16,
    )
    samples: int = setting("Completions per held-out question at eval.temperature, k.", 4)
    greedy: bool = setting("Also one greedy completion per question (eval/greedy_solve_rate).", True)
    max_new_tokens: int = setting(
        "Longest held-out completion, in tokens; 0 = sampler.max_new_tokens. sapo-experiment sets it to its "
        "--max-new-tokens, so an arm that changes the training length is measured as the others are.",
        0,
    )
    temperature: float = setting(
        "Held-out sampling temperature; 0 = sampler.temperature. sapo-experiment sets it to the default "
        "sampler.temperature, so an arm that changes the training temperature is measured as the others are.",
        0.0,
    )

    def __post_init__(self) -> None:
        check(self.every_rounds >= 0, "eval.every_rounds", "must be >= 0")
        check(0 < self.max_share <= 1, "eval.max_share", "must be in (0, 1]")
        check(1 <= self.questions <= 512, "eval.questions", "must be 1..512")
        check(0 <= self.level_questions <= 512, "eval.level_questions", "must be 0..512")
        check(1 <= self.samples <= 64, "eval.samples", "must be 1..64")
        check(0 <= self.max_new_tokens <= 4096, "eval.max_new_tokens", "must be 0..4096 (0: the sampler's)")
        check(0 <= self.temperature <= 2, "eval.temperature", "must be in [0, 2] (0: the sampler's)")


@dataclass(frozen=True)
class NodeConfig:
    run_dir: str = setting("Directory holding this run's store, checkpoints and config snapshot.", "")
    seed: int = setting("Seed of everything random in this node.", 0)
    model: ModelConfig = field(default_factory=ModelConfig, metadata={"help": "The model."})
    tasks: TaskConfig = field(default_factory=TaskConfig, metadata={"help": "Questions and rewards."})
    sampler: SamplerConfig = field(default_factory=SamplerConfig, metadata={"help": "Rollout generation."})
    train: TrainConfig = field(default_factory=TrainConfig, metadata={"help": "The GRPO update."})
    round: RoundConfig = field(default_factory=RoundConfig, metadata={"help": "What a round holds."})
    swarm: SwarmConfig = field(default_factory=SwarmConfig, metadata={"help": "Sharing with peers."})
    control: ControlConfig = field(default_factory=ControlConfig, metadata={"help": "The volunteer's limits."})
    eval: EvalConfig = field(default_factory=EvalConfig, metadata={"help": "Held-out evaluation."})

    def replace(self, **changes: Any) -> NodeConfig:
        """Copy with changes; nested ones as dotted keys: replace(**{"train.learning_rate": 1e-4})."""
        return from_dict(merge(to_dict(self), undot(changes)))


# --- dict / TOML conversion -------------------------------------------------------------


def to_dict(cfg: Any) -> dict:
    return dataclasses.asdict(cfg)


def from_dict(data: Mapping[str, Any]) -> NodeConfig:
    return build(NodeConfig, data)


def load_config(path: str | os.PathLike) -> NodeConfig:
    """Read a TOML config; a missing file is an error (say which), a broken one names the line."""
    return from_dict(read_toml(path))


def dump_config(cfg: NodeConfig) -> str:
    import tomli_w

    return tomli_w.dumps(to_dict(cfg))


def save_config(cfg: NodeConfig, path: str | os.PathLike) -> None:
    """Write atomically (temp file, fsync, rename) so a crash never leaves half a config."""
    from sapo_core.fsutil import atomic_write_bytes

    atomic_write_bytes(Path(path), dump_config(cfg).encode("utf-8"))


def field_help(cls: type = NodeConfig, prefix: str = "") -> dict[str, str]:
    """Dotted key -> help string, for `--help` texts and the GUI's tooltips."""
    out: dict[str, str] = {}
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        if dataclasses.is_dataclass(hints[f.name]):
            out.update(field_help(hints[f.name], f"{prefix}{f.name}."))
        else:
            out[prefix + f.name] = f.metadata.get("help", "")
    return out


__all__ = [
    "ConfigError",
    "ModelConfig",
    "TaskConfig",
    "SamplerConfig",
    "TrainConfig",
    "RoundConfig",
    "SwarmConfig",
    "ControlConfig",
    "EvalConfig",
    "NodeConfig",
    "load_config",
    "save_config",
    "dump_config",
    "from_dict",
    "to_dict",
    "field_help",
    "PAPER_SPECIALTIES",
    "DEFAULT_TASK_WEIGHTS",
    "LEVEL_NAMES",
    "PROMPT_STYLES",
]
