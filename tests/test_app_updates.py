"""Updates in the window (app/updater.py), offscreen, against a real HTTPS server on loopback: the
bar offers a signed newer release; with the node training, "Update now" waits for the round
(pause after the round, then stop), installs the package into a tarball installation and offers
a restart; a package that is not the signed one leaves the installed version and starts the node
again; a wrongly signed manifest offers nothing."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from app.bridge import WorkerBridge
from app.settings import UiSettings
from app.updater import Updater
from app.window import MainWindow
from sapo_core import updates
from sapo_core.config import save_config
from sapo_core.control import protocol as P
from sapo_core.swarm.signedlist import sign_list

from helpers import light_config, release_manifest, release_tarball

pytestmark = pytest.mark.gui
START_MS = 300_000


def _publish(server, key, name: str, version: str, served: bytes | None = None) -> str:
    """A manifest naming `version`'s package (the server sends `served` instead, if given)."""
    package = release_tarball(version)
    (server["root"] / f"{name}.tar.gz").write_bytes(package if served is None else served(package))
    text = release_manifest(1, version, f"{server['url']}/{name}.tar.gz", package, "Rounds a third faster.")
    (server["root"] / f"{name}.toml").write_text(sign_list(text, key))
    return f"{server['url']}/{name}.toml"


def _installed(root: Path) -> updates.Installation:
    (root / "versions/0.1.0").mkdir(parents=True)
    (root / "versions/0.1.0/sapo-swarm").write_text("the installed one")
    os.symlink("versions/0.1.0", root / "current")
    return updates.installation(str(root / "versions/0.1.0/sapo-swarm"), frozen=True)


def _window(tmp_path, tmp_path_factory, monkeypatch, server, keys, url: str, node: bool = False) -> MainWindow:
    data = tmp_path / "data"
    monkeypatch.setenv("SAPO_DATA_DIR", str(data))
    monkeypatch.setenv("SAPO_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "sapo-cache"))
    data.mkdir()
    if node:
        save_config(light_config(data / "run", max_new_tokens=8), data / "node.toml")
    settings = UiSettings()
    settings.set("updates/url", url)
    where = _installed(tmp_path / "app")
    updater = Updater(settings, where=where, context=server["context"], keys=keys)
    w = MainWindow(WorkerBridge(heartbeat_timeout=180), settings, use_tray=False, updater=updater)
    w.show()
    return w


def _check(qtbot, w: MainWindow) -> list[str]:
    """Check now; the lines the check logged, once the window has shown what it found."""
    lines: list[str] = []
    w.update_flow.updater.checked.connect(lines.append)
    assert w.update_flow.updater.check_now()
    final = ("no newer release", "SAPO Swarm", "update check failed")
    qtbot.waitUntil(lambda: any(line.startswith(final) for line in lines), timeout=20_000)
    if lines[-1].startswith("SAPO Swarm"):
        qtbot.waitUntil(w.update_flow.bar.isVisible, timeout=5_000)
    w.update_flow.updater.checked.disconnect(lines.append)
    return lines


def test_a_wrongly_signed_manifest_offers_nothing(qtbot, tmp_path, tmp_path_factory, monkeypatch, server, key, keys):
    url = _publish(server, Ed25519PrivateKey.generate(), "stranger", "0.9.0")
    w = _window(tmp_path, tmp_path_factory, monkeypatch, server, keys, url)
    lines = _check(qtbot, w)
    assert "not one this node trusts" in lines[0] and w.update_flow.bar.isHidden()
    assert "no newer release" in lines[-1]
    qtbot.waitUntil(lambda: any("not one this node trusts" in line.text for line in w.log.lines), timeout=5_000)
    assert os.readlink(tmp_path / "app/current") == "versions/0.1.0"


@pytest.mark.node_process
def test_update_now_waits_for_the_round_installs_and_a_bad_package_restarts_the_node(
    qtbot, tmp_path, tmp_path_factory, monkeypatch, server, key, keys
):
    bad = _publish(server, key, "bad", "0.8.0", served=lambda p: p[: len(p) // 2])  # truncated on the wire
    w = _window(tmp_path, tmp_path_factory, monkeypatch, server, keys, bad, node=True)
    states: list[str] = []
    w.bridge.state_changed.connect(lambda ev: states.append(ev.state))
    try:
        assert w.start_node()
        qtbot.waitSignal(w.bridge.round_done, timeout=START_MS).wait()
        _check(qtbot, w)
        assert w.update_flow.bar.isVisible() and "0.8.0 is available" in w.update_flow.bar.label.text()
        assert "Rounds a third faster." in w.update_flow.bar.label.text()
        # a package that is not the signed one: nothing installed, and the node trains again
        with qtbot.waitSignal(w.update_flow.updater.done, timeout=START_MS) as done:
            w.update_flow.bar.update_button.click()
        assert done.args[0] is False and "the signed manifest says" in done.args[1]
        assert os.readlink(tmp_path / "app/current") == "versions/0.1.0"
        assert w.update_flow.bar.update_button.text() == "Try again" and w.update_flow.bar.restart_button.isHidden()
        assert states.index(P.PAUSED) < states.index(P.STOPPED)  # paused after its round, then stopped
        qtbot.waitUntil(lambda: w.bridge.running, timeout=10_000)
        qtbot.waitSignal(w.bridge.round_done, timeout=START_MS).wait()

        # the signed package: installed into the tarball installation, and a restart offered
        w.settings.set("updates/url", _publish(server, key, "good", "0.9.0"))
        _check(qtbot, w)
        states.clear()
        with qtbot.waitSignal(w.update_flow.updater.done, timeout=START_MS) as done:
            w.update_flow.bar.update_button.click()
            assert "Waiting for the node to finish its round" in w.update_flow.bar.label.text()
        assert done.args[0] is True and "0.9.0 is installed" in done.args[1]
        assert P.PAUSING in states and states.index(P.PAUSED) < states.index(P.STOPPED)
        assert not w.bridge.running  # it stays stopped: the new version starts it
        assert os.readlink(tmp_path / "app/current") == "versions/0.9.0"
        assert (tmp_path / "app/current/sapo-swarm").read_bytes().endswith(b"echo 0.9.0\n")
        assert w.update_flow.bar.restart_button.isVisible() and w.update_flow.bar.update_button.isHidden()
    finally:
        if w.bridge.running:
            w.bridge.stop_and_wait(timeout=30)
        w.deleteLater()


def test_a_source_copy_is_told_what_to_run_instead(qtbot, tmp_path, tmp_path_factory, monkeypatch, server, key, keys):
    url = _publish(server, key, "src", "0.9.1")
    w = _window(tmp_path, tmp_path_factory, monkeypatch, server, keys, url)
    w.update_flow.updater.where = updates.Installation("source", "")
    _check(qtbot, w)
    assert w.update_flow.bar.isVisible() and "git pull" in w.update_flow.bar.label.text()
    assert w.update_flow.bar.update_button.isHidden()
