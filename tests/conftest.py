"""Shared fixtures: child processes are reaped after each test, Qt runs offscreen, a node
process's environment. Shared functions and classes are in helpers.py."""

from __future__ import annotations

import os

import psutil
import pytest

from helpers import https_files, light_env

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def _children() -> set[int]:
    return {p.pid for p in psutil.Process().children(recursive=True)}


def _reap(pids: set[int]) -> None:
    leftovers = []
    for pid in pids:
        try:
            leftovers.append(psutil.Process(pid))
        except psutil.NoSuchProcess:
            pass
    for p in leftovers:
        try:
            p.terminate()
        except psutil.NoSuchProcess:
            pass
    _, alive = psutil.wait_procs(leftovers, timeout=5)
    for p in alive:
        try:
            p.kill()
        except psutil.NoSuchProcess:
            pass


@pytest.fixture(scope="module", autouse=True)
def reap_module_children():
    """Kill whatever child processes a module left behind (its module-scoped nodes included)."""
    before = _children()
    yield
    _reap(_children() - before)


@pytest.fixture(autouse=True)
def reap_children(request):
    """Kill whatever child processes a test left behind (nodes, p2pd daemons).

    A module marked `module_processes` shares a node across its tests, and that node's supervisor
    may restart it during any test: its processes are reaped when the module ends instead.
    """
    before = _children()
    yield
    if request.node.get_closest_marker("module_processes") is None:
        _reap(_children() - before)


@pytest.fixture(scope="session", autouse=True)
def shared_model_cache(tmp_path_factory):
    """One converted-model cache per test session: the tokenizer and model are converted once."""
    if not os.environ.get("SAPO_CACHE_DIR"):
        os.environ["SAPO_CACHE_DIR"] = str(tmp_path_factory.getbasetemp() / "sapo-cache")
    yield


@pytest.fixture
def data_dir(tmp_path, monkeypatch):
    """A fresh SAPO data directory (runs, identity, node.toml) for one test."""
    monkeypatch.setenv("SAPO_DATA_DIR", str(tmp_path / "data"))
    return tmp_path / "data"


@pytest.fixture
def env(tmp_path, tmp_path_factory) -> dict[str, str]:
    """The environment for a node process a test starts: its own data directory, the session's
    converted-model cache (helpers.light_env)."""
    return light_env(tmp_path, tmp_path_factory)


@pytest.fixture(autouse=True)
def no_log_handler_left():
    """A test that runs a CLI's main installs its log handler (logs.py) and sets SAPO_LOG_LEVEL:
    both end with the test, so later tests see library defaults."""
    level = os.environ.get("SAPO_LOG_LEVEL")
    yield
    from sapo_core import logs

    logs.uninstall()
    if level is None:
        os.environ.pop("SAPO_LOG_LEVEL", None)
    else:
        os.environ["SAPO_LOG_LEVEL"] = level


# --- signed lists and manifests (swarm list, releases), served over HTTPS on loopback -----------


@pytest.fixture(scope="module")
def key():
    """The Ed25519 key a module's signed lists are signed with (a maintainer's)."""
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    return Ed25519PrivateKey.generate()


@pytest.fixture(scope="module")
def keys(key):
    """The trusted keys, as a node reads them from resources/swarmlist-keys.txt: `key` only."""
    from sapo_core.swarm.signedlist import parse_keys, public_key_line

    return parse_keys(public_key_line(key))


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """An HTTPS server on 127.0.0.1 serving the files of `root`, and a client context that
    trusts its self-signed certificate (and nothing else): {"root", "url", "context"}."""
    root = tmp_path_factory.mktemp("www")
    with https_files(root, tmp_path_factory.mktemp("tls")) as (url, context):
        yield {"root": root, "url": url, "context": context}
