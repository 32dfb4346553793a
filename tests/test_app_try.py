"""The Try it tab and the Export… dialog on the embedded model, offscreen (pytest-qt).

Both run a real `sapo-node` child process over a real run directory (helpers.make_run:
the embedded model with a non-zero adapter), and the tests wait for their signals.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from helpers import make_run

pytestmark = [pytest.mark.gui, pytest.mark.slow, pytest.mark.node_process]


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("run")
    make_run(d)
    return d


def test_try_draws_a_question_and_shows_both_answers_with_rewards(qtbot, run_dir):
    from app.try_view import TryView

    view = TryView()
    qtbot.addWidget(view)
    view.run_dir, view.max_new_tokens = str(run_dir), 12
    with qtbot.waitSignal(view.answered, timeout=600_000) as blocker:
        view.ask(None, seed=3)
        assert not view.ask_button.isEnabled()  # one question at a time
    r = blocker.args[0]
    assert r["reference"] and r["round"] == 3
    for k in ("base", "trained"):
        assert isinstance(r[k]["reward"], float)
        assert view.answers[k].toPlainText() == (r[k]["text"] or "(empty answer)")
        assert f"reward <b>{r[k]['reward']:.2f}</b>" in view.headers[k].text()
    assert view.question.text() == r["question"] and view.ask_button.isEnabled()


def test_try_without_a_run_says_why(qtbot, tmp_path):
    from app.try_view import TryView

    view = TryView()
    qtbot.addWidget(view)
    view.run_dir = str(tmp_path / "none")
    with qtbot.waitSignal(view.failed, timeout=120_000) as blocker:
        view.ask("What is 2 + 2?")
    assert "no config.toml" in blocker.args[0] and "Could not answer" in view.status.text()


def test_export_dialog_runs_the_export_with_progress(qtbot, run_dir, tmp_path):
    from app.export_dialog import ExportDialog

    dialog = ExportDialog(str(run_dir))
    qtbot.addWidget(dialog)
    dialog.format.setCurrentIndex(dialog.format.findData("peft"))
    assert not dialog.quant.isEnabled()  # only GGUF has a weight type
    dialog.output.setText(str(tmp_path / "adapter"))
    seen: list[int] = []
    dialog.progress.valueChanged.connect(seen.append)
    with qtbot.waitSignal(dialog.exported, timeout=600_000) as blocker:
        dialog.start()
    ok, folder = blocker.args
    assert ok and Path(folder) == tmp_path / "adapter"
    assert (tmp_path / "adapter" / "adapter_model.safetensors").is_file()
    assert dialog.progress.value() == 100 and len(set(seen)) >= 3  # it moved through the steps
