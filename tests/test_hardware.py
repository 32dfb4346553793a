"""Hardware detection on this machine, overrides, hand-made profiles, and `sapo-node hardware`.

Detection runs for real here (psutil, torch); there is no GPU, so a GPU appears only through
the SAPO_GPU_MEMORY_GB override or `HardwareProfile.manual`, as the override's reason says.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

from sapo_core.catalog import load_catalogue
from sapo_core.config import NodeConfig
from sapo_core.hardware import DEVICES, HardwareOverrideError, HardwareProfile, detect_hardware


def test_detects_this_machine(tmp_path: Path) -> None:
    p = detect_hardware(env={}, data_dir=tmp_path)
    assert p.cpu_logical.value == len(os.sched_getaffinity(0))
    assert 1 <= p.cpu_physical.value <= p.cpu_logical.value
    assert p.cpu_physical.value == min(psutil.cpu_count(logical=False), p.cpu_logical.value)
    assert (
        p.ram_total_gb.value == pytest.approx(psutil.virtual_memory().total / 1e9, rel=1e-6)
        or "cgroup" in p.ram_total_gb.reason
    )
    assert 0 < p.ram_available_gb.value <= p.ram_total_gb.value
    assert p.disk_free_gb.value == pytest.approx(psutil.disk_usage(str(tmp_path)).free / 1e9, rel=0.01)
    assert p.device.value in DEVICES
    import torch

    assert bool(p.gpus.value) == torch.cuda.is_available()
    assert (p.device.value == "cuda") == torch.cuda.is_available()
    for d in (
        p.cpu_physical,
        p.cpu_logical,
        p.ram_total_gb,
        p.ram_available_gb,
        p.disk_free_gb,
        p.gpus,
        p.mps,
        p.device,
    ):
        assert d.reason and "override" not in d.reason
    assert "psutil" in p.ram_total_gb.reason + p.cpu_physical.reason
    json.dumps(p.to_dict())  # the --json output


def test_disk_of_a_data_dir_not_made_yet_is_its_nearest_parent(tmp_path: Path) -> None:
    p = detect_hardware(env={}, data_dir=tmp_path / "a" / "b", probe_torch=False)
    assert repr(str(tmp_path)) in p.disk_free_gb.reason
    assert p.gpus.value == () and "not probed" in p.gpus.reason


def test_environment_overrides_carry_their_reason(tmp_path: Path) -> None:
    env = {"SAPO_RAM_GB": "8", "SAPO_CPU_CORES": "6", "SAPO_DISK_GB": "12.5"}
    p = detect_hardware(env=env, data_dir=tmp_path, probe_torch=False)
    assert (p.ram_total_gb.value, p.ram_total_gb.reason) == (8.0, "environment SAPO_RAM_GB=8")
    assert p.ram_available_gb.value == 8.0 and "SAPO_RAM_AVAILABLE_GB" in p.ram_available_gb.reason
    assert p.cpu_physical.value == 6 and p.cpu_logical.value >= 6
    assert p.disk_free_gb.value == 12.5


def test_explicit_overrides_beat_the_environment(tmp_path: Path) -> None:
    p = detect_hardware(
        {"SAPO_RAM_GB": "32", "SAPO_RAM_AVAILABLE_GB": "20"},
        env={"SAPO_RAM_GB": "8"},
        data_dir=tmp_path,
        probe_torch=False,
    )
    assert (p.ram_total_gb.value, p.ram_available_gb.value) == (32.0, 20.0)
    assert p.ram_total_gb.reason == "override SAPO_RAM_GB=32"


def test_a_pretend_gpu_makes_cuda_the_device_unless_told_otherwise(tmp_path: Path) -> None:
    p = detect_hardware({"SAPO_GPU_MEMORY_GB": "24"}, env={}, data_dir=tmp_path)
    assert p.gpu_memory_gb == 24.0 and p.device.value == "cuda" and "SAPO_GPU_MEMORY_GB=24" in p.gpus.reason
    cpu = detect_hardware({"SAPO_GPU_MEMORY_GB": "24", "SAPO_DEVICE": "cpu"}, env={}, data_dir=tmp_path)
    assert (cpu.device.value, cpu.device.reason) == ("cpu", "override SAPO_DEVICE=cpu")


@pytest.mark.parametrize(
    "overrides, message",
    [
        ({"SAPO_RAM_GB": "lots"}, "SAPO_RAM_GB='lots' is not a number; e.g. SAPO_RAM_GB=8"),
        ({"SAPO_CPU_CORES": "2.5"}, "SAPO_CPU_CORES='2.5' is not a whole number"),
        ({"SAPO_DISK_GB": "-1"}, "must be above 0"),
        ({"SAPO_DEVICE": "tpu"}, "SAPO_DEVICE='tpu' is not one of cpu, cuda, mps"),
        ({"SAPO_RAM": "8"}, "unknown hardware override 'SAPO_RAM'"),
    ],
)
def test_bad_overrides_say_what_to_write(tmp_path: Path, overrides: dict, message: str) -> None:
    with pytest.raises(HardwareOverrideError, match=re.escape(message)):
        detect_hardware(overrides, env={}, data_dir=tmp_path, probe_torch=False)


def test_manual_profiles_for_tests_and_what_ifs() -> None:
    laptop = HardwareProfile.manual(cpu_cores=4, ram_gb=8, ram_available_gb=6)
    assert (laptop.device.value, laptop.gpu_memory_gb, laptop.ram_available_gb.value) == ("cpu", 0.0, 6.0)
    assert laptop.ram_total_gb.reason == "given"
    assert HardwareProfile.manual(gpu_memory_gb=8).device.value == "cuda"
    assert HardwareProfile.manual(mps=True).device.value == "mps"
    with pytest.raises(HardwareOverrideError):
        HardwareProfile.manual(device="tpu")


def test_importing_the_module_does_not_import_torch() -> None:
    code = "import sys, sapo_core.hardware, sapo_core.catalog; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.stdout.strip() == "False", out.stderr


# --- sapo-node hardware -----------------------------------------------------------------


def _sapo_node(*args: str, data_dir: Path) -> subprocess.CompletedProcess:
    env = dict(os.environ, SAPO_DATA_DIR=str(data_dir), COLUMNS="200")
    return subprocess.run(
        [sys.executable, "-m", "sapo_core.cli", "hardware", *args], capture_output=True, text=True, timeout=120, env=env
    )


def test_cli_json_has_the_profile_the_choice_and_every_verdict(tmp_path: Path) -> None:
    out = _sapo_node("--json", "--override", "SAPO_RAM_GB=8", "--override", "SAPO_CPU_CORES=4", data_dir=tmp_path)
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    assert data["profile"]["ram_total_gb"] == {"value": 8.0, "reason": "override SAPO_RAM_GB=8"}
    assert data["ram_budget_gb"] == pytest.approx(6.4)
    ids = load_catalogue().ids()
    assert sorted(m["id"] for m in data["models"]) == sorted(ids)
    # 4 cores, packed prompts and half the layers checkpointed: Qwen2.5-0.5B's round (~234 s) is
    # under the 240 s target, Qwen3-0.6B's (~282 s) is not
    assert data["choice"]["model"] == "qwen2.5-0.5b-instruct"
    assert data["choice"]["micro_batch_size"] == NodeConfig().train.micro_batch_size
    for m in data["models"]:
        assert m["status"] in ("fits", "slow", "doesn't fit") and m["reason"].startswith(m["status"])
        assert m["memory_gb"]["host"] > 0 and m["round_estimate"]["seconds"] > 0


def test_cli_table_for_humans(tmp_path: Path) -> None:
    out = _sapo_node("--model", "qwen2.5-1.5b-instruct", "--override", "SAPO_RAM_GB=8", data_dir=tmp_path)
    assert out.returncode == 0, out.stderr
    assert "This machine" in out.stdout and "override SAPO_RAM_GB=8" in out.stdout
    for model_id in load_catalogue().ids():
        assert model_id in out.stdout
    assert "named in the config" in out.stdout and "warning:" in out.stdout


def test_cli_reports_bad_input_and_exits_2(tmp_path: Path) -> None:
    out = _sapo_node("--override", "SAPO_RAM_GB=lots", data_dir=tmp_path)
    assert out.returncode == 2 and "SAPO_RAM_GB='lots' is not a number" in out.stderr
    out = _sapo_node("--model", "gpt-5", data_dir=tmp_path)
    assert out.returncode == 2 and "not in the catalogue" in out.stderr
