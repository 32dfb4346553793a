"""The app stays light: importing it, opening the setup (its hardware scan running) and the main
window, and starting a real node process leave torch, transformers, llama_cpp and hivemind out
of the GUI process (checked in a fresh interpreter, where nothing was imported before). Also
refuses a Qt binding that corrupts reference counts (app/qtcheck.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

HEAVY = ("torch", "transformers", "llama_cpp", "hivemind")

SCRIPT = textwrap.dedent("""
    import json, pkgutil, sys, time, importlib
    import app
    for m in pkgutil.iter_modules(app.__path__):
        if m.name != "__main__":
            importlib.import_module(f"app.{m.name}")
    after_import = sorted(k for k in sys.modules if k.split(".")[0] in HEAVY)

    from PySide6.QtWidgets import QApplication
    from app.bridge import WorkerBridge
    from app.settings import UiSettings
    from app.window import MainWindow
    from app.wizard import SetupWizard

    qapp = QApplication([])
    wizard = SetupWizard()  # starts the hardware scan in a child process
    wizard.show()
    window = MainWindow(WorkerBridge(), UiSettings(), use_tray=True)
    window.show()
    failures = []
    wizard.scanner.failed.connect(failures.append)
    hellos = []
    window.bridge.hello.connect(hellos.append)
    started = window.start_node()
    deadline = time.monotonic() + 120
    while (not hellos or wizard.scanner.running()) and time.monotonic() < deadline:
        qapp.processEvents()
        time.sleep(0.02)
    after_start = sorted(k for k in sys.modules if k.split(".")[0] in HEAVY)
    window.bridge.stop_and_wait(timeout=30)
    wizard.reject()  # as a user closing it: ends the scan and the measuring it starts after
    if wizard.scanner.running() or wizard.measurer.running():
        sys.exit("closing the wizard left a scan running")
    print(json.dumps({"after_import": after_import, "after_start": after_start, "started": started,
                      "hello": bool(hellos), "scanned": wizard.report is not None, "scan_failed": failures}))
""").replace("HEAVY", repr(HEAVY))


@pytest.mark.gui
@pytest.mark.node_process
def test_the_gui_process_never_loads_the_heavy_modules(tmp_path, tmp_path_factory):
    data = tmp_path / "data"
    data.mkdir()
    (data / "node.toml").write_text(
        textwrap.dedent(f"""
        run_dir = "{tmp_path / "run"}"
        [model]
        name = "tiny-random"
        [swarm]
        enabled = false
        [round]
        local_groups = 1
        external_groups = 0
        auto_scale = false
        [sampler]
        backend = "transformers"
        group_size = 2
        max_new_tokens = 8
    """)
    )
    env = {
        **os.environ,
        "QT_QPA_PLATFORM": "offscreen",
        "SAPO_DATA_DIR": str(data),
        "SAPO_CACHE_DIR": str(tmp_path_factory.getbasetemp() / "sapo-cache"),
    }
    out = subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["started"] and result["hello"], result  # a real node process answered
    assert result["scanned"], result["scan_failed"] or out.stderr[-2000:]
    assert result["after_import"] == [] and result["after_start"] == [], result


def test_the_qt_binding_keeps_reference_counts():
    """PySide6 6.12.0 on Python 3.11 loses a reference to None per call of a void method and crashes
    the app within minutes; app.qtcheck detects it, and this install must not have it."""
    from app.qtcheck import binding_problem

    assert binding_problem() == ""
