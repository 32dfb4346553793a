"""`sapo-node hardware`: what this machine has, each value with how it was found, and which
catalogue model it would train, with every other model's verdict (fits / slow / doesn't fit).

The config is layered as for `sapo-node run` (defaults, `--config` or the data directory's
`node.toml`, then `--set`/`--model`), since the choice depends on it (LoRA, micro-batch, G...).
`--override SAPO_RAM_GB=8` asks what-if questions without touching the environment.

Round times come from this machine's cached probe (probe.py: two real rounds of the embedded
model, scaled by parameters for the others) when there is one, else from the formula;
`--probe` measures it now (`run_probe`, about a minute, once per machine). Each model shows
rounds per hour.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import tempfile
import time
import tomllib
from dataclasses import asdict
from pathlib import Path
from typing import Any

from sapo_core import paths
from sapo_core.catalog import CatalogError, ModelChoice, choose_model, load_catalogue, ram_budget_gb
from sapo_core.config import ConfigError, NodeConfig, load_config
from sapo_core.hardware import OVERRIDE_KEYS, HardwareOverrideError, HardwareProfile, detect_hardware
from sapo_core.probe import PROBE_SHAPE, Probe, load_probe, machine_key, probe_from_metrics, save_probe

log = logging.getLogger(__name__)


def configure(p: argparse.ArgumentParser) -> None:
    p.add_argument("--json", action="store_true", help="print the profile and the choice as JSON")
    p.add_argument("--config", help="TOML config file (default: node.toml in the data directory, if any)")
    p.add_argument("--model", help="judge this catalogue id as if the config named it (default: the config's)")
    p.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a config value, e.g. --set train.micro_batch_size=4 (repeatable)",
    )
    p.add_argument(
        "--probe",
        action="store_true",
        help="measure this machine now (two short real rounds of the embedded model, ~30-60 s) and "
        "cache it; later calls use the cached figures",
    )
    p.add_argument(
        "--override",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help=f"pretend the machine differs, e.g. --override SAPO_RAM_GB=8; keys: {', '.join(OVERRIDE_KEYS)}",
    )


def _pairs(items: list[str], flag: str) -> dict[str, str]:
    out = {}
    for item in items:
        if "=" not in item:
            raise ConfigError(f"{flag} {item}: write KEY=VALUE")
        key, value = item.split("=", 1)
        out[key.strip()] = value.strip()
    return out


def _config(args: argparse.Namespace) -> NodeConfig:
    default_file = paths.data_dir() / "node.toml"
    cfg = (
        load_config(args.config)
        if args.config
        else load_config(default_file)
        if default_file.is_file()
        else NodeConfig()
    )
    changes: dict[str, Any] = {}
    for key, text in _pairs(args.set, "--set").items():
        try:
            changes[key] = tomllib.loads(f"v = {text}")["v"]
        except tomllib.TOMLDecodeError:
            changes[key] = text
    if args.model:
        changes["model.name"] = args.model
    return cfg.replace(**changes) if changes else cfg


def report(profile: HardwareProfile, choice: ModelChoice, probe: Any = None) -> dict[str, Any]:
    """The JSON form: profile, choice, and each model's verdict with its estimates."""
    models = []
    for v in choice.verdicts:
        host, gpu = v.memory.placement(profile.device.value)
        models.append(
            {
                "id": v.model_id,
                "status": v.status,
                "reason": v.reason,
                "micro_batch_size": v.micro_batch_size,
                "memory_gb": {
                    "host": round(host, 2),
                    "gpu": round(gpu, 2),
                    "train": v.memory.train,
                    "sample": v.memory.sample,
                    "runtime": v.memory.runtime_gb,
                    "load_transient": v.memory.load_transient_gb,
                },
                "disk_gb": v.memory.disk,
                "round_estimate": {
                    "seconds": round(v.round.seconds, 1),
                    "sample_tok_s": round(v.round.sample_tok_s, 1),
                    "train_tok_s": round(v.round.train_tok_s, 1),
                    "rounds_per_hour": round(v.round.rounds_per_hour, 1),
                    "overhead_seconds": round(v.round.overhead_seconds, 1),
                    "basis": v.round.basis,
                },
            }
        )
    return {
        "profile": profile.to_dict(),
        "ram_budget_gb": round(ram_budget_gb(profile), 2),
        "choice": {
            "model": choice.entry.id,
            "reason": choice.reason,
            "micro_batch_size": choice.micro_batch_size,
            "explicit": choice.explicit,
            "warnings": list(choice.warnings),
        },
        "models": models,
        "probe": asdict(probe) if probe is not None else None,
    }


def _print_human(profile: HardwareProfile, choice: ModelChoice, configured_micro_batch: int, probe: Any = None) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console()
    machine = Table(title="This machine", title_justify="left")
    for col in ("", "value", "how it was found"):
        machine.add_column(col)
    gpus = ", ".join(f"{g.name} ({g.memory_gb:.1f} GB)" for g in profile.gpus.value) or "none"
    rows = [
        ("CPU cores (physical)", str(profile.cpu_physical.value), profile.cpu_physical.reason),
        ("CPU threads (logical)", str(profile.cpu_logical.value), profile.cpu_logical.reason),
        ("RAM total", f"{profile.ram_total_gb.value:.1f} GB", profile.ram_total_gb.reason),
        ("RAM available", f"{profile.ram_available_gb.value:.1f} GB", profile.ram_available_gb.reason),
        ("disk free", f"{profile.disk_free_gb.value:.1f} GB", profile.disk_free_gb.reason),
        ("CUDA GPUs", gpus, profile.gpus.reason),
        ("Apple MPS", "yes" if profile.mps.value else "no", profile.mps.reason),
        ("training device", profile.device.value, profile.device.reason),
    ]
    for row in rows:
        machine.add_row(*row)
    console.print(machine)
    console.print(
        f"RAM budget for the node: {ram_budget_gb(profile):.1f} GB (available RAM, at most 80 % of the total)"
        f"; data directory {profile.data_dir}"
    )

    if probe is not None:
        console.print(
            f"Round times from this machine's probe ({probe.model_id}, {probe.threads} thread(s)): sampling "
            f"{probe.sample_tok_s:.0f} tok/s, training {probe.train_tok_s:.0f} tok/s, answers "
            f"{probe.completion_tokens:.0f} tokens; other models scaled by parameters"
        )
    else:
        console.print("Round times are a formula's guess: `sapo-node hardware --probe` measures this machine (~1 min)")
    models = Table(title="Models (largest first; round times estimated)", title_justify="left")
    for col in ("model", "verdict", "RAM GB", "GPU GB", "disk GB", "round s", "rounds/h", "why"):
        models.add_column(col, overflow="fold")
    style = {"fits": "green", "slow": "yellow", "doesn't fit": "red"}
    for v in choice.verdicts:
        host, gpu = v.memory.placement(profile.device.value)
        mark = " *" if v.model_id == choice.entry.id else ""
        models.add_row(
            v.model_id + mark,
            f"[{style[v.status]}]{v.status}[/]",
            f"{host:.1f}",
            f"{gpu:.1f}" if gpu else "-",
            f"{v.memory.disk_gb:.1f}",
            f"{v.round.seconds:.0f}",
            f"{v.round.rounds_per_hour:.0f}",
            v.reason,
        )
    console.print(models)

    chosen = choice.verdict(choice.entry.id).memory
    parts = ", ".join(f"{k} {val:.2f}" for k, val in chosen.train.items())
    console.print(f"[bold]Choice:[/] {choice.reason}")
    console.print(f"  training step (GB): {parts}; peak {chosen.train_gb:.2f}")
    console.print("  sampler (GB): " + ", ".join(f"{k} {val:.2f}" for k, val in chosen.sample.items()))
    if choice.micro_batch_size != configured_micro_batch:
        console.print(
            f"  micro-batch: {choice.micro_batch_size} fits memory; the config's train.micro_batch_size "
            f"{configured_micro_batch} does not (set it, or let the node lower it)"
        )
    for w in choice.warnings:
        console.print(f"[yellow]warning:[/] {w}")


def run_probe(cache_dir: Path) -> Probe:
    """Two real rounds of the embedded model (the second, warm one kept), cached in `cache_dir`."""
    from sapo_core.node import Node

    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # as in the node process (worker.py)
    entry = load_catalogue().embedded
    with tempfile.TemporaryDirectory(prefix="sapo-probe-") as tmp:
        cfg = NodeConfig().replace(
            **{
                "model.name": entry.id,
                "swarm.enabled": False,
                "round.external_groups": 0,
                "round.auto_scale": False,
                "train.kl_beta": 0.01,
                "eval.enabled": False,  # the base model's held-out score is no part of a round's cost
                "run_dir": tmp,
                **PROBE_SHAPE,
            }
        )
        node = Node(cfg)
        t0 = time.perf_counter()
        node.setup()
        log.info(f"probe: {entry.id} loaded in {time.perf_counter() - t0:.0f} s, {node.threads} thread(s)")
        try:
            node.run_round()
            m = node.run_round()
        finally:
            node.close()
        probe = probe_from_metrics(
            m, machine_key(node.threads), entry.id, entry.params, node.threads, PROBE_SHAPE["round.local_groups"]
        )
    log.info(
        f"probe: round {probe.round_seconds:.1f} s: sampling {probe.sample_tok_s:.0f} tok/s, training "
        f"{probe.train_tok_s:.0f} tok/s, answers {probe.completion_tokens:.1f} tokens, prompts "
        f"{probe.prompt_tokens:.0f}, other {probe.overhead_seconds:.1f} s"
    )
    save_probe(cache_dir, probe)
    return probe


def main(args: argparse.Namespace) -> int:
    try:
        cfg = _config(args)
        profile = detect_hardware(_pairs(args.override, "--override"))
        if args.probe:
            probe = run_probe(paths.cache_dir())
        else:
            probe = load_probe(paths.cache_dir())
        choice = choose_model(profile, load_catalogue(), cfg, probe)
    except (ConfigError, HardwareOverrideError, CatalogError) as e:
        print(f"sapo-node hardware: {e}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(report(profile, choice, probe), indent=2))
    else:
        _print_human(profile, choice, cfg.train.micro_batch_size, probe)
    return 0
