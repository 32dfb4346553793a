"""Take the trained model elsewhere: GGUF (merged, F16/Q8_0), Ollama, Hugging Face, PEFT adapter.

`sapo-node export` reads a run directory (its config snapshot, a checkpoint, the run store),
rebuilds the policy the node trained and writes one of four formats into an output folder,
always with a model card (README.md):

- `gguf`:   the LoRA merged into the base weights, one GGUF file (F16 or Q8_0) that llama.cpp,
            LM Studio and Ollama load. F16 by default: it is the model as trained (its log-probs
            0.003 nats/token from the trainer's); Q8_0 is half the size and ~0.07 away. Written
            as F32 by `lora_gguf.export_full_gguf` (the same code that feeds the node's own
            sampler), then converted by llama.cpp's `llama_model_quantize`
            (`llamacpp_engine.quantize`); nothing here writes GGUF itself.
- `ollama`: the same GGUF plus a `Modelfile` (chat template, system prompt, stop tokens,
            sampling parameters): `ollama create NAME -f Modelfile`.
- `hf`:     the merged model as a Hugging Face folder (safetensors, config, tokenizer,
            generation config) for `AutoModelForCausalLM.from_pretrained`.
- `peft`:   the bare adapter for `PeftModel.from_pretrained(base, folder)`; the base model is
            named in the model card (the adapter alone is small and keeps the licence question
            with the base model).

Progress is reported through a callback `(fraction, step)` so the CLI and the app can show it.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sapo_core import paths
from sapo_core.checkpoint import CheckpointError, Checkpoints
from sapo_core.config import NodeConfig, dump_config, load_config
from sapo_core.contributions import contribution_totals, from_peers_words, held_out_summary
from sapo_core.store import STORE_NAME, RunStore, StoreError

FORMATS = ("gguf", "ollama", "hf", "peft")
QUANTS = ("f16", "q8_0")
Progress = Callable[[float, str], None]


class ExportFailed(RuntimeError):
    """The run cannot be exported; the message says what is missing and what to do."""


@dataclass(frozen=True)
class ExportRequest:
    run_dir: Path = field(metadata={"help": "The run directory (store, checkpoints, config.toml)."})
    output: Path = field(metadata={"help": "Folder to write into (created; must be empty if it exists)."})
    format: str = field(default="gguf", metadata={"help": f"One of {', '.join(FORMATS)}."})
    quant: str = field(default="f16", metadata={"help": f"GGUF weights: {' or '.join(QUANTS)}."})
    round: int | None = field(default=None, metadata={"help": "Checkpoint round (default: the newest)."})
    threads: int = field(default=0, metadata={"help": "Threads for quantizing (0: all physical cores)."})

    def __post_init__(self) -> None:
        if self.format not in FORMATS:
            raise ExportFailed(f"--format {self.format}: choose one of {', '.join(FORMATS)}")
        if self.quant not in QUANTS:
            raise ExportFailed(f"--quant {self.quant}: choose one of {', '.join(QUANTS)}")
        if self.round is not None and self.round < 1:
            raise ExportFailed(f"--round {self.round}: rounds start at 1")
        if self.output.exists() and (not self.output.is_dir() or any(self.output.iterdir())):
            raise ExportFailed(f"{self.output} exists and is not an empty folder; choose a new --output")


@dataclass
class Trained:
    """A run's policy with its checkpoint loaded, and what the model card needs."""

    policy: Any  # sapo_core.policy.Policy
    cfg: NodeConfig
    round: int
    template_gguf: Path  # the GGUF whose tokenizer/chat metadata the merged GGUF carries
    license: str
    title: str


def _checkpoint_dir(run_dir: Path, round: int | None) -> Path:
    ckpts = run_dir / "checkpoints"
    if round is not None:
        d = ckpts / f"round-{round:06d}"
        if not (d / "state.json").is_file():
            kept = sorted(p.name.removeprefix("round-").lstrip("0") for p in ckpts.glob("round-*") if p.is_dir())
            raise ExportFailed(f"no checkpoint of round {round} in {run_dir} (kept: {', '.join(kept) or 'none'})")
        return d
    if not Checkpoints(run_dir).exists():
        raise ExportFailed(f"{run_dir} has no checkpoint yet: let the node finish a round first")
    latest = ckpts / "LATEST"
    if latest.is_file() and (ckpts / latest.read_text(encoding="utf-8").strip() / "state.json").is_file():
        return ckpts / latest.read_text(encoding="utf-8").strip()
    return sorted(p for p in ckpts.glob("round-*") if (p / "state.json").is_file())[-1]


def load_trained(run_dir: Path, round: int | None = None, download: Any = None) -> Trained:
    """The policy of `run_dir` at `round` (default: newest checkpoint). Raises ExportFailed.
    `download` hears a base model fetched first (modelfiles.Progress, e.g.
    `downloads.terminal_download`)."""
    from safetensors.torch import load_file

    from sapo_core.catalog import CatalogError, load_catalogue
    from sapo_core.modelfiles import ModelUnavailable, embedded_gguf_path, resolve_model_file
    from sapo_core.policy import TINY_RANDOM, ModelLoadError, load_policy

    run_dir = Path(run_dir).expanduser()
    if not (run_dir / "config.toml").is_file():
        raise ExportFailed(f"{run_dir} is not a run directory (no config.toml); give --run-dir")
    cfg = load_config(run_dir / "config.toml")
    where = _checkpoint_dir(run_dir, round)
    state = json.loads((where / "state.json").read_text(encoding="utf-8"))
    model_id = state["model_id"]
    catalogue = load_catalogue()
    license, title = "see the base model", model_id
    try:
        if cfg.model.gguf_path:
            gguf, tok_gguf = Path(cfg.model.gguf_path).expanduser(), None
            template = gguf
        elif model_id == TINY_RANDOM:
            gguf, tok_gguf = None, embedded_gguf_path(catalogue)
            template = tok_gguf
        else:
            entry = catalogue.get(model_id)
            gguf, tok_gguf = resolve_model_file(entry, progress=download), None
            template, license, title = gguf, entry.license, entry.title
        policy = load_policy(
            cfg.model, gguf, paths.converted_models_dir(), seed=cfg.seed, tokenizer_gguf=tok_gguf, model_id=model_id
        )
        policy.load_trainable_state_dict(load_file(str(where / "trainable.safetensors")))
    except (CatalogError, ModelUnavailable, ModelLoadError, OSError) as e:
        raise ExportFailed(f"cannot rebuild the model of {run_dir}: {e}") from e
    policy.model.eval()
    return Trained(policy, cfg, int(state["round"]), Path(template), license, title)


def merged_model(policy: Any) -> Any:
    """The base model with the LoRA folded into its weights (W + alpha/r B A); a copy."""
    import copy

    model = copy.deepcopy(policy.model)
    if policy.lora:
        model = model.merge_and_unload()
    model.config.use_cache = True
    return model


# --- the formats -------------------------------------------------------------------------------------------------


def write_gguf(trained: Trained, out: Path, quant: str, threads: int, progress: Progress) -> Path:
    from sapo_core.cpu import physical_cores
    from sapo_core.sampler.llamacpp_engine import quantize
    from sapo_core.sampler.lora_gguf import ExportError, export_full_gguf

    name = re.sub(r"[^A-Za-z0-9._-]+", "-", trained.policy.model_id)
    target = out / f"{name}-sapo-r{trained.round}.{quant}.gguf"
    f32 = out / f".{name}.f32.gguf.tmp"
    progress(0.2, "merging the adapter into the weights")
    model = merged_model(trained.policy)
    progress(0.35, "writing the merged model (F32)")
    try:
        export_full_gguf(model, trained.template_gguf, f32)
        progress(0.6, f"converting to {quant.upper()} with llama.cpp")
        quantize(str(f32), str(target), quant, threads or physical_cores())
    except (ExportError, RuntimeError, OSError) as e:
        raise ExportFailed(f"could not write the GGUF: {e}") from e
    finally:
        f32.unlink(missing_ok=True)
    return target


_CHATML = (
    "{{ if .System }}<|im_start|>system\n{{ .System }}<|im_end|>\n{{ end }}"
    "{{ if .Prompt }}<|im_start|>user\n{{ .Prompt }}<|im_end|>\n{{ end }}"
    "<|im_start|>assistant\n{{ .Response }}<|im_end|>\n"
)
_LLAMA3 = (
    "{{ if .System }}<|start_header_id|>system<|end_header_id|>\n\n{{ .System }}<|eot_id|>{{ end }}"
    "{{ if .Prompt }}<|start_header_id|>user<|end_header_id|>\n\n{{ .Prompt }}<|eot_id|>{{ end }}"
    "<|start_header_id|>assistant<|end_header_id|>\n\n{{ .Response }}<|eot_id|>"
)


def _default_system_prompt(tokenizer: Any) -> str:
    """The system prompt the chat template inserts when none is given (SmolLM2 has one)."""
    try:
        text = tokenizer.apply_chat_template(
            [{"role": "user", "content": "x"}], tokenize=False, add_generation_prompt=True
        )
    except Exception:  # a tokenizer without a template: nothing to copy
        return ""
    m = re.match(r"<\|im_start\|>system\n(.*?)<\|im_end\|>", text, re.S)
    return m.group(1) if m else ""


def modelfile(trained: Trained, gguf_name: str) -> str:
    """An Ollama Modelfile for the exported GGUF: template, system prompt, stops, parameters."""
    tok, cfg = trained.policy.tokenizer, trained.cfg
    template = getattr(tok, "chat_template", "") or ""
    lines = [f"# {trained.policy.model_id} after {trained.round} rounds of SAPO Swarm", f"FROM ./{gguf_name}", ""]
    if "<|im_start|>" in template:
        lines.append(f'TEMPLATE """{_CHATML}"""')
    elif "<|start_header_id|>" in template:
        lines.append(f'TEMPLATE """{_LLAMA3}"""')
    else:
        lines.append("# TEMPLATE: Ollama reads the chat template stored in the GGUF")
    system = cfg.tasks.system_prompt or _default_system_prompt(tok)
    if system:
        lines.append(f'SYSTEM """{system}"""')
    stops = sorted({tok.convert_ids_to_tokens(i) for i in trained.policy.eos_ids if i is not None} - {None})
    for s in stops:
        lines.append(f'PARAMETER stop "{s}"')
    lines += [
        f"PARAMETER temperature {cfg.sampler.temperature:g}",
        f"PARAMETER top_p {getattr(cfg.sampler, 'top_p', 1.0):g}",
        f"PARAMETER num_predict {cfg.sampler.max_new_tokens}",
        "",
    ]
    return "\n".join(lines)


def write_hf(trained: Trained, out: Path, progress: Progress) -> None:
    progress(0.2, "merging the adapter into the weights")
    model = merged_model(trained.policy)
    progress(0.5, "writing safetensors, config and tokenizer")
    tok = trained.policy.tokenizer
    gen = model.generation_config
    gen.eos_token_id = list(trained.policy.eos_ids) or gen.eos_token_id
    gen.pad_token_id = tok.pad_token_id
    gen.do_sample, gen.temperature = True, trained.cfg.sampler.temperature
    gen.max_new_tokens = trained.cfg.sampler.max_new_tokens
    model.save_pretrained(out, safe_serialization=True)
    tok.save_pretrained(out)


def write_peft(trained: Trained, out: Path, progress: Progress) -> None:
    if not trained.policy.lora:
        raise ExportFailed("this run trained all weights (model.lora = false): there is no adapter; use --format hf")
    progress(0.4, "writing the adapter")
    trained.policy.model.save_pretrained(out, safe_serialization=True)
    trained.policy.tokenizer.save_pretrained(out)
    cfg_path = out / "adapter_config.json"
    body = json.loads(cfg_path.read_text(encoding="utf-8"))
    body["base_model_name_or_path"] = trained.policy.model_id  # not our private cache path
    cfg_path.write_text(json.dumps(body, indent=2), encoding="utf-8")


# --- the model card ---------------------------------------------------------------------------------------------


def model_card(trained: Trained, fmt: str, files: list[str], run_dir: Path) -> str:
    totals, held = {}, None
    try:
        store = RunStore(run_dir / STORE_NAME, readonly=True)
        try:
            totals = contribution_totals(store, until_round=trained.round)
            held = held_out_summary(store, until_round=trained.round)
        finally:
            store.close()
    except StoreError:
        pass
    p, cfg = trained.policy, trained.cfg
    lines = [
        f"# {p.model_id}, post-trained with SAPO Swarm",
        "",
        f"Base model: **{trained.title}** (`{p.model_id}`), licence **{trained.license}**. "
        "This model is a derivative of it and carries the same licence terms.",
        "",
        f"Trained for **{trained.round} rounds** of SAPO (swarm GRPO sharing decoded rollouts) on "
        f"ReasoningGYM tasks ({', '.join(sorted(cfg.tasks.weights)) or 'default mix'}).",
    ]
    if p.lora:
        lines.append(
            f"Fine-tuned with LoRA (rank {p.lora_rank}, alpha {p.lora_alpha:g}, "
            f"targets {', '.join(cfg.model.lora_targets)})."
        )
    lines += ["", "## Training", ""]
    if totals:
        lines += [
            f"- rounds recorded: {totals['rounds']:.0f}",
            f"- groups trained: {totals['groups_own']:.0f} own, {totals['groups_peers']:.0f} from peers",
            f"- from peers: {from_peers_words(totals)}",
            f"- completions sampled: {totals['completions']:.0f}",
            f"- peers seen (most in one round): {totals['peers_max']:.0f}",
            f"- CPU time given: {totals['cpu_hours']:.2f} h",
        ]
    else:
        lines.append("- the run store was not readable: no training figures")
    lines += ["", "## Held-out evaluation", ""]
    lines.append(held.sentence() if held else "No held-out evaluation was recorded in this run.")
    lines += ["", "## Files", ""] + [f"- `{f}`" for f in files]
    lines += [
        "",
        "## Use",
        "",
        _usage(fmt, files, p.model_id),
        "",
        "## Configuration of the run",
        "",
        "```toml",
        dump_config(cfg).strip(),
        "```",
        "",
    ]
    return "\n".join(lines)


def _usage(fmt: str, files: list[str], model_id: str) -> str:
    gguf = next((f for f in files if f.endswith(".gguf")), "model.gguf")
    return {
        "gguf": f"`llama-cli -m {gguf} -cnv`, or open the file in LM Studio.",
        "ollama": "`ollama create sapo-model -f Modelfile` then `ollama run sapo-model`.",
        "hf": "`AutoModelForCausalLM.from_pretrained(folder)` and `AutoTokenizer.from_pretrained(folder)`.",
        "peft": f"`PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(<{model_id}>), folder)`; "
        "the base must be the same weights the node trained.",
    }[fmt]


# --- the whole export -------------------------------------------------------------------------------------------


def export(req: ExportRequest, progress: Progress | None = None, download: Any = None) -> list[Path]:
    """Write `req.format` into `req.output` with a model card; returns the files written.
    `download`: see `load_trained`."""
    progress = progress or (lambda f, s: None)
    progress(0.0, "loading the model and the checkpoint")
    trained = load_trained(req.run_dir, req.round, download)
    out = req.output
    tmp = out.with_name(f".{out.name}.partial{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    try:
        if req.format in ("gguf", "ollama"):
            g = write_gguf(trained, tmp, req.quant, req.threads, progress)
            if req.format == "ollama":
                (tmp / "Modelfile").write_text(modelfile(trained, g.name), encoding="utf-8")
        elif req.format == "hf":
            write_hf(trained, tmp, progress)
        else:
            write_peft(trained, tmp, progress)
        progress(0.9, "writing the model card")
        files = sorted(f.name for f in tmp.iterdir())
        (tmp / "README.md").write_text(model_card(trained, req.format, files, Path(req.run_dir)), encoding="utf-8")
        if out.exists():
            out.rmdir()  # empty (checked by ExportRequest)
        os.replace(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    progress(1.0, "done")
    return sorted(out.iterdir())


__all__ = [
    "ExportRequest",
    "ExportFailed",
    "FORMATS",
    "QUANTS",
    "export",
    "load_trained",
    "merged_model",
    "modelfile",
    "model_card",
    "CheckpointError",
]
