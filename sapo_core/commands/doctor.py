"""`sapo-node doctor`: can this machine run a node? One line per check, with a fix when it fails.

Checks: Python, torch (build and device, one real op), llama.cpp (one real token on the model),
training (the model de-quantized through the node's converted-model cache, then one forward and
backward: the installer runs the doctor, so a first start finds the cache filled), a hivemind
DHT pair on loopback (store on one, read from the other), the model file, free disk, Qt
offscreen (for the desktop app; a warning only, the headless node does not need it), and, when
this session has a display, Qt on that display (xcb or wayland, the platform the window will
use: drawing offscreen says nothing about the system libraries the xcb plugin loads), naming any
missing library with the command that installs it.

Everything that can crash natively (torch, llama.cpp, p2pd, Qt) runs in a child Python, so a
segfault or a hang is reported as a failed check instead of killing the doctor. The children run
concurrently. Each probe prints one JSON line (`doctor_probes.py`); a `judge_*` function turns
what a probe saw into a `Check` (`doctor_judges.py`, `doctor_display.py`), so the judging is
tested with failures injected at that boundary. The versions and flags its fixes name are the
installers' (`doctor_plan.py`: resources/install-plan.toml). This module runs the checks and
reports them.

`--network` checks joining instead (sapo_core/swarm/netcheck.py): the p2p daemon, its addresses,
bootstrap peers, reachability, clock offset against peers, LAN discovery.

Exit status: 0 when every required check passes (warnings allowed), 1 otherwise.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import dataclasses
import json
import os
import shutil
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from sapo_core import paths
from sapo_core.commands.doctor_display import (  # app/main.py imports these from here
    _soname_package,  # noqa: F401
    display_platform,
    judge_display,
    missing_platform_libraries,
)
from sapo_core.commands.doctor_judges import (
    INSTALLER,
    embedded_model_path,
    judge_dht,
    judge_disk,
    judge_llama,
    judge_model,
    judge_python,
    judge_qt,
    judge_torch,
    judge_training,
    nearest_existing,
    nvidia_gpu_present,
)
from sapo_core.commands.doctor_probes import (
    DHT_PROBE,
    DISPLAY_PROBE,
    LLAMA_PROBE,
    QT_PROBE,
    TORCH_PROBE,
    TRAINING_PROBE,
    Check,
    ProbeResult,
    run_probe,
)
from sapo_core.cpu import cpu_flags

# --- running the checks ------------------------------------------------------------------------

CHECK_NAMES = ("python", "torch", "llama.cpp", "training", "dht", "model", "disk", "qt", "display")


def run_checks(model: Path | None, data_dir: Path, only: set[str] | None = None, timeout: float = 180.0) -> list[Check]:
    """Run the chosen checks (all by default), the slow probes concurrently; report order is fixed."""
    want = set(CHECK_NAMES) if only is None else set(only)
    qt_env = dict(os.environ, QT_QPA_PLATFORM="offscreen")

    def on_model(code: str, *more: str) -> ProbeResult:
        """`code` run on the model file; nothing run without one (its judge says it was skipped)."""
        if model is None or not model.is_file():
            return ProbeResult(0, "", "", 0.0)
        return run_probe(code, [str(model), *more], timeout)

    probes: dict[str, Callable[[], Check]] = {
        "torch": lambda: judge_torch(run_probe(TORCH_PROBE, [], timeout), nvidia_gpu_present()),
        "llama.cpp": lambda: judge_llama(on_model(LLAMA_PROBE), model),
        "training": lambda: judge_training(on_model(TRAINING_PROBE, str(paths.converted_models_dir())), model),
        "dht": lambda: judge_dht(run_probe(DHT_PROBE, [], timeout)),
        "qt": lambda: judge_qt(run_probe(QT_PROBE, [], timeout, env=qt_env)),
        "display": _display_check(timeout),
    }
    results: dict[str, Check] = {}
    if "python" in want:
        results["python"] = judge_python(tuple(sys.version_info), sys.executable)
    if "model" in want:
        results["model"] = judge_model(model)
    if "disk" in want:
        where = nearest_existing(data_dir)
        results["disk"] = judge_disk(where, shutil.disk_usage(where).free)
    with concurrent.futures.ThreadPoolExecutor(max_workers=len(probes)) as pool:
        futures = {name: pool.submit(fn) for name, fn in probes.items() if name in want}
        for name, future in futures.items():
            results[name] = future.result()
    checks = [results[n] for n in CHECK_NAMES if n in results]
    return [packaged_fix(c) for c in checks] if getattr(sys, "frozen", False) else checks


# In a package (PyInstaller sets sys.frozen) there is no pip and no installer script: Python,
# torch, llama.cpp, p2pd and the model all came in the package, so the fix is the package again.
PACKAGE_FIX = (
    "the package is damaged or incomplete: reinstall it (sudo apt install --reinstall sapo-swarm, or "
    "unpack the tarball again); your runs are kept"
)
PACKAGED_PARTS = ("python", "torch", "llama.cpp", "training", "dht", "model", "qt")


def packaged_fix(check: Check) -> Check:
    """A failed check's fix as a packaged build's user can follow it. The package's llama.cpp is
    built for CPUs with AVX2; on one without, only a source install (built for it) runs."""
    if check.status == "ok" or check.name not in PACKAGED_PARTS:
        return check
    fix = PACKAGE_FIX
    flags = cpu_flags()  # None: cannot tell (not Linux), so do not blame the CPU
    if check.name == "llama.cpp" and flags is not None and "avx2" not in flags:
        fix = (
            "this CPU has no AVX2, which the package's llama.cpp needs: install from source instead "
            f"({INSTALLER} builds llama.cpp for this CPU)"
        )
    return dataclasses.replace(check, fix=fix)


def _display_check(timeout: float) -> Callable[[], Check]:
    def check() -> Check:
        platform = display_platform()
        if platform is None:
            return judge_display(None, None, [])
        missing = missing_platform_libraries(platform) if platform in ("xcb", "wayland") else []
        return judge_display(platform, run_probe(DISPLAY_PROBE, [], min(timeout, 60.0)), missing)

    return check


def network_config(config_path: str = "", join: str = ""):
    """The swarm config the network checks use: --config, else node.toml if any, else defaults;
    then an invitation's swarm and peers."""
    from sapo_core.config import NodeConfig, load_config

    cfg = (
        load_config(config_path)
        if config_path
        else (
            load_config(paths.data_dir() / "node.toml") if (paths.data_dir() / "node.toml").is_file() else NodeConfig()
        )
    )
    if join:
        from sapo_core.swarm.invitations import apply_invitation, parse_invitation

        cfg = apply_invitation(cfg, parse_invitation(join))
    return cfg.swarm


def run_network_checks(swarm_cfg: Any, timeout: float = 10.0) -> list[Check]:
    """`doctor --network`: one child starts a DHT node as the node would and looks around
    (sapo_core/swarm/netcheck.py); every step in it is bounded by `timeout`."""
    from sapo_core.swarm.netcheck import NETWORK_PROBE, judge_network, probe_args

    budget = timeout * (5 + len(swarm_cfg.initial_peers)) + 30
    result = run_probe(NETWORK_PROBE, [probe_args(swarm_cfg, timeout)], budget)
    return judge_network(result.payload, result.failure(), swarm_cfg, Check)


def format_report(checks: list[Check], title: str = "can this machine run a node?") -> str:
    lines = [f"sapo-node doctor: {title}"]
    for c in checks:
        lines.append(f"  {c.status.upper() if c.status == 'fail' else c.status:<5} {c.name:<10} {c.detail}")
        if c.status != "ok" and c.fix:
            lines.append(f"  {'':<5} {'':<10} fix: {c.fix}")
    failed = [c.name for c in checks if c.status == "fail"]
    lines.append(
        f"{len(failed)} required check(s) failed: {', '.join(failed)}" if failed else "All required checks passed."
    )
    return "\n".join(lines)


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="print the checks as JSON")
    parser.add_argument("--model", default="", help="GGUF file to run a token on (default: the embedded one)")
    parser.add_argument(
        "--data-dir", default="", help=f"where run data goes, for the disk check (default: {paths.data_dir()})"
    )
    parser.add_argument("--only", default="", help=f"comma-separated checks to run, of: {', '.join(CHECK_NAMES)}")
    parser.add_argument("--timeout", type=float, default=180.0, help="seconds each probe may take")
    parser.add_argument(
        "--network",
        action="store_true",
        help="check joining instead: the p2p daemon, its addresses, bootstrap peers, reachability, "
        "clock offset against peers, LAN discovery (uses node.toml or --config)",
    )
    parser.add_argument("--config", default="", help="with --network: the node's TOML config")
    parser.add_argument(
        "--join", default="", metavar="INVITATION", help="with --network: check this invitation's peers"
    )
    parser.add_argument(
        "--step-timeout",
        type=float,
        default=10.0,
        help="with --network: seconds each step (start, one peer, the dial-back) may take",
    )


def network_main(args: argparse.Namespace) -> int:
    from sapo_core.config import ConfigError

    try:
        swarm_cfg = network_config(args.config, args.join)
    except (ConfigError, ValueError) as e:
        print(f"sapo-node doctor: {e}", file=sys.stderr)
        return 2
    checks = run_network_checks(swarm_cfg, args.step_timeout)
    ok = all(c.status != "fail" for c in checks)
    if args.json:
        print(json.dumps({"ok": ok, "checks": [dataclasses.asdict(c) for c in checks]}, indent=2))
    else:
        print(format_report(checks, "can this node join a swarm?"))
    return 0 if ok else 1


def main(args: argparse.Namespace) -> int:
    if getattr(args, "network", False):
        return network_main(args)
    only = {n.strip() for n in args.only.split(",") if n.strip()} or None
    unknown = sorted((only or set()) - set(CHECK_NAMES))
    if unknown:
        print(
            f"sapo-node doctor: unknown check(s) {', '.join(unknown)}; known: {', '.join(CHECK_NAMES)}", file=sys.stderr
        )
        return 2
    model = Path(args.model).expanduser() if args.model else embedded_model_path()
    data_dir = Path(args.data_dir).expanduser() if args.data_dir else paths.data_dir()
    checks = run_checks(model, data_dir, only, args.timeout)
    ok = all(c.status != "fail" for c in checks)
    if args.json:
        print(json.dumps({"ok": ok, "checks": [dataclasses.asdict(c) for c in checks]}, indent=2))
    else:
        print(format_report(checks))
    return 0 if ok else 1
