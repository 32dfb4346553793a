"""Atomic file writes: write a temp file beside the target, fsync, rename, fsync the dir.

A crash at any moment leaves either the old file or the new one, never half of one.
"""

from __future__ import annotations

import errno
import os
import shutil
import tempfile
from pathlib import Path


def fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:  # Windows cannot open directories; rename is atomic enough there
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def atomic_write_bytes(path: Path, data: bytes, mode: int | None = None) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        if mode is not None:
            os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise
    fsync_dir(path.parent)


LOW_SPACE_BYTES = 16 * 1024 * 1024  # below this a checkpoint or a store page cannot be counted on


def write_trouble(path: Path, error: BaseException | None = None) -> str | None:
    """Why a directory cannot take our writes, in words with what to do, or None if it can as
    far as we can tell: the disk is full (the error said so, or less than LOW_SPACE_BYTES is
    free), or it cannot be written (read-only, permissions: a probe file fails)."""
    path = Path(path)
    said = f"{error}" if error is not None else ""
    full = (
        isinstance(error, OSError) and error.errno == errno.ENOSPC or "No space left" in said or "os error 28" in said
    )
    try:
        free = shutil.disk_usage(path).free
    except OSError:
        free = None
    if full or (free is not None and free < LOW_SPACE_BYTES):
        left = f" ({free / 1e6:.0f} MB free)" if free is not None else ""
        return f"the disk is full{left}: free some space there, or move the run elsewhere (--run-dir)"
    unwritable = "make it writable, or move the run elsewhere (--run-dir)"
    if isinstance(error, OSError) and error.errno in (errno.EROFS, errno.EACCES, errno.EPERM):
        where = f" ({error.filename})" if error.filename else ""
        return f"it cannot be written{where}: {error.strerror}, a read-only disk or changed permissions; {unwritable}"
    probe = path / f".write-test-{os.getpid()}"
    try:
        probe.write_bytes(b"x")
        probe.unlink()
    except OSError as e:
        if e.errno == errno.ENOSPC:
            return "the disk is full: free some space there, or move the run elsewhere (--run-dir)"
        return f"it cannot be written: {e.strerror or e}, a read-only disk or changed permissions; {unwritable}"
    return None
