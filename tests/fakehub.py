"""A loopback stand-in for the model hub, for the tests that download (test_modelfiles,
test_control_worker): a `http.server` on 127.0.0.1 answering in the hub's URL layout
(`/{repo}/resolve/{revision}/{filename}`, HEAD with `X-Repo-Commit`, `ETag`, `Content-Length`;
GET with `Range`), so the real `hf_hub_download` runs against it. It can cut the first GET
short (a dropped connection) or trickle the file (a download long enough to watch).
"""

from __future__ import annotations

import dataclasses
import hashlib
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from sapo_core.catalog import load_catalogue

REPO = "sapo-test/Tiny-GGUF"
REVISION = "0123456789abcdef0123456789abcdef01234567"
FILENAME = "tiny-q8_0.gguf"
PAYLOAD = b"GGUF" + bytes(range(256)) * 12_000  # ~3 MB


class FakeHub:
    """Serves one file like the hub's `resolve` endpoint. `cut_first_get_at`: the first GET stops
    after that many bytes; `trickle_seconds`: a GET sends the file in 1 MiB pieces over about
    that long."""

    def __init__(
        self,
        payload: bytes,
        cut_first_get_at: int = 0,
        *,
        repo: str = REPO,
        revision: str = REVISION,
        filename: str = FILENAME,
        trickle_seconds: float = 0.0,
    ) -> None:
        self.payload, self.cut_first_get_at, self.trickle_seconds = payload, cut_first_get_at, trickle_seconds
        self.repo, self.revision, self.filename = repo, revision, filename
        self.requests: list[tuple[str, str, str | None]] = []  # (method, path, Range header)
        hub = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:
                pass

            def _headers(self, status: int, length: int, extra: dict[str, str] | None = None) -> None:
                self.send_response(status)
                self.send_header("X-Repo-Commit", hub.revision)
                self.send_header("ETag", f'"{hashlib.sha256(hub.payload).hexdigest()}"')
                self.send_header("Accept-Ranges", "bytes")
                self.send_header("Content-Length", str(length))
                for k, v in (extra or {}).items():
                    self.send_header(k, v)
                self.end_headers()

            def _known(self) -> bool:
                if self.path.split("?")[0] == f"/{hub.repo}/resolve/{hub.revision}/{hub.filename}":
                    return True
                self.send_response(404)
                self.send_header("X-Error-Code", "EntryNotFound")
                self.send_header("Content-Length", "0")
                self.end_headers()
                return False

            def _send(self, data: bytes) -> None:
                if not hub.trickle_seconds:
                    self.wfile.write(data)
                    return
                piece = 1 << 20
                pause = hub.trickle_seconds / max(1, len(data) // piece)
                for i in range(0, len(data), piece):
                    self.wfile.write(data[i : i + piece])
                    self.wfile.flush()
                    time.sleep(pause)

            def do_HEAD(self) -> None:
                hub.requests.append(("HEAD", self.path, None))
                if self._known():
                    self._headers(200, len(hub.payload))

            def do_GET(self) -> None:
                rng = self.headers.get("Range")
                hub.requests.append(("GET", self.path, rng))
                if not self._known():
                    return
                data = hub.payload
                try:
                    if rng:
                        start = int(rng.split("=")[1].split("-")[0])
                        self._headers(
                            206, len(data) - start, {"Content-Range": f"bytes {start}-{len(data) - 1}/{len(data)}"}
                        )
                        self._send(data[start:])
                        return
                    self._headers(200, len(data))
                    if hub.cut_first_get_at and sum(m == "GET" for m, _, _ in hub.requests) == 1:
                        self.wfile.write(data[: hub.cut_first_get_at])  # then the connection drops
                        self.wfile.flush()
                        self.close_connection = True
                        return
                    self._send(data)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the client went away (a stopped download)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> FakeHub:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()


def tiny_entry(payload: bytes = PAYLOAD, sha256: str | None = None):
    """A hub catalogue entry for the fake hub's file (Qwen2.5-0.5B's numbers, the fake's name and hash)."""
    base = load_catalogue().get("qwen2.5-0.5b-instruct")
    return dataclasses.replace(
        base,
        repo=REPO,
        revision=REVISION,
        filename=FILENAME,
        size_bytes=len(payload),
        sha256=hashlib.sha256(payload).hexdigest() if sha256 is None else sha256,
    )


def closed_port_url() -> str:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()  # nothing listens there now
    return f"http://127.0.0.1:{port}"


__all__ = ["FakeHub", "tiny_entry", "closed_port_url", "REPO", "REVISION", "FILENAME", "PAYLOAD"]
