"""The swarm's own page: read-only HTTP from a seed (or a node that opts in, `swarm.page_port`).

- `/`: a page a person reads (server-rendered HTML with inline CSS and SVG plots: no script,
  no request beyond itself; light and dark follow the reader's system; phone width reflows),
- `/api/status`: the same figures as JSON for tools (observer.py has what they mean),
- `/metrics`: the figures for Prometheus, with the host's DHT, memory, CPU and (on a node) its
  round time and held-out figure (metrics.py).

`SwarmPage` runs a `SwarmObserver` on a thread (one poll every `poll_seconds`) and an HTTP
server that only serves what the last poll built: a request costs a dictionary lookup and a
copy, whatever the swarm holds. Connections are bounded (`MAX_CONNECTIONS` at once, the rest
closed at once) and a slow client is dropped after `REQUEST_TIMEOUT` seconds. Every string that
came from a peer is escaped; the figures shown are peer names (derived from peer ids),
versions, model names and numbers, nothing else a peer wrote.
"""

from __future__ import annotations

import html
import json
import logging
import threading
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from sapo_core.swarm.observer import SwarmObserver

log = logging.getLogger(__name__)

MAX_CONNECTIONS = 32
REQUEST_TIMEOUT = 10.0


class SwarmPage:
    """An observer polled on its own thread, and the HTTP server showing what it saw."""

    def __init__(self, observer: SwarmObserver, host: str, port: int, poll_seconds: float, metrics: Any = None) -> None:
        """`metrics`: what /metrics serves (metrics.PageMetrics; None: the page has no /metrics)."""
        self.observer = observer
        self.poll_seconds = poll_seconds
        self.metrics = metrics
        self._stop = threading.Event()
        self._cache: tuple[int, bytes, bytes] | None = None  # (poll, page, json)
        self._cache_lock = threading.Lock()
        self.server = _Server((host, port), _handler_for(self))
        self._threads = [
            threading.Thread(target=self.server.serve_forever, name="swarm-page-http", daemon=True),
            threading.Thread(target=self._poll_forever, name="swarm-page-poll", daemon=True),
        ]

    @property
    def url(self) -> str:
        host, port = self.server.server_address[:2]
        return f"http://{f'[{host}]' if ':' in str(host) else host}:{port}/"

    def start(self) -> SwarmPage:
        for t in self._threads:
            t.start()
        return self

    def close(self) -> None:
        self._stop.set()
        self.server.shutdown()
        self.observer.save()
        self.server.server_close()
        for t in self._threads:
            t.join(timeout=30)

    def _poll_forever(self) -> None:
        while not self._stop.is_set():
            self.observer.poll()
            self._stop.wait(self.poll_seconds)

    def rendered(self) -> tuple[bytes, bytes]:
        """(the page, the JSON) of the last poll, built once per poll."""
        status = self.observer.status()
        polls = status.get("polls", -1)
        with self._cache_lock:
            if self._cache is None or self._cache[0] != polls:
                page = render_page(status).encode()
                data = json.dumps(status, indent=1).encode()
                self._cache = (polls, page, data)
            return self._cache[1], self._cache[2]


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self._slots = threading.BoundedSemaphore(MAX_CONNECTIONS)

    def process_request(self, request: Any, client_address: Any) -> None:
        if not self._slots.acquire(blocking=False):  # too many at once: refuse this one at once
            self.shutdown_request(request)
            return
        super().process_request(request, client_address)

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._slots.release()


def _handler_for(page: SwarmPage) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        timeout = REQUEST_TIMEOUT
        server_version = "sapo-swarm-page"
        sys_version = ""

        def do_GET(self) -> None:
            self._answer(with_body=True)

        def do_HEAD(self) -> None:
            self._answer(with_body=False)

        def _answer(self, with_body: bool) -> None:
            path = self.path.split("?", 1)[0]
            if path == "/metrics" and page.metrics is not None:
                from sapo_core.swarm.metrics import CONTENT_TYPE

                out, kind = page.metrics.text(), CONTENT_TYPE
            elif path in ("/", "/api/status"):
                body, data = page.rendered()
                out, kind = (body, "text/html; charset=utf-8") if path == "/" else (data, "application/json")
            else:
                self.send_error(404, "only /, /api/status and /metrics are here")
                return
            self.send_response(200)
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(out)))
            self.send_header("Cache-Control", "no-store")
            self.send_header("Content-Security-Policy", "default-src 'none'; style-src 'unsafe-inline'")
            self.send_header("X-Content-Type-Options", "nosniff")
            self.end_headers()
            if with_body:
                self.wfile.write(out)

        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 (the base class's name)
            log.debug("swarm page: " + format % args)

    return Handler


# --- the page ------------------------------------------------------------------------------------

_CSS = """
:root { color-scheme: light dark; --bg: #ffffff; --fg: #1d2125; --muted: #5f6b76; --card: #f3f5f7;
  --line: #d9dee3; --accent: #2f6fdf; --bad: #b3261e; }
@media (prefers-color-scheme: dark) { :root { --bg: #15181b; --fg: #e6e9ec; --muted: #9aa6b2;
  --card: #1f2428; --line: #30363d; --accent: #6ea1ff; --bad: #ff8a80; } }
* { box-sizing: border-box; }
body { margin: 0; background: var(--bg); color: var(--fg);
  font: 15px/1.45 system-ui, -apple-system, "Segoe UI", Roboto, sans-serif; }
main { max-width: 980px; margin: 0 auto; padding: 16px; }
h1 { font-size: 1.5em; margin: 0.2em 0; } h2 { font-size: 1.1em; margin: 1.6em 0 0.5em; }
.muted, small { color: var(--muted); }
.cards { display: grid; grid-template-columns: repeat(auto-fit, minmax(140px, 1fr)); gap: 10px; }
.card { background: var(--card); border-radius: 8px; padding: 10px 12px; }
.card b { display: block; font-size: 1.6em; font-variant-numeric: tabular-nums; }
.scroll { overflow-x: auto; }
table { border-collapse: collapse; width: 100%; font-variant-numeric: tabular-nums; }
th, td { text-align: left; padding: 5px 8px; border-bottom: 1px solid var(--line); white-space: nowrap; }
th { color: var(--muted); font-weight: 600; }
td.n, th.n { text-align: right; }
.junk { color: var(--bad); }
code { font-size: 0.85em; word-break: break-all; }
.plots { display: grid; grid-template-columns: repeat(auto-fit, minmax(280px, 1fr)); gap: 10px; }
svg { width: 100%; height: auto; background: var(--card); border-radius: 8px; }
svg polyline { fill: none; stroke: var(--accent); stroke-width: 2; }
svg circle { fill: var(--accent); }
svg text { fill: var(--muted); font-size: 11px; }
"""


def _e(v: Any) -> str:
    return html.escape(str(v), quote=True)


def _ago(seconds: float) -> str:
    if seconds < 90:
        return f"{seconds:.0f} s ago"
    if seconds < 5400:
        return f"{seconds / 60:.0f} min ago"
    if seconds < 2 * 86400:
        return f"{seconds / 3600:.0f} h ago"
    return f"{seconds / 86400:.0f} days ago"


def _plot(points: list[tuple[int, float]], title: str, fmt: str = "{:.0f}") -> str:
    """A small line plot of hourly points (hour index, value) as inline SVG."""
    w, h, pad = 300, 110, 22
    head = f'<svg viewBox="0 0 {w} {h}" role="img" aria-label="{_e(title)}"><text x="8" y="14">{_e(title)}</text>'
    if not points:
        return head + f'<text x="8" y="{h / 2:.0f}">no data yet</text></svg>'
    xs, ys = [p[0] for p in points], [p[1] for p in points]
    x0, x1 = min(xs), max(max(xs), min(xs) + 1)
    top = max(max(ys), 1e-9)
    xy = [(8 + (x - x0) / (x1 - x0) * (w - 16), h - pad + 14 - (y / top) * (h - pad - 10)) for x, y in points]
    coords = " ".join(f"{x:.1f},{y:.1f}" for x, y in xy)
    dots = "".join(f'<circle cx="{x:.1f}" cy="{y:.1f}" r="2.5"/>' for x, y in xy) if len(xy) <= 72 else ""
    first = datetime.fromtimestamp(x0 * 3600, UTC).strftime("%d %b %H:00")
    return (
        head
        + f'<text x="{w - 8}" y="14" text-anchor="end">max {_e(fmt.format(top))}</text>'
        + f'<polyline points="{coords}"/>{dots}'
        + f'<text x="8" y="{h - 3}">{_e(first)} UTC</text>'
        + f'<text x="{w - 8}" y="{h - 3}" text-anchor="end">now</text></svg>'
    )


def render_page(s: dict[str, Any]) -> str:
    """The page of one status (observer.SwarmObserver.status())."""
    if not s:
        return "<!doctype html><title>SAPO Swarm</title><p>Starting.</p>"
    out = [
        "<!doctype html><html lang='en'><head><meta charset='utf-8'>",
        "<meta name='viewport' content='width=device-width, initial-scale=1'>",
        f"<title>{_e(s.get('swarm', 'swarm'))} · SAPO Swarm</title><style>{_CSS}</style></head><body><main>",
        *_head(s),
        *_nodes(s),
        *_board(s),
        *_refused(s),
        *_models_and_history(s),
        "</main></body></html>",
    ]
    return "".join(out)


def _head(s: dict[str, Any]) -> list[str]:
    """The title, who sees the swarm, how to join, and the headline figures."""
    cards = [
        ("nodes-recent", s["nodes_recent"], "nodes in the last two windows"),
        ("rounds-last-hour", s["rounds_last_hour"], "rounds in the last hour"),
        ("groups-last-hour", s["groups_last_hour"], "groups shared in the last hour"),
        ("groups-verified", s["groups_verified"], "groups verified (trainable)"),
        ("groups-refused", sum(s["groups_refused"].values()), "groups refused"),
    ]
    out = [
        f"<h1>Swarm <span id='swarm-name'>{_e(s.get('swarm', ''))}</span></h1>",
        f"<p class='muted'>Seen by {_e(s.get('name', ''))} (SAPO Swarm {_e(s.get('version', ''))}), "
        f"a {s['window_seconds']:g} s window, updated {_e(_iso(s['generated']))} UTC, watching since "
        f"{_e(_iso(s['watching_since']))} UTC.</p>",
    ]
    join = s.get("join") or []
    if join:
        out.append(f"<p>Join: <code id='join'>{_e(join[0])}</code></p>")
    out.append("<div class='cards'>")
    for ident, value, label in cards:
        out.append(f"<div class='card'><b id='{ident}'>{_e(value)}</b><small>{_e(label)}</small></div>")
    out.append("</div>")
    return out


def _nodes(s: dict[str, Any]) -> list[str]:
    out = [
        "<h2>Nodes</h2><div class='scroll'><table id='nodes'><thead><tr>",
        "<th>node</th><th>model</th><th>version</th><th class='n'>round</th><th class='n'>held-out*</th>"
        "<th class='n'>verified</th><th class='n'>refused</th><th>last seen</th></tr></thead><tbody>",
    ]
    for n in s["nodes"]:
        ho = n["held_out"]
        held = "" if ho is None else f"{ho['solve_rate']:.3f} <small>after round {ho['after_round']}</small>"
        out.append(
            f"<tr data-peer='{_e(n['peer_id'])}'><td title='{_e(n['peer_id'])}'>{_e(n['name'])}</td>"
            f"<td>{_e(n['model'] or '?')}</td><td>{_e(n['app_version'] or '?')}</td>"
            f"<td class='n' data-figure='last_round'>{n['last_round']}</td>"
            f"<td class='n' data-figure='held_out'>{held}</td>"
            f"<td class='n' data-figure='groups_verified'>{n['groups_verified']}</td>"
            f"<td class='n' data-figure='groups_refused'>{n['groups_refused']}</td>"
            f"<td>{_e(_ago(n['seconds_since_seen']))}</td></tr>"
        )
    out.append("</tbody></table></div>")
    if s["nodes_not_shown"]:
        out.append(f"<p class='muted'>and {s['nodes_not_shown']} more.</p>")
    out.append(
        "<p class='muted'><small>* self-reported: each node's own last held-out solve rate, as it signs it "
        "into its index entries; the page cannot check it.</small></p>"
    )
    return out


def _board(s: dict[str, Any]) -> list[str]:
    out = ["<h2>Contribution board</h2>"]
    if not s["board"]:
        out.append("<p class='muted' id='board'>No receipts yet: no node has said it trained on another's groups.</p>")
        return out
    out.append(
        "<p class='muted'>Whose groups other nodes trained on, from the signed receipts in their records.</p>"
        "<div class='scroll'><table id='board'><thead><tr><th>node</th><th class='n'>groups trained on</th>"
        "<th class='n'>by nodes</th></tr></thead><tbody>"
    )
    for b in s["board"]:
        out.append(
            f"<tr data-peer='{_e(b['peer_id'])}'><td>{_e(b['name'])}</td>"
            f"<td class='n' data-figure='trained_on'>{b['trained_on']}</td>"
            f"<td class='n' data-figure='by_nodes'>{b['by_nodes']}</td></tr>"
        )
    out.append("</tbody></table></div>")
    return out


def _refused(s: dict[str, Any]) -> list[str]:
    out = ["<h2>Groups refused, by reason</h2>"]
    if not s["groups_refused"]:
        out.append("<p class='muted' id='refused'>None.</p>")
        return out
    junk = set(s.get("junk_reasons", []))
    out.append("<table id='refused'><tbody>")
    for reason, n in s["groups_refused"].items():
        cls = " class='junk'" if reason in junk else ""
        out.append(f"<tr data-reason='{_e(reason)}'><td{cls}>{_e(reason)}</td><td class='n'>{n}</td></tr>")
    out.append("</tbody></table>")
    out.append("<p class='muted'><small>Red: only a broken or hostile node sends these.</small></p>")
    return out


def _models_and_history(s: dict[str, Any]) -> list[str]:
    hist = s["history"]
    held_out = [(h["hour"], h["held_out_median"]) for h in hist if h["held_out_median"] is not None]
    return [
        "<h2>Models and versions</h2><p id='models'>",
        ", ".join(f"{_e(m)} × {n}" for m, n in s["models"].items()) or "none seen yet",
        "</p><p id='versions' class='muted'>",
        ", ".join(f"SAPO Swarm {_e(v)} × {n}" for v, n in s["versions"].items()),
        "</p>",
        "<h2>History</h2><div class='plots'>",
        _plot([(h["hour"], h["nodes"]) for h in hist], "nodes per hour"),
        _plot([(h["hour"], h["rounds"]) for h in hist], "rounds per hour"),
        _plot(held_out, "median held-out* (self-reported)", "{:.3f}"),
        "</div><p class='muted'><small>Figures as JSON: <a href='/api/status'>/api/status</a>; "
        "for Prometheus: <a href='/metrics'>/metrics</a>.</small></p>",
    ]


def _iso(t: float) -> str:
    return datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%d %H:%M")


def start_page(
    dht: Any,
    keyspace: Any,
    tasks: Any,
    identity: Any,
    join: list[str],
    host: str,
    port: int,
    data_dir: Any = None,
    own: Any = None,
) -> SwarmPage:
    """A started page for a started DHT: polls every quarter window (5..60 s). `identity` is the
    host's (its name and peer id head the page), `join` the addresses others join with; `own`:
    a node's own figures for /metrics (metrics.OwnFigures; None on a seed)."""
    from pathlib import Path

    from sapo_core import __version__
    from sapo_core.swarm.metrics import PageMetrics
    from sapo_core.swarm.observer import HISTORY_FILE

    about = {
        "swarm": keyspace.swarm_name,
        "name": identity.name,
        "peer_id": identity.peer_id,
        "join": list(join),
        "version": __version__,
    }
    history = Path(data_dir) / HISTORY_FILE if data_dir is not None else None
    observer = SwarmObserver(dht, keyspace, tasks, about, history_path=history)
    poll = min(60.0, max(5.0, keyspace.window_seconds / 4))
    return SwarmPage(observer, host, port, poll, PageMetrics(observer, dht, own)).start()


__all__ = ["SwarmPage", "render_page", "start_page", "MAX_CONNECTIONS"]
