"""What this machine has: CPU cores, RAM, free disk, CUDA GPUs, Apple MPS.

Detection reports, it doesn't decide silently: every value is a
`Detected(value, reason)` whose reason says how it was found ("psutil.virtual_memory()")
or that it was overridden ("override SAPO_RAM_GB=8"). Overrides come from an explicit
mapping (the `--override` option of `sapo-node hardware`) or the environment; the explicit
mapping wins. Recognised keys:

    SAPO_CPU_CORES         physical cores to count on
    SAPO_CPU_THREADS       logical CPUs
    SAPO_RAM_GB            total RAM
    SAPO_RAM_AVAILABLE_GB  RAM free for the node (defaults to SAPO_RAM_GB when only that is given)
    SAPO_DISK_GB           free disk in the data directory
    SAPO_GPU_MEMORY_GB     memory of GPU 0 (creates a pretend GPU when none is detected)
    SAPO_DEVICE            cpu | cuda | mps: where training runs

torch is imported only inside `detect_hardware` (and only to probe CUDA/MPS), so importing
this module stays light. `HardwareProfile.manual(...)` builds a profile by hand for tests
and what-if questions ("what would an 8 GB laptop run?").
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Generic, TypeVar

T = TypeVar("T")
GB = 1e9
DEVICES = ("cpu", "cuda", "mps")
OVERRIDE_KEYS = (
    "SAPO_CPU_CORES",
    "SAPO_CPU_THREADS",
    "SAPO_RAM_GB",
    "SAPO_RAM_AVAILABLE_GB",
    "SAPO_DISK_GB",
    "SAPO_GPU_MEMORY_GB",
    "SAPO_DEVICE",
)


class HardwareOverrideError(ValueError):
    """An override value is malformed; the message names the key and an example."""


@dataclass(frozen=True)
class Detected(Generic[T]):
    value: T
    reason: str


@dataclass(frozen=True)
class GpuInfo:
    index: int
    name: str
    memory_gb: float


@dataclass(frozen=True)
class HardwareProfile:
    cpu_physical: Detected[int]
    cpu_logical: Detected[int]
    ram_total_gb: Detected[float]
    ram_available_gb: Detected[float]
    disk_free_gb: Detected[float]
    gpus: Detected[tuple[GpuInfo, ...]]
    mps: Detected[bool]
    device: Detected[str]  # where training runs: cpu | cuda | mps
    data_dir: str = ""

    @property
    def gpu_memory_gb(self) -> float:
        """Memory of the GPU training would use (GPU 0); 0 without one."""
        return self.gpus.value[0].memory_gb if self.gpus.value else 0.0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def manual(
        cls,
        cpu_cores: int = 4,
        ram_gb: float = 16.0,
        ram_available_gb: float | None = None,
        disk_gb: float = 100.0,
        gpu_memory_gb: float = 0.0,
        mps: bool = False,
        device: str | None = None,
        cpu_threads: int | None = None,
    ) -> HardwareProfile:
        """A profile described by hand (tests, what-if); every reason says 'given'."""
        gpus = (GpuInfo(0, "given GPU", float(gpu_memory_gb)),) if gpu_memory_gb > 0 else ()
        if device is None:
            device = "cuda" if gpus else "mps" if mps else "cpu"
        if device not in DEVICES:
            raise HardwareOverrideError(f"device '{device}' is not one of {', '.join(DEVICES)}")
        return cls(
            cpu_physical=Detected(int(cpu_cores), "given"),
            cpu_logical=Detected(int(cpu_threads or cpu_cores), "given"),
            ram_total_gb=Detected(float(ram_gb), "given"),
            ram_available_gb=Detected(float(ram_gb if ram_available_gb is None else ram_available_gb), "given"),
            disk_free_gb=Detected(float(disk_gb), "given"),
            gpus=Detected(gpus, "given"),
            mps=Detected(bool(mps), "given"),
            device=Detected(device, "given"),
        )


# --- detection --------------------------------------------------------------------------


def _number(key: str, raw: str, integer: bool = False) -> float:
    try:
        value = int(raw) if integer else float(raw)
    except ValueError:
        example = "4" if integer else "8"
        raise HardwareOverrideError(
            f"{key}={raw!r} is not a {'whole ' if integer else ''}number; e.g. {key}={example}"
        ) from None
    if value <= 0:
        raise HardwareOverrideError(f"{key}={raw!r} must be above 0")
    return value


def _merged_overrides(overrides: Mapping[str, str] | None, env: Mapping[str, str]) -> dict[str, tuple[str, str]]:
    """key -> (value, where from); explicit overrides beat the environment."""
    out: dict[str, tuple[str, str]] = {}
    for key in OVERRIDE_KEYS:
        if env.get(key):
            out[key] = (env[key], "environment")
    for key, value in (overrides or {}).items():
        if key not in OVERRIDE_KEYS:
            raise HardwareOverrideError(f"unknown hardware override {key!r}; known: {', '.join(OVERRIDE_KEYS)}")
        out[key] = (str(value), "override")
    return out


def _cgroup_memory_limit() -> int | None:
    """A container's memory limit (cgroup v2, then v1), when lower than the machine's RAM."""
    for path in ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"):
        try:
            text = Path(path).read_text().strip()
        except OSError:
            continue
        if text.isdigit() and int(text) < 1 << 60:
            return int(text)
    return None


def _detect_cpu() -> tuple[Detected[int], Detected[int]]:
    import psutil

    if hasattr(os, "sched_getaffinity"):
        logical = Detected(len(os.sched_getaffinity(0)), "os.sched_getaffinity(0) (CPUs this process may use)")
    else:
        logical = Detected(psutil.cpu_count(logical=True) or 1, "psutil.cpu_count(logical=True)")
    physical = psutil.cpu_count(logical=False)
    if not physical:
        return Detected(logical.value, "psutil could not count physical cores; using logical CPUs"), logical
    if physical > logical.value:
        return Detected(
            logical.value,
            f"psutil.cpu_count(logical=False)={physical}, capped at the {logical.value} CPUs this process may use",
        ), logical
    return Detected(physical, "psutil.cpu_count(logical=False)"), logical


def _detect_ram() -> tuple[Detected[float], Detected[float]]:
    import psutil

    vm = psutil.virtual_memory()
    total = Detected(vm.total / GB, "psutil.virtual_memory().total")
    available = Detected(vm.available / GB, "psutil.virtual_memory().available")
    limit = _cgroup_memory_limit()
    if limit is not None and limit < vm.total:
        total = Detected(limit / GB, "container memory limit (cgroup)")
        available = Detected(
            min(vm.available, limit) / GB, "psutil.virtual_memory().available, capped at the container memory limit"
        )
    return total, available


def _detect_disk(data_dir: Path) -> Detected[float]:
    import psutil

    probe = data_dir
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    return Detected(psutil.disk_usage(str(probe)).free / GB, f"psutil.disk_usage({str(probe)!r}).free")


def _detect_accelerators() -> tuple[Detected[tuple[GpuInfo, ...]], Detected[bool]]:
    try:
        import torch
    except ImportError:
        why = "torch is not installed, so CUDA and MPS were not probed"
        return Detected((), why), Detected(False, why)
    if torch.cuda.is_available():
        gpus = tuple(
            GpuInfo(i, torch.cuda.get_device_name(i), torch.cuda.get_device_properties(i).total_memory / GB)
            for i in range(torch.cuda.device_count())
        )
        cuda = Detected(gpus, f"torch.cuda: {len(gpus)} device(s), torch {torch.__version__}")
    else:
        build = "a CPU-only build" if torch.version.cuda is None else f"built for CUDA {torch.version.cuda}"
        cuda = Detected((), f"torch.cuda.is_available() is False (torch {torch.__version__}, {build})")
    mps_backend = getattr(torch.backends, "mps", None)
    has_mps = bool(mps_backend and mps_backend.is_available())
    mps = Detected(has_mps, f"torch.backends.mps.is_available() is {has_mps}")
    return cuda, mps


def detect_hardware(
    overrides: Mapping[str, str] | None = None,
    env: Mapping[str, str] = os.environ,
    data_dir: str | os.PathLike | None = None,
    probe_torch: bool = True,
) -> HardwareProfile:
    """Detect this machine, then apply overrides (explicit mapping first, then environment)."""
    if data_dir is None:
        from sapo_core import paths

        data_dir = paths.data_dir()
    data_path = Path(data_dir).expanduser()
    ov = _merged_overrides(overrides, env)

    def overridden(key: str, detected: Detected, integer: bool = False) -> Detected:
        if key not in ov:
            return detected
        raw, where = ov[key]
        return Detected(_number(key, raw, integer), f"{where} {key}={raw}")

    physical, logical = _detect_cpu()
    physical = overridden("SAPO_CPU_CORES", physical, integer=True)
    logical = overridden("SAPO_CPU_THREADS", logical, integer=True)
    if "SAPO_CPU_CORES" in ov and "SAPO_CPU_THREADS" not in ov and logical.value < physical.value:
        logical = Detected(physical.value, f"{physical.reason} (threads at least the cores)")

    total, available = _detect_ram()
    total = overridden("SAPO_RAM_GB", total)
    if "SAPO_RAM_GB" in ov and "SAPO_RAM_AVAILABLE_GB" not in ov:
        available = Detected(total.value, f"{total.reason} (all of it, as no SAPO_RAM_AVAILABLE_GB was given)")
    available = overridden("SAPO_RAM_AVAILABLE_GB", available)

    disk = overridden("SAPO_DISK_GB", _detect_disk(data_path))

    if probe_torch:
        gpus, mps = _detect_accelerators()
    else:
        gpus, mps = Detected((), "not probed (probe_torch=False)"), Detected(False, "not probed (probe_torch=False)")
    if "SAPO_GPU_MEMORY_GB" in ov:
        raw, where = ov["SAPO_GPU_MEMORY_GB"]
        mem = _number("SAPO_GPU_MEMORY_GB", raw)
        first = gpus.value[0] if gpus.value else GpuInfo(0, "pretend GPU", mem)
        gpus = Detected(
            (GpuInfo(first.index, first.name, mem),) + tuple(gpus.value[1:]), f"{where} SAPO_GPU_MEMORY_GB={raw}"
        )

    if "SAPO_DEVICE" in ov:
        raw, where = ov["SAPO_DEVICE"]
        if raw not in DEVICES:
            raise HardwareOverrideError(f"SAPO_DEVICE={raw!r} is not one of {', '.join(DEVICES)}")
        device = Detected(raw, f"{where} SAPO_DEVICE={raw}")
    elif gpus.value:
        device = Detected("cuda", f"a CUDA GPU is present: {gpus.value[0].name}")
    elif mps.value:
        device = Detected("mps", "Apple MPS is available")
    else:
        device = Detected("cpu", "no CUDA GPU and no Apple MPS")

    return HardwareProfile(
        cpu_physical=physical,
        cpu_logical=logical,
        ram_total_gb=total,
        ram_available_gb=available,
        disk_free_gb=disk,
        gpus=gpus,
        mps=mps,
        device=device,
        data_dir=str(data_path),
    )


__all__ = [
    "Detected",
    "GpuInfo",
    "HardwareProfile",
    "HardwareOverrideError",
    "detect_hardware",
    "OVERRIDE_KEYS",
    "DEVICES",
]


class DeviceUnavailable(RuntimeError):
    """train.device names a device this machine's torch cannot use."""


def training_device(setting: str = "auto", environ: Mapping[str, str] | None = None) -> Detected[str]:
    """Where the update runs (`train.device`): cpu or cuda, and why.

    auto: SAPO_DEVICE where it is set, else cuda when torch sees a CUDA GPU, else cpu. Apple MPS
    trains on the CPU: the update has never run on MPS. A pretend GPU (SAPO_GPU_MEMORY_GB, for
    what-if estimates) never moves the update. train.device = cuda where torch has none raises
    `DeviceUnavailable` with what to do; auto (SAPO_DEVICE=cuda included) falls back to the CPU
    and says so."""
    import torch

    env = os.environ if environ is None else environ
    cuda = torch.cuda.is_available()
    if setting == "auto" and env.get("SAPO_DEVICE"):
        setting, given = env["SAPO_DEVICE"], f"SAPO_DEVICE={env['SAPO_DEVICE']}"
    elif setting != "auto":
        given = f"train.device = {setting}"
    else:
        if cuda:
            return Detected("cuda", f"a CUDA GPU is present: {torch.cuda.get_device_name(0)}")
        return Detected("cpu", "no CUDA GPU that torch can use")
    if setting == "cuda":
        if cuda:
            return Detected("cuda", f"{given}: {torch.cuda.get_device_name(0)}")
        build = "a CPU-only build" if torch.version.cuda is None else f"built for CUDA {torch.version.cuda}"
        if given.startswith("SAPO_DEVICE"):  # asked for through auto: say it, train on the CPU
            return Detected("cpu", f"{given}, but torch sees no CUDA GPU (torch {torch.__version__}, {build})")
        raise DeviceUnavailable(
            f"{given}, but torch.cuda.is_available() is False (torch {torch.__version__}, {build}): "
            "install torch with CUDA (https://pytorch.org/get-started/locally/) or set train.device = cpu"
        )
    if setting == "mps":
        return Detected("cpu", f"{given}: the update runs on the CPU (it has not been tried on Apple MPS)")
    return Detected("cpu", given)
