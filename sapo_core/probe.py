"""What a round costs on this machine, measured once and cached: the round-time estimates' basis.

The formula in estimates.py guesses a round from throughput anchors and answers as long as
max_new_tokens; real rounds of the embedded model took a fraction of that (docs/calibration.md,
'Round-time estimates'),
so larger models were wrongly called slow. `sapo-node hardware --probe` (`commands/hardware.py`,
`run_probe`) runs two real rounds of the embedded model (`PROBE_SHAPE`: 2 questions x 4
completions of at most 64 tokens, training alone, with the node's own threads; the second, warm
round is kept) and records here what they cost:

- `sample_tok_s`: sampled tokens per second over the whole sampling phase (prefill included);
- `train_tok_s`: tokens the trainer processed per second (`train/tok_per_s`: K steps,
  checkpointing's recompute and packing as configured);
- `completion_tokens`, `prompt_tokens`: how long the answers and prompts really were;
- `overhead_seconds`: the rest of the round (scoring, syncing the sampler, saving).

`estimates.estimate_round(..., probe=)` scales these by parameters for other models (a bigger
model cannot be run here without downloading it) and by cores when the profile differs.
The cache (`probe.json` in the cache directory) is keyed by the machine: CPU model, cores,
RAM, threads, torch and llama.cpp versions. This module only reads, writes and derives; it
imports nothing of the node.
"""

from __future__ import annotations

import json
import logging
import math
import platform
import time
from dataclasses import asdict, dataclass, fields
from pathlib import Path

from sapo_core.control import vocabulary as K

log = logging.getLogger(__name__)

PROBE_FILE = "probe.json"
PROBE_SHAPE = {"round.local_groups": 2, "sampler.group_size": 4, "sampler.max_new_tokens": 64}


@dataclass(frozen=True)
class Probe:
    machine: str  # the cache key this was measured under
    model_id: str
    params: int
    threads: int
    sample_tok_s: float
    train_tok_s: float
    completion_tokens: float  # mean sampled tokens per completion
    prompt_tokens: float  # mean prompt tokens per question
    overhead_seconds: float  # round - sample - update
    round_seconds: float  # the probe's own round, for the record
    measured_at: float  # time.time()

    @classmethod
    def from_dict(cls, d: dict) -> Probe:
        """ValueError for anything but a whole probe with finite, non-negative figures."""
        kwargs = {}
        for f in fields(cls):
            v = d.get(f.name)
            if f.type == "str" and isinstance(v, str):
                kwargs[f.name] = v
            elif (
                f.type != "str"
                and isinstance(v, (int, float))
                and not isinstance(v, bool)
                and math.isfinite(v)
                and v >= 0
            ):
                kwargs[f.name] = int(v) if f.type == "int" else float(v)
            else:
                raise ValueError(f"probe field {f.name!r} is {v!r}")
        if kwargs["sample_tok_s"] <= 0 or kwargs["train_tok_s"] <= 0:
            raise ValueError("a probe with zero speed")
        return cls(**kwargs)


def _cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _version(dist: str) -> str:
    import importlib.metadata

    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return "-"


def machine_key(threads: int) -> str:
    """What a probe's figures depend on: the CPU, its cores, the RAM, the threads, the libraries."""
    import psutil

    ram = round(psutil.virtual_memory().total / 2**30)
    return (
        f"{_cpu_name()}|{psutil.cpu_count(logical=False)}c|{ram}GiB|{threads}t|"
        f"torch {_version('torch')}|llama-cpp-python {_version('llama_cpp_python')}"
    )


def _path(cache_dir: Path) -> Path:
    return Path(cache_dir) / PROBE_FILE


def load_probe(cache_dir: Path, key: str | None = None) -> Probe | None:
    """The cached probe of this machine (of `key`, else any with this CPU and cores), or None."""
    try:
        data = json.loads(_path(cache_dir).read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict):
        return None
    try:
        if key is not None and isinstance(data.get(key), dict):
            return Probe.from_dict(data[key])
        prefix = "|".join(machine_key(0).split("|")[:2]) + "|"
        ours = [Probe.from_dict(v) for k, v in data.items() if k.startswith(prefix) and isinstance(v, dict)]
    except ValueError:  # a damaged cache: estimate from the formula until the next probe
        return None
    return max(ours, key=lambda p: p.measured_at) if ours else None


def save_probe(cache_dir: Path, probe: Probe) -> None:
    from sapo_core.fsutil import atomic_write_bytes

    path = _path(cache_dir)
    try:
        data = json.loads(path.read_text())
        data = data if isinstance(data, dict) else {}
    except (OSError, ValueError):
        data = {}
    data[probe.machine] = asdict(probe)
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_bytes(path, json.dumps(data, indent=2).encode())


def probe_from_metrics(
    m: dict[str, float], machine: str, model_id: str, params: int, threads: int, questions: int
) -> Probe:
    """A probe from one round's metrics (the node's store keys)."""
    sample, update = m.get(K.time_of(K.SAMPLE), 0.0), m.get(K.time_of(K.UPDATE), 0.0)
    rnd = m.get(K.TIME_ROUND, 0.0)
    comp_tokens = m.get(K.COMPLETIONS_MEAN_TOKENS, 0.0)
    # packed: tokens = K x (questions x prompt + completions x (answer + stop))
    steps = max(1.0, m.get(K.TRAIN_STEPS, 1.0))
    per_step = m.get(K.TRAIN_TOKENS, 0.0) / steps
    prompt = max(0.0, (per_step - m.get(K.TRAIN_COMPLETION_TOKENS, 0.0)) / max(1, questions))
    return Probe(
        machine=machine,
        model_id=model_id,
        params=params,
        threads=threads,
        sample_tok_s=m.get(K.SAMPLER_TOK_PER_S, 0.0),
        train_tok_s=m.get(K.TRAIN_TOK_PER_S, 0.0),
        completion_tokens=comp_tokens,
        prompt_tokens=prompt,
        overhead_seconds=max(0.0, rnd - sample - update),
        round_seconds=rnd,
        measured_at=time.time(),
    )


__all__ = ["Probe", "PROBE_FILE", "PROBE_SHAPE", "machine_key", "load_probe", "save_probe", "probe_from_metrics"]
