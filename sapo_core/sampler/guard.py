"""Crash isolation: native code runs in a spawned child that the node talks to over pipes.

A segfault or abort inside llama.cpp (the default build dies in its AMX kernels on some
CPUs: docs/environment.md, 'llama.cpp build flags') must cost the node its fast sampler, not
its life. `WorkerProcess` starts `python -m <module>` as a fresh interpreter (spawned, never
forked: no copy of the node's torch state or threads), sends it requests and reads replies,
and turns a dead child into a `SamplerError` that says how it died and what it printed last.

Wire format, both ways: a 4-byte little-endian length, then a msgpack map. Requests are
`{"op": name, ...args}`; replies `{"ok": true, ...}` or `{"ok": false, "error": text}`.
The child keeps its protocol on private copies of stdin/stdout and points fd 1 at stderr,
so nothing a native library prints can corrupt a frame. Its stderr is read by a thread
into a short tail for error messages.
"""

from __future__ import annotations

import collections
import os
import signal
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from typing import Any, BinaryIO

import msgpack

from sapo_core.sampler.base import SamplerError

_HEADER = struct.Struct("<I")
_MAX_FRAME = 1 << 30


def _write_frame(stream: BinaryIO, obj: dict[str, Any]) -> None:
    data = msgpack.packb(obj, use_bin_type=True)
    stream.write(_HEADER.pack(len(data)) + data)
    stream.flush()


def _read_exact(stream: BinaryIO, n: int) -> bytes:
    chunks, got = [], 0
    while got < n:
        chunk = stream.read(n - got)
        if not chunk:
            raise EOFError("pipe closed")
        chunks.append(chunk)
        got += len(chunk)
    return b"".join(chunks)


def _read_frame(stream: BinaryIO) -> dict[str, Any]:
    (n,) = _HEADER.unpack(_read_exact(stream, _HEADER.size))
    if n > _MAX_FRAME:
        raise EOFError(f"frame of {n} bytes: the stream is out of step")
    return msgpack.unpackb(_read_exact(stream, n), raw=False, strict_map_key=False)


def describe_exit(code: int | None) -> str:
    """'signal SIGSEGV' / 'exit code 3' / 'still running'."""
    if code is None:
        return "still running"
    if code < 0:
        try:
            return f"signal {signal.Signals(-code).name}"
        except ValueError:
            return f"signal {-code}"
    if os.name == "nt" and code >= 0xC0000000:  # Windows reports access violations as NTSTATUS codes
        return f"exception 0x{code:08X}"
    return f"exit code {code}"


class WorkerProcess:
    """The parent's end: one request at a time, a dead child becomes `SamplerError`."""

    def __init__(self, module: str, label: str, env: dict[str, str] | None = None) -> None:
        self.label = label
        self._tail: collections.deque[str] = collections.deque(maxlen=40)
        self._dead: str | None = None
        self._lock = threading.Lock()
        child_env = dict(os.environ if env is None else env)
        child_env["PYTHONUNBUFFERED"] = "1"
        try:
            self._proc = subprocess.Popen(
                [sys.executable, "-m", module],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                env=child_env,
                bufsize=0,
            )
        except OSError as e:
            raise SamplerError(f"could not start the {label} process: {e}") from e
        self._stderr_thread = threading.Thread(target=self._drain_stderr, name=f"{label}-stderr", daemon=True)
        self._stderr_thread.start()

    @property
    def pid(self) -> int:
        return self._proc.pid

    @property
    def alive(self) -> bool:
        return self._dead is None and self._proc.poll() is None

    def stderr_tail(self, lines: int = 8) -> list[str]:
        return list(self._tail)[-lines:]

    def _drain_stderr(self) -> None:
        assert self._proc.stderr is not None
        for raw in iter(self._proc.stderr.readline, b""):
            line = raw.decode("utf-8", "replace").rstrip()
            if line:
                self._tail.append(line)

    def call(self, op: str, **args: Any) -> dict[str, Any]:
        """Send one request and wait for its reply. Raises `SamplerError` on failure."""
        with self._lock:
            if self._dead is not None:
                raise SamplerError(self._dead)
            assert self._proc.stdin is not None and self._proc.stdout is not None
            try:
                _write_frame(self._proc.stdin, {"op": op, **args})
                reply = _read_frame(self._proc.stdout)
            except (OSError, EOFError, ValueError, msgpack.exceptions.ExtraData) as e:
                raise SamplerError(self._died(op, e)) from None
            except BaseException:
                # interrupted between request and reply (Ctrl-C): the stream is out of step
                self._dead = f"the {self.label} process was abandoned in the middle of '{op}'"
                self._kill()
                raise
        if not reply.get("ok"):
            raise SamplerError(f"{self.label}: '{op}' failed: {reply.get('error', 'no message')}")
        return reply

    def _died(self, op: str, cause: BaseException) -> str:
        try:
            code = self._proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self._kill()
            code = self._proc.returncode
        self._stderr_thread.join(timeout=2)
        tail = " | ".join(self.stderr_tail(4)) or "nothing"
        self._dead = (
            f"the {self.label} process (pid {self._proc.pid}) died during '{op}' with "
            f"{describe_exit(code)} ({type(cause).__name__}); it last printed: {tail}"
        )
        return self._dead

    def _kill(self) -> None:
        if self._proc.poll() is None:
            self._proc.kill()
            try:
                self._proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                pass

    def close(self, timeout: float = 5.0) -> None:
        """Staged stop: ask, wait, terminate, kill."""
        if self._proc.poll() is None and self._dead is None:
            try:
                with self._lock:
                    assert self._proc.stdin is not None
                    _write_frame(self._proc.stdin, {"op": "exit"})
                    self._proc.stdin.close()
            except (OSError, ValueError):
                pass
        try:
            self._proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self._proc.terminate()
            try:
                self._proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self._kill()
        self._dead = self._dead or f"the {self.label} process was closed"
        for stream in (self._proc.stdin, self._proc.stdout):
            try:
                if stream is not None:
                    stream.close()
            except OSError:
                pass


def serve(handlers: dict[str, Callable[..., dict[str, Any] | None]]) -> int:
    """The child's loop: read a request, run `handlers[op](**args)`, reply; until 'exit' or EOF.

    A Python exception in a handler is a failed reply (the child lives on); only native
    crashes kill the process, and the parent reports those.
    """
    proto_in = os.fdopen(os.dup(0), "rb", buffering=0)
    proto_out = os.fdopen(os.dup(1), "wb", buffering=0)
    os.dup2(2, 1)  # stray prints (Python or native) go to stderr, never into a frame
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.close(devnull)
    sys.stdout = sys.stderr
    while True:
        try:
            req = _read_frame(proto_in)
        except EOFError:
            return 0
        op = req.pop("op", None)
        if op == "exit":
            _write_frame(proto_out, {"ok": True})
            return 0
        handler = handlers.get(op)
        if handler is None:
            _write_frame(proto_out, {"ok": False, "error": f"unknown request '{op}'"})
            continue
        try:
            reply = handler(**req) or {}
            _write_frame(proto_out, {"ok": True, **reply})
        except Exception as e:  # reported to the parent, which raises SamplerError
            _write_frame(proto_out, {"ok": False, "error": f"{type(e).__name__}: {e}"})


def measure_round_trip(worker: WorkerProcess, n: int = 200) -> float:
    """Seconds per empty request/reply, the fixed cost of the process boundary."""
    worker.call("ping")
    t0 = time.perf_counter()
    for _ in range(n):
        worker.call("ping")
    return (time.perf_counter() - t0) / n
