"""The self-contained package: its launcher, spec and build script (fast, every CI run), and the
built packages in a clean Debian root (`-m package`, needs root and SAPO_PACKAGE_DIR: the build
takes ~15 minutes, so CI checks the parts and `sapo-bench package` the whole; docs/install.md, "Packages")."""

from __future__ import annotations

import ast
import importlib.util
import os
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from sapo_core.bench import package as bench

REPO = Path(__file__).resolve().parent.parent
LAUNCHER = REPO / "installer" / "launcher.py"
SPEC = REPO / "installer" / "sapo-swarm.spec"
SCRIPT = REPO / "installer" / "package.sh"


def _launcher():
    spec = importlib.util.spec_from_file_location("sapo_launcher", LAUNCHER)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _run_launcher(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.run([sys.executable, str(LAUNCHER), *args], capture_output=True, text=True, env=env, timeout=120)


def test_launcher_picks_the_command_by_its_name() -> None:
    launcher = _launcher()
    assert launcher.command_name("/usr/bin/sapo-node") == "sapo-node"
    assert launcher.command_name("/opt/sapo-swarm/sapo-bench") == "sapo-bench"
    assert launcher.command_name(r"C:\Program Files\SAPO Swarm\sapo-experiment.EXE") == "sapo-experiment"
    assert launcher.command_name("/opt/sapo-swarm/sapo-swarm") == "sapo-swarm"
    assert launcher.command_name("/tmp/anything-else") == "sapo-swarm"  # the app, as a double click
    for name, target in launcher.ENTRIES.items():  # each points at a function that exists
        module, _, function = target.partition(":")
        assert callable(getattr(importlib.import_module(module), function)), name


def test_launcher_runs_a_command_by_name(monkeypatch, capsys) -> None:
    launcher = _launcher()
    monkeypatch.setattr(sys, "argv", ["/usr/bin/sapo-node", "--version"])
    with pytest.raises(SystemExit) as stop:
        launcher.main()
    assert stop.value.code == 0
    assert capsys.readouterr().out.strip() == "sapo-node 0.1.0"


def test_launcher_runs_minus_m_and_minus_c_as_python_does() -> None:
    """The app starts its node, doctor and scan as `sys.executable -m ...` and doctor's checks as
    `sys.executable -c CODE ARGS`: in a package, sys.executable is the launcher."""
    done = _run_launcher("-m", "sapo_core.cli", "--version")
    assert done.returncode == 0 and done.stdout.strip() == "sapo-node 0.1.0", done.stderr
    done = _run_launcher("-u", "-c", "import sys; print(sys.argv, __name__); sys.exit(3)", "a", "b")
    assert done.returncode == 3 and done.stdout.strip() == "['-c', 'a', 'b'] __main__", done.stderr
    done = _run_launcher("-c", "raise ValueError('told')")
    assert done.returncode == 1 and "ValueError: told" in done.stderr


def test_spec_names_every_catalogue_architecture() -> None:
    """transformers loads a model's classes by name: the spec must collect each architecture the
    catalogue offers, or that model fails only in the package."""
    tree = ast.parse(SPEC.read_text())
    named = next(
        ast.literal_eval(node.value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", "") == "ARCHITECTURES"
    )
    catalogue = tomllib.loads((REPO / "resources" / "catalog.toml").read_text())
    architectures = {m["architecture"] for m in catalogue["model"]}
    assert architectures and architectures <= named, architectures - named
    assert "installer/launcher.py" in SPEC.read_text().replace('", "', "/")


def test_package_script_usage_and_refusals(tmp_path: Path) -> None:
    assert subprocess.run(["bash", "-n", str(SCRIPT)]).returncode == 0
    done = subprocess.run([str(SCRIPT), "--help"], capture_output=True, text=True)
    assert done.returncode == 0 and "--out DIR" in done.stdout
    for args, said in (([], "--out DIR is required"), (["--out", str(tmp_path), "--frob"], "unknown option --frob")):
        done = subprocess.run([str(SCRIPT), *args], capture_output=True, text=True)
        assert done.returncode == 1 and said in done.stderr, done.stderr
    assert not any(tmp_path.iterdir())
    # PyInstaller is pinned in the lock the build reads, like every other dependency
    lock = (REPO / "installer" / "constraints.txt").read_text().splitlines()
    assert any(line.startswith("pyinstaller==") for line in lock)
    # the .deb depends on the libraries Qt's xcb platform plugin loads (issue: a window that died at start)
    text = SCRIPT.read_text()
    for lib in ("libxcb-cursor0", "libxcb-icccm4", "libxcb-keysyms1", "libxkbcommon-x11-0"):
        assert lib in text


def test_report_line() -> None:
    report = bench.Report(deb_mb=612.4, tarball_mb=640.2, install_s=48.3, first_round_s=81.2, round_s=21.4)
    report.steps = {"install": "ok", "doctor": "ok"}
    assert report.passed
    assert report.line() == (
        "package: .deb 612 MB, tarball 640 MB, install 48 s (goal <= 120 s: met), first round 81 s "
        "(the round itself 21 s), every step passed"
    )
    report.steps["window (xcb)"] = "could not load the Qt platform plugin"
    report.install_s = 130
    assert not report.passed
    assert report.line().endswith(
        "(goal <= 120 s: missed), first round 81 s (the round itself 21 s), "
        "failed: window (xcb): could not load the Qt platform plugin"
    )


@pytest.mark.package
def test_packages_install_and_run_on_a_clean_debian() -> None:
    """The whole check of `sapo-bench package` on packages built beforehand:
    `installer/package.sh --out DIR`, then `SAPO_PACKAGE_DIR=DIR pytest -m package` as root."""
    folder = os.environ.get("SAPO_PACKAGE_DIR")
    if not folder or os.geteuid() != 0:
        pytest.skip("needs root and SAPO_PACKAGE_DIR (a folder installer/package.sh --out wrote)")
    debs = sorted(Path(folder).glob("sapo-swarm_*_amd64.deb"))
    tars = sorted(Path(folder).glob("sapo-swarm-*-linux-x86_64.tar.gz"))
    assert debs and tars, f"{folder} has no .deb and tarball"
    report = bench.check_package(debs[-1], tars[-1], bench.base_root("bookworm", bench.default_cache()))
    assert report.passed, report.steps


def test_doctor_fixes_in_a_package(monkeypatch) -> None:
    """A package has no pip and no installer script: its broken parts are fixed by the package."""
    from sapo_core.commands import doctor

    broken = doctor.Check("torch", "fail", "import torch failed", "pip install --force-reinstall torch")
    assert doctor.packaged_fix(broken).fix == doctor.PACKAGE_FIX
    for untouched in (
        doctor.Check("torch", "ok", "2.13.0"),
        doctor.Check("disk", "fail", "0.2 GiB free", "free space"),
    ):
        assert doctor.packaged_fix(untouched) == untouched
    crash = doctor.Check("llama.cpp", "fail", "running one token crashed (SIGILL)", "rebuild")
    monkeypatch.setattr(doctor, "cpu_flags", lambda: {"sse4_2", "avx"})
    assert "no AVX2" in doctor.packaged_fix(crash).fix and doctor.INSTALLER in doctor.packaged_fix(crash).fix
    for flags in ({"avx", "avx2"}, None):  # None: the flags cannot be read, so the CPU is not blamed
        monkeypatch.setattr(doctor, "cpu_flags", lambda flags=flags: flags)
        assert doctor.packaged_fix(crash).fix == doctor.PACKAGE_FIX


def test_the_platforms_workflow_builds_the_package_from_the_spec() -> None:
    """The Windows and macOS builds cannot run here: what can be checked is that the workflow
    builds them from this spec and runs doctor, a round and the screenshots with the package."""
    import yaml

    job = yaml.safe_load((REPO / ".github" / "workflows" / "platforms.yml").read_text())["jobs"]["package"]
    assert {row["os"] for row in job["strategy"]["matrix"]["include"]} == {"ubuntu-24.04", "macos-14", "windows-2022"}
    text = "\n".join(step.get("run", "") for step in job["steps"])
    assert "installer/sapo-swarm.spec" in text and "installer/package.sh --out" in text
    usage = subprocess.run([str(SCRIPT), "--help"], capture_output=True, text=True).stdout
    for word in text.split():
        if word.startswith("--") and "package.sh" in text.split(word)[0].splitlines()[-1]:
            assert word in usage, (word, "an option package.sh lacks")
    for must in ("-m sapo_core.cli doctor", "-m sapo_core.cli run --alone --rounds 1", "--screenshots"):
        assert must in text, must
    # Windows: the installer wraps the folder (Inno Setup), and its commands are the spec's two executables
    windows = next(row for row in job["strategy"]["matrix"]["include"] if row["os"] == "windows-2022")
    assert windows["exe"].endswith("sapo-node.exe") and windows["app"].endswith("sapo-swarm.exe")
    assert (
        "installer\\\\windows\\\\sapo-swarm.iss" in text
        and (REPO / "installer" / "windows" / "sapo-swarm.iss").is_file()
    )
    spec = SPEC.read_text()
    assert 'executable("sapo-node", console=True)' in spec and 'executable("sapo-swarm", console=' in spec


def test_the_rounds_own_seconds_are_read_from_the_nodes_output() -> None:
    said = (
        "ready in 6 s: model smollm2-135m-instruct, sampler llamacpp, next round 1\n"
        "info: held-out: solve rate 0.151, gain -0.005 (-0.036..+0.026), 81 s\n"
        "round    1  reward 0.188  acc 0.19  groups 4+0 ext  trained 3  sample 73 tok/s  \n"
        "loss +0.1538  drift 0.039  held-out 0.151 (base 0.156)  11 s\n"
        "stopping…\n"
    )
    assert bench.round_seconds(said, 1) == 11.0
    assert bench.round_seconds(said.replace("\nloss", " loss"), 1) == 11.0  # on one line where it is wide enough
    assert bench.round_seconds(said, 2) == 0.0


def test_install_user_puts_the_tarball_where_the_updater_keeps_versions(tmp_path: Path) -> None:
    """installer/install-user.sh on an unpacked folder. The folder is a stand-in (its sapo-swarm
    is a shell script answering --version): the real one runs in `sapo-bench package`."""
    from sapo_core import updates

    unpacked = tmp_path / "Downloads" / "sapo-swarm-0.1.0-linux-x86_64"
    unpacked.mkdir(parents=True)
    launcher = unpacked / "sapo-swarm"
    launcher.write_text('#!/bin/sh\n[ "$*" = "-m sapo_core.cli --version" ] && echo "sapo-node 0.1.0"\n')
    launcher.chmod(0o755)
    (unpacked / "sapo-node").symlink_to("sapo-swarm")
    for name, source in (
        ("install-user.sh", "installer/install-user.sh"),
        ("sapo-swarm.desktop", "resources/sapo-swarm.desktop"),
        ("sapo-swarm.svg", "resources/sapo-swarm.svg"),
    ):
        (unpacked / name).write_bytes((REPO / source).read_bytes())
    (unpacked / "install-user.sh").chmod(0o755)
    home = tmp_path / "home"
    runs = home / ".local" / "share" / "sapo-swarm" / "runs" / "default"
    runs.mkdir(parents=True)
    env = {"HOME": str(home), "PATH": "/usr/bin:/bin"}
    for _ in range(2):  # a second run changes nothing but says the same
        done = subprocess.run([str(unpacked / "install-user.sh")], capture_output=True, text=True, env=env)
        assert done.returncode == 0 and "SAPO Swarm 0.1.0 is installed" in done.stdout, done.stderr
    root = home / ".local" / "share" / "sapo-swarm" / "app"
    assert os.readlink(root / "current") == "versions/0.1.0" and (root / "versions" / "0.1.0" / "sapo-swarm").is_file()
    node = home / ".local" / "bin" / "sapo-node"
    assert (
        subprocess.run([str(node), "-m", "sapo_core.cli", "--version"], capture_output=True, text=True).stdout
        == "sapo-node 0.1.0\n"
    )
    where = updates.installation(os.path.realpath(node), frozen=True)
    assert where == updates.Installation("tarball", "linux-x86_64-tar", root)  # so it updates itself
    entry = (home / ".local" / "share" / "applications" / "sapo-swarm.desktop").read_text()
    assert f"Exec={root}/current/sapo-swarm %u" in entry and "x-scheme-handler/sapo" in entry and "@" not in entry
    done = subprocess.run([str(unpacked / "install-user.sh"), "--uninstall"], capture_output=True, text=True, env=env)
    assert done.returncode == 0 and not root.exists() and not node.is_symlink() and runs.is_dir()
    bad = subprocess.run([str(unpacked / "install-user.sh"), "--frob"], capture_output=True, text=True, env=env)
    assert bad.returncode == 1 and "unknown option --frob" in bad.stderr
