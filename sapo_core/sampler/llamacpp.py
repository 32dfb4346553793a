"""The llama.cpp sampler: G completions of several questions decoded together, in a child process.

- Speed: all sequences of all prompts of a call decode in one batch sharing each prompt's
  KV cells (`llamacpp_engine`); the base GGUF is converted once per `sampler.quantization`
  and cached: Q8_0 (Q4_1 has no fast kernels: docs/environment.md, 'llama.cpp: quantization
  and speed') or F16 (the trainer's own weights: the least drift, the same speed at 32
  sequences, slower when few sequences are left; docs/calibration.md, 'Sampler').
- Follows the policy: `sync_policy` exports the LoRA adapter to GGUF (`lora_gguf`) and
  hot-swaps it into the running context; with full fine-tuning it exports all weights and
  reloads. Nothing happens while `policy.version` is unchanged.
- Crash safety: llama.cpp lives in a spawned child (`guard.WorkerProcess`); a native crash
  is a `SamplerError` naming the signal, and the node falls back to transformers.
- Agreement: `logprob_drift` is the mean |sampler - trainer| log-prob of the sampled tokens;
  a wrong export (e.g. Q/K rows not permuted) shows up there at once.

The parent never imports llama_cpp: `llamacpp_available` only looks for the package.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import itertools
import math
import os
import shutil
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import psutil

from sapo_core.config import SamplerConfig
from sapo_core.cpu import physical_cores
from sapo_core.hooks import Interrupted, RoundHooks
from sapo_core.sampler.base import SampledSequence, SamplerError, SamplingParams, build_features
from sapo_core.sampler.guard import WorkerProcess

if TYPE_CHECKING:  # the node has torch loaded anyway; `llamacpp_available` needs none of it
    from sapo_core.policy import Policy

ENGINE_MODULE = "sapo_core.sampler.llamacpp_engine"
_GGUF_FTYPES = {"q8_0": 7, "f16": 1}  # sampler.quantization -> llama_ftype (general.file_type)
_session_ids = itertools.count()
# Sequences decoded together. A CPU is compute-bound well before this; more only grows memory.
_MAX_SEQS_PER_CALL = 64


def llamacpp_available() -> tuple[bool, str]:
    """(usable, reason) without loading the native library into this process."""
    if importlib.util.find_spec("llama_cpp") is None:
        return False, (
            "llama-cpp-python is not installed (the installer builds it with portable CPU flags; "
            "or pip install llama-cpp-python)"
        )
    try:
        version = importlib.metadata.version("llama_cpp_python")
    except importlib.metadata.PackageNotFoundError:
        version = "unknown version"
    return True, f"llama-cpp-python {version}"


def _source_key(path: Path) -> str:
    import hashlib

    st = path.stat()
    return hashlib.sha256(f"{path.resolve()}:{st.st_size}:{st.st_mtime_ns}".encode()).hexdigest()[:16]


def _gguf_file_type(path: Path) -> int | None:
    from sapo_core.sampler.lora_gguf import read_gguf_metadata

    ftype = read_gguf_metadata(path).get("general.file_type")
    return None if ftype is None else int(ftype)


def _remove_orphan_sessions(work_dir: Path) -> None:
    """Session directories of processes that died without `close()` (a killed node)."""
    for d in work_dir.glob("session-*"):
        try:
            pid = int(d.name.split("-")[1])
        except (IndexError, ValueError):
            continue
        if not psutil.pid_exists(pid):
            shutil.rmtree(d, ignore_errors=True)


class LlamaCppSampler:
    name = "llamacpp"

    def __init__(
        self,
        worker: WorkerProcess,
        cfg: SamplerConfig,
        work_dir: Path,
        session_dir: Path,
        template: Path,
        arch: str,
        eos_ids: tuple[int, ...],
        info: dict[str, Any],
    ) -> None:
        self._worker = worker
        self._cfg = cfg
        self._work_dir = work_dir
        self._session_dir = session_dir
        self._template = template  # a GGUF with the tokenizer, for full-weight exports
        self._arch = arch
        self._eos_ids = eos_ids
        self.info = info  # from the worker: model path, vocabulary, system info, GPU offload
        self.synced_version: int | None = None
        self.adapter_path: Path | None = None
        self.last_sync_seconds = 0.0
        self.stats = {
            "calls": 0,
            "steps": 0,
            "tokens": 0,
            "seconds": 0.0,
            "prefill_seconds": 0.0,
            "prompt_tokens": 0,
            "shared_prompt_tokens": 0,
        }

    # --- construction -----------------------------------------------------------------
    @classmethod
    def create(
        cls, policy: Policy, cfg: SamplerConfig, cache_dir: Path, template_gguf: Path | None = None
    ) -> LlamaCppSampler:
        """Start the worker, load the policy's GGUF (re-quantized per `cfg.quantization`), smoke-test
        one decode, and sync the policy. A policy without a GGUF (`tiny-random`) is exported in
        full, with the tokenizer metadata of `template_gguf`. Raises `SamplerError`."""
        from sapo_core.sampler.lora_gguf import ExportError, export_full_gguf, gguf_architecture

        work_dir = Path(cache_dir) / "llamacpp"
        _remove_orphan_sessions(work_dir)
        session_dir = work_dir / f"session-{os.getpid()}-{next(_session_ids)}"
        session_dir.mkdir(parents=True, exist_ok=True)
        try:
            if policy.gguf_path is not None:
                source = template = Path(policy.gguf_path)
            elif template_gguf is not None:
                template, source = Path(template_gguf), session_dir / "base.f32.gguf"
                export_full_gguf(policy.model, template, source)
            else:
                raise SamplerError(f"llama.cpp needs a GGUF model; {policy.model_id} has none")
            arch = gguf_architecture(template)
        except (ExportError, OSError, ValueError) as e:
            shutil.rmtree(session_dir, ignore_errors=True)
            raise SamplerError(f"could not prepare {policy.model_id} for llama.cpp: {e}") from e
        # llama.cpp's OpenMP threads wait for each other at every op; spinning there collapses
        # throughput when other programs share the cores (docs/environment.md, 'OpenMP threads
        # under contention') and burns the CPU time the throttle is trying to give back.
        env = dict(os.environ)
        env.setdefault("OMP_WAIT_POLICY", "PASSIVE")
        worker = WorkerProcess(ENGINE_MODULE, "llama.cpp sampler", env=env)
        try:
            info = worker.call("load", **cls._load_args(source, cfg, work_dir, session_dir))
            sampler = cls(worker, cfg, work_dir, session_dir, template, arch, policy.eos_ids, info)
            sampler._smoke_test(policy)
            if not policy.lora and (policy.gguf_path is None or policy.version == 0):
                sampler.synced_version = policy.version  # what was just loaded is the policy's weights
            sampler.sync_policy(policy)
            sampler._prune_session()  # an f32 export that was quantized is no longer needed
        except BaseException:
            worker.close()
            shutil.rmtree(session_dir, ignore_errors=True)
            raise
        return sampler

    @staticmethod
    def _load_args(source: Path, cfg: SamplerConfig, work_dir: Path, session_dir: Path) -> dict[str, Any]:
        threads = cfg.threads or physical_cores()
        kind = cfg.quantization
        if kind == "as-is" or _gguf_file_type(source) == _GGUF_FTYPES[kind]:
            return {"path": str(source), "threads": threads}
        if source.parent == session_dir:  # our own export: converted beside it, gone with the session
            target = session_dir / f"{source.stem}.{kind}.gguf"
            target.unlink(missing_ok=True)  # a new export: an old converted copy is stale
        else:  # the catalogue's GGUF: converted once, kept in the cache for later runs
            target = work_dir / f"{source.stem}-{_source_key(source)}.{kind}.gguf"
            for old in work_dir.glob(f"{source.stem}-*.{kind}.gguf"):
                if old != target:
                    old.unlink(missing_ok=True)
        return {"path": str(source), "threads": threads, "quantize_to": str(target), "ftype": kind}

    def _smoke_test(self, policy: Policy) -> None:
        """Two tokens on two sequences: a build that crashes at its first decode fails here, at
        start-up, where the node can still choose transformers (AMX: docs/environment.md,
        'llama.cpp build flags')."""
        bos = policy.tokenizer.bos_token_id if policy.tokenizer.bos_token_id is not None else 0
        self._worker.call(
            "start", prompts=[[int(bos)] * 4], seeds=[0], n=2, max_new_tokens=2, temperature=1.0, top_p=1.0, stop_ids=[]
        )
        while self._worker.call("step")["live"]:
            pass
        self._worker.call("collect")

    # --- the Sampler protocol ---------------------------------------------------------
    def sample(
        self, prompts: Sequence[Sequence[int]], seeds: Sequence[int], params: SamplingParams, hooks: RoundHooks
    ) -> list[list[SampledSequence]]:
        if len(prompts) != len(seeds):
            raise ValueError(f"{len(prompts)} prompts but {len(seeds)} seeds")
        max_seqs = min(_MAX_SEQS_PER_CALL, int(self.info.get("max_sequences", _MAX_SEQS_PER_CALL)))
        if params.n > max_seqs:
            raise SamplerError(f"llama.cpp decodes at most {max_seqs} sequences at once; lower sampler.group_size")
        # Prompts per call are cut so their sequences fit the engine's one shared KV cache (its
        # info's shared_cache_sequences); above that it switches to a cache per sequence, sized for
        # the longest, and keeps the context for the process's life: a held-out evaluation (96
        # prompts x 4) made it 64 caches of 512 tokens, the node's peak +0.6 GB (README,
        # `sapo-bench training`). A group larger than that still gets one call of its own.
        per_call = max(1, min(max_seqs, int(self.info["shared_cache_sequences"])) // params.n)
        stop = sorted(set(params.stop_token_ids or self._eos_ids))
        total = len(prompts) * params.n * params.max_new_tokens
        out: list[list[SampledSequence]] = []
        t0 = time.perf_counter()
        for start in range(0, len(prompts), per_call):
            out.extend(
                self._sample_chunk(
                    prompts[start : start + per_call], seeds[start : start + per_call], params, stop, hooks, total
                )
            )
        self.stats["calls"] += 1
        self.stats["seconds"] += time.perf_counter() - t0
        self.stats["tokens"] += sum(len(s.token_ids) for g in out for s in g)
        return out

    def _sample_chunk(
        self,
        prompts: Sequence[Sequence[int]],
        seeds: Sequence[int],
        params: SamplingParams,
        stop: list[int],
        hooks: RoundHooks,
        total: int,
    ) -> list[list[SampledSequence]]:
        t0 = time.perf_counter()
        started = self._worker.call(
            "start",
            prompts=[[int(t) for t in p] for p in prompts],
            seeds=[int(s) for s in seeds],
            n=params.n,
            max_new_tokens=params.max_new_tokens,
            temperature=params.temperature,
            top_p=params.top_p,
            stop_ids=stop,
        )
        live = started["live"]
        self.stats["prefill_seconds"] += time.perf_counter() - t0
        self.stats["prompt_tokens"] += sum(len(p) for p in prompts)
        self.stats["shared_prompt_tokens"] += int(started.get("shared_tokens", 0))
        done = 0
        try:
            while live:
                hooks.checkpoint()  # may block (pause, throttle) or raise Interrupted (stop)
                live = self._worker.call("step")["live"]
                self.stats["steps"] += 1
                done += live
                hooks.progress("sample", min(done, total), total)
        except Interrupted:
            if self._worker.alive:
                self._worker.call("abort")
            raise
        groups = self._worker.call("collect")["results"]
        return [
            [
                SampledSequence(token_ids=list(toks), logprobs=[float(x) for x in lps], finished=bool(fin))
                for toks, lps, fin in group
            ]
            for group in groups
        ]

    def sync_policy(self, policy: Policy) -> None:
        """Export what the trainer changed and swap it in; nothing when the version is the same."""
        from sapo_core.sampler.lora_gguf import ExportError, export_full_gguf, export_lora_adapter, lora_is_zero

        if self.synced_version == policy.version:
            return
        t0 = time.perf_counter()
        try:
            if policy.lora:
                previous = self.adapter_path
                if lora_is_zero(policy.model):  # peft starts with B = 0: skip the adapter's extra matmuls
                    self._worker.call("adapter", path=None)
                    self.adapter_path = None
                else:
                    path = self._session_dir / f"adapter-v{policy.version}.gguf"
                    export_lora_adapter(policy.model, self._arch, path)
                    self._worker.call("adapter", path=str(path), scale=1.0)
                    self.adapter_path = path
                if previous is not None and previous != self.adapter_path:
                    previous.unlink(missing_ok=True)
            else:  # full fine-tuning: new weights, a new model (the context is rebuilt on next use)
                path = self._session_dir / f"full-v{policy.version}.f32.gguf"
                export_full_gguf(policy.model, self._template, path)
                self.info = self._worker.call(
                    "load", **self._load_args(path, self._cfg, self._work_dir, self._session_dir)
                )
                self._prune_session()
        except (ExportError, OSError) as e:
            raise SamplerError(f"could not export the policy for llama.cpp: {e}") from e
        self.synced_version = policy.version
        self.last_sync_seconds = time.perf_counter() - t0

    def _prune_session(self) -> None:
        """Delete this session's model exports other than the loaded one (and the adapter in use)."""
        keep = {Path(self.info["model_path"]), self.adapter_path}
        for f in self._session_dir.glob("*.gguf"):
            if f not in keep:
                try:
                    f.unlink()
                except OSError:  # Windows: still mapped; the session directory goes at close()
                    pass

    def set_threads(self, n: int) -> None:
        self._worker.call("threads", n=n if n > 0 else physical_cores())

    def status(self) -> dict[str, Any]:
        """What the worker holds: model path, adapter path, threads, context size, pid."""
        return self._worker.call("status")

    @property
    def kernels(self) -> str:
        """The build's CPU features: what decides which tokens a seed gives (evalbase.py)."""
        return build_features(str(self.info.get("system_info", "")))

    @property
    def worker_pid(self) -> int:
        return self._worker.pid

    @property
    def worker(self) -> WorkerProcess:
        return self._worker

    def close(self) -> None:
        self._worker.close()
        shutil.rmtree(self._session_dir, ignore_errors=True)


# --- agreement with the trainer ------------------------------------------------------------


def logprob_drift(sampler_logprobs: Sequence[Sequence[float]], trainer_logprobs: Sequence[Sequence[float]]) -> float:
    """Mean |sampler - trainer| log-prob over all tokens (nats/token); NaNs are skipped.

    Near 0 when the sampler samples the trainer's policy; Q8_0 rounding and batched kernels
    give a few hundredths; a wrong export gives tenths or more.
    """
    if len(sampler_logprobs) != len(trainer_logprobs):
        raise ValueError(f"{len(sampler_logprobs)} sequences against {len(trainer_logprobs)}")
    total, n = 0.0, 0
    for a, b in zip(sampler_logprobs, trainer_logprobs):
        if len(a) != len(b):
            raise ValueError(f"a sequence of {len(a)} log-probs against one of {len(b)}")
        for x, y in zip(a, b):
            if not (math.isnan(x) or math.isnan(y)):
                total += abs(x - y)
                n += 1
    return total / n if n else float("nan")


def trainer_logprobs(
    policy: Policy, prompt: Sequence[int], completions: Sequence[Sequence[int]], temperature: float = 1.0
) -> list[list[float]]:
    """log p(token) of each completion token under the policy's model in transformers (tests, bench)."""
    import torch

    model = policy.model
    was_training = model.training
    model.eval()
    out: list[list[float]] = []
    try:
        with torch.no_grad():
            for comp in completions:
                if not comp:
                    out.append([])
                    continue
                device = next(model.parameters()).device
                ids = torch.tensor([list(prompt) + list(comp)], device=device)
                logits = model(input_ids=ids).logits[0, len(prompt) - 1 : -1].float() / temperature  # (T, V)
                target = torch.tensor(list(comp), device=device)[:, None]
                lp = torch.log_softmax(logits, dim=-1).gather(1, target)[:, 0]
                out.append(lp.tolist())
    finally:
        model.train(was_training)
    return out
