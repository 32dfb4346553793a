"""Updates in the window (app/updater.py, app/update_flow.py), offscreen, against TUF repositories
served by a real HTTPS server on loopback: the bar offers a signed newer release; with the node
training, "Update now" waits for the round (pause after the round, then stop), installs the
package into a tarball installation and offers a restart; a package that is not the signed one
leaves the installed version and starts the node again; a repository signed by keys this copy
does not trust offers nothing; expired metadata says this copy cannot confirm it is up to date."""

from __future__ import annotations

import os
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from app.bridge import WorkerBridge
from app.settings import UiSettings
from app.updater import Updater
from app.window import MainWindow
from sapo_core import updates
from sapo_core.config import save_config
from sapo_core.control import protocol as P

from helpers import light_config, publish_release, update_keys, update_repository

pytestmark = pytest.mark.gui
START_MS = 300_000


@pytest.fixture(scope="module")
def signers(tmp_path_factory):
    return update_keys(tmp_path_factory.mktemp("keys"))


def _repository(server, signers, name: str, **options):
    """A repository on the server: (Repository, its URL, the root a copy ships)."""
    repo, root = update_repository(server["root"] / name, signers, **options)
    return repo, f"{server['url']}/{name}", root


def _installed(root: Path) -> updates.Installation:
    (root / "versions/0.1.0").mkdir(parents=True)
    (root / "versions/0.1.0/sapo-swarm").write_text("the installed one")
    os.symlink("versions/0.1.0", root / "current")
    return updates.installation(str(root / "versions/0.1.0/sapo-swarm"), frozen=True)


def _window(tmp_path, tmp_path_factory, monkeypatch, server, root: bytes, url: str, node: bool = False) -> MainWindow:
    data = tmp_path / "data"
    monkeypatch.setenv("SAPO_DATA_DIR", str(data))
    monkeypatch.setenv("SAPO_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "sapo-cache"))
    data.mkdir()
    if node:
        save_config(light_config(data / "run", max_new_tokens=8), data / "node.toml")
    settings = UiSettings()
    settings.set("updates/url", url)
    where = _installed(tmp_path / "app")
    updater = Updater(settings, where=where, context=server["context"], root=root)
    w = MainWindow(WorkerBridge(heartbeat_timeout=180), settings, use_tray=False, updater=updater)
    w.show()
    return w


def _check(qtbot, w: MainWindow) -> list[str]:
    """Check now; the lines the check logged, once the window has shown what it found."""
    lines: list[str] = []
    updater = w.update_flow.updater
    updater.checked.connect(lines.append)
    updater.unconfirmed.connect(lines.append)
    assert updater.check_now()
    final = ("no newer release", "SAPO Swarm", "update check failed", "the update information")
    qtbot.waitUntil(lambda: any(line.startswith(final) for line in lines), timeout=20_000)
    if lines[-1].startswith(("SAPO Swarm", "the update information")):
        qtbot.waitUntil(w.update_flow.bar.isVisible, timeout=5_000)
    updater.checked.disconnect(lines.append)
    updater.unconfirmed.disconnect(lines.append)
    return lines


def test_a_repository_signed_by_other_keys_offers_nothing(
    qtbot, tmp_path, tmp_path_factory, monkeypatch, server, signers
):
    (tmp_path / "stranger").mkdir()
    theirs = update_keys(tmp_path / "stranger")
    stranger, url, _ = _repository(server, theirs, "stranger")
    publish_release(stranger, theirs, "0.9.0")
    _, _, ours = _repository(server, signers, "ours")  # the root this copy ships
    w = _window(tmp_path, tmp_path_factory, monkeypatch, server, ours, url)
    lines = _check(qtbot, w)
    assert "not signed by the keys this copy trusts" in lines[0] and w.update_flow.bar.isHidden()
    assert "no newer release" in lines[-1]
    qtbot.waitUntil(lambda: any("not signed by the keys" in line.text for line in w.log.lines), timeout=5_000)
    assert os.readlink(tmp_path / "app/current") == "versions/0.1.0"


def test_expired_metadata_says_this_copy_cannot_confirm_it_is_up_to_date(
    qtbot, tmp_path, tmp_path_factory, monkeypatch, server, signers
):
    signed_at = [datetime.now(UTC) - timedelta(days=5)]  # the project stopped signing five days ago
    repo, url, root = _repository(server, signers, "stale", clock=lambda: signed_at[0])
    publish_release(repo, signers, "0.9.0", "Rounds a third faster.")
    w = _window(tmp_path, tmp_path_factory, monkeypatch, server, root, url)
    _check(qtbot, w)
    bar = w.update_flow.bar
    assert "cannot confirm it is up to date" in bar.label.text() and "2 days ago" in bar.label.text()
    assert "holding back news of releases" in bar.label.text() and "0.9.0" not in bar.label.text()
    assert bar.check_button.isVisible() and bar.update_button.isHidden()
    assert "Cannot confirm" in w.update_flow.settings_group.status_label.text()
    assert any(line.level == "warning" and "expired on" in line.text for line in w.log.lines)
    # the project signs again: Check again finds the release
    signed_at[0] = datetime.now(UTC)
    repo.resign({"snapshot": signers["snapshot"], "timestamp": signers["timestamp"]})
    bar.check_button.click()
    qtbot.waitUntil(lambda: "0.9.0 is available" in bar.label.text(), timeout=20_000)
    assert bar.update_button.isVisible() and bar.check_button.isHidden()
    assert os.readlink(tmp_path / "app/current") == "versions/0.1.0"


@pytest.mark.node_process
def test_update_now_waits_for_the_round_installs_and_a_bad_package_restarts_the_node(
    qtbot, tmp_path, tmp_path_factory, monkeypatch, server, signers
):
    repo, url, root = _repository(server, signers, "node")
    truncated = lambda p: p[: len(p) // 2]  # noqa: E731 (cut on the wire)
    publish_release(repo, signers, "0.8.0", "Rounds a third faster.", served=truncated)
    w = _window(tmp_path, tmp_path_factory, monkeypatch, server, root, url, node=True)
    states: list[str] = []
    w.bridge.state_changed.connect(lambda ev: states.append(ev.state))
    bar = w.update_flow.bar
    try:
        assert w.start_node()
        qtbot.waitSignal(w.bridge.round_done, timeout=START_MS).wait()
        _check(qtbot, w)
        assert bar.isVisible() and "0.8.0 is available" in bar.label.text()
        assert "Rounds a third faster." in bar.label.text()
        # a package that is not the signed one: nothing installed, and the node trains again
        with qtbot.waitSignal(w.update_flow.updater.done, timeout=START_MS) as done:
            bar.update_button.click()
        assert done.args[0] is False and "the signed metadata says" in done.args[1]
        assert os.readlink(tmp_path / "app/current") == "versions/0.1.0"
        assert bar.update_button.text() == "Try again" and bar.restart_button.isHidden()
        assert states.index(P.PAUSED) < states.index(P.STOPPED)  # paused after its round, then stopped
        qtbot.waitUntil(lambda: w.bridge.running, timeout=10_000)
        qtbot.waitSignal(w.bridge.round_done, timeout=START_MS).wait()

        # the signed package: installed into the tarball installation, and a restart offered
        publish_release(repo, signers, "0.9.0")
        _check(qtbot, w)
        states.clear()
        with qtbot.waitSignal(w.update_flow.updater.done, timeout=START_MS) as done:
            bar.update_button.click()
            assert "Waiting for the node to finish its round" in bar.label.text()
        assert done.args[0] is True and "0.9.0 is installed" in done.args[1]
        assert P.PAUSING in states and states.index(P.PAUSED) < states.index(P.STOPPED)
        assert not w.bridge.running  # it stays stopped: the new version starts it
        assert os.readlink(tmp_path / "app/current") == "versions/0.9.0"
        assert (tmp_path / "app/current/sapo-swarm").read_bytes().endswith(b"echo 0.9.0\n")
        assert bar.restart_button.isVisible() and bar.update_button.isHidden()
    finally:
        if w.bridge.running:
            w.bridge.stop_and_wait(timeout=30)
        w.deleteLater()


def test_a_source_copy_is_told_what_to_run_instead(qtbot, tmp_path, tmp_path_factory, monkeypatch, server, signers):
    repo, url, root = _repository(server, signers, "src")
    publish_release(repo, signers, "0.9.1")
    w = _window(tmp_path, tmp_path_factory, monkeypatch, server, root, url)
    w.update_flow.updater.where = updates.Installation("source", "")
    _check(qtbot, w)
    assert w.update_flow.bar.isVisible() and "git pull" in w.update_flow.bar.label.text()
    assert w.update_flow.bar.update_button.isHidden()
