"""`sapo-node seed`: a node that serves a swarm and trains nothing.

Whoever runs a swarm (the project, a university, a community) starts one of these on a machine
with a public address; volunteers join through it. It serves the DHT (stores and returns the
swarm's signed records, validated like every node's), relays for nodes behind NAT and answers
their dial-backs (p2pd's relay service and `reachability.DialbackService`, as any reachable
node does), and keeps what makes it a good bootstrap peer stable across restarts:

- its identity (`identity.key` in its data directory; back it up: the peer id in every node's
  bootstrap list is derived from it), and its address: a fixed port, and `--announce` for the
  public IP or DNS name peers are told to dial (behind a cloud's 1:1 NAT the machine does not
  see its public address itself);
- `seed.json` in the data directory says what it serves (peer id, join addresses, swarm) for
  tools and the swarm list (docs/deploy.md).

It serves the swarm's page (swarm/page.py: `/` for people, `/api/status` for tools, `/metrics`
for Prometheus, swarm/metrics.py) on `--page-port` (default 31331; 0: none). It logs to stdout
(one line a minute: peers, records refused by reason, its memory) and exits cleanly, p2pd
included, on SIGTERM or SIGINT.
"""

from __future__ import annotations

import argparse
import ipaddress
import json
import logging
import signal
import sys
import threading
import time
from pathlib import Path

from sapo_core import logs, paths
from sapo_core.config import ConfigError, NodeConfig, from_dict, load_config, to_dict

log = logging.getLogger("sapo_core.seed")

DEFAULT_PORT = 31330
DEFAULT_PAGE_PORT = 31331
SEED_INFO = "seed.json"


def configure(p: argparse.ArgumentParser) -> None:
    p.add_argument("--data-dir", help=f"the seed's own directory (default {paths.data_dir() / 'seed'})")
    p.add_argument("--port", type=int, default=DEFAULT_PORT, help=f"TCP port to listen on (default {DEFAULT_PORT})")
    p.add_argument("--host", default="0.0.0.0", help="IP address to listen on (default 0.0.0.0: all)")
    p.add_argument(
        "--announce",
        metavar="HOST",
        help="the public IP address or DNS name peers dial (default: the addresses it listens on)",
    )
    p.add_argument("--swarm", metavar="NAME", help="a listed swarm whose settings this seed serves")
    p.add_argument("--config", help="TOML node config: its [swarm] settings (name, window, shards) are served")
    p.add_argument(
        "--set", action="append", default=[], metavar="KEY=VALUE", help="a swarm setting, e.g. swarm.swarm_name=x"
    )
    p.add_argument("--initial-peers", nargs="*", default=[], help="other seeds of the same swarm to join")
    p.add_argument("--status-every", type=float, default=60.0, help="seconds between status lines (default 60)")
    p.add_argument(
        "--page-port",
        type=int,
        default=DEFAULT_PAGE_PORT,
        help=f"TCP port of the swarm's page, read-only HTTP (default {DEFAULT_PAGE_PORT}; 0: no page)",
    )
    p.add_argument("--page-host", help="IP address the page listens on (default: --host's)")


def seed_config(args: argparse.Namespace) -> NodeConfig:
    """The swarm settings of a seed: the config's (or a listed swarm's), always reachable, relaying
    for others, no LAN announcements, listening on a fixed port."""
    from sapo_core.commands.run import _apply_swarm_choice, parse_set

    cfg = load_config(args.config) if args.config else NodeConfig()
    cfg = _apply_swarm_choice(cfg, argparse.Namespace(join=None, swarm=args.swarm))
    changes = parse_set(args.set, "swarm.swarm_name=my-swarm")
    if not 0 < args.port < 65536:
        raise ConfigError(f"--port {args.port}: must be 1..65535 (a fixed port: peers keep it in their lists)")
    if not 0 <= args.page_port < 65536 or (args.page_port and args.page_port == args.port):
        raise ConfigError(f"--page-port {args.page_port}: must be 0 (no page) or 1..65535, not --port's")
    data = Path(args.data_dir).expanduser() if args.data_dir else paths.data_dir() / "seed"
    host = _maddr(args.host, args.port)
    changes.update(
        {
            "swarm.enabled": True,
            "swarm.host_maddrs": [host],
            "swarm.announce_maddrs": [_maddr(args.announce, args.port)] if args.announce else [],
            "swarm.reachability": "reachable",
            "swarm.client_mode": False,
            "swarm.use_relay": True,
            "swarm.lan_discovery": changes.get("swarm.lan_discovery", False),
            "swarm.nat_port_map": False,  # a seed has its public address: no router to ask
            "swarm.identity_path": str(data / "identity.key"),
            "run_dir": str(data),
        }
    )
    if args.initial_peers:
        changes["swarm.initial_peers"] = list(args.initial_peers)
    return from_dict(to_dict(cfg.replace(**changes)))


def _maddr(host: str, port: int) -> str:
    """A multiaddr for an IP address (v4 or v6) or a DNS name."""
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        if not host or any(c in host for c in "/ "):
            raise ConfigError(f"{host!r} is neither an IP address nor a DNS name") from None
        return f"/dns/{host}/tcp/{port}"
    return f"/ip{ip.version}/{ip}/tcp/{port}"


def rss_mb() -> float:
    import psutil

    return psutil.Process().memory_info().rss / 1e6


def serve(
    cfg: NodeConfig, stop: threading.Event, status_every: float = 60.0, page: tuple[str, int] | None = None
) -> int:
    """Run the seed until `stop` is set; 0 on a clean stop, 1 if the DHT (or the page's port)
    could not start. `page`: (host, port) of the swarm's page, None for none."""
    from sapo_core.swarm.dht import SwarmDHT, SwarmError
    from sapo_core.swarm.identity import load_or_create_identity
    from sapo_core.swarm.keys import KeySpace
    from sapo_core.swarm.validation import ReasonCounter

    data = Path(cfg.run_dir)
    data.mkdir(parents=True, exist_ok=True)
    s = cfg.swarm
    identity = load_or_create_identity(s.identity_path)
    keyspace = KeySpace(s.swarm_name, s.window_seconds, s.shards)
    counts = ReasonCounter()
    dht = SwarmDHT(s, identity, keyspace, counts)
    try:
        dht.start()
    except SwarmError as e:
        log.error(f"the seed could not start: {e}")
        return 1
    swarm_page = None
    try:
        # the address to hand out first (the announced public one where given), then the rest
        addresses = list(dict.fromkeys(a for a in [dht.best_maddr(), *dht.visible_maddrs] if "/p2p/" in a))
        info = {
            "swarm": s.swarm_name,
            "window_seconds": s.window_seconds,
            "shards": s.shards,
            "peer_id": identity.peer_id,
            "name": identity.name,
            "join": addresses,
            "started": time.time(),
        }
        _write_json(data / SEED_INFO, info)
        log.info(f"seed {identity.name} ({identity.peer_id}) serves swarm '{s.swarm_name}'")
        if page is not None:
            try:
                swarm_page = _start_page(cfg, dht, keyspace, identity, addresses, page)
            except OSError as e:
                log.error(f"the swarm's page cannot listen on {page[0]}:{page[1]} ({e}); --page-port 0: no page")
                return 1
            url = swarm_page.url
            log.info(f"the swarm's page: {url} (JSON: {url}api/status; Prometheus: {url}metrics)")
        for a in addresses:
            log.info(f"join with: --initial-peers {a}")

        def status() -> None:
            refused = counts.snapshot()
            said = ", ".join(f"{n} {r}" for r, n in sorted(refused.items())) or "none"
            log.info(f"{dht.num_peers()} peers; values refused so far: {said}; memory {rss_mb():.0f} MB")

        while not stop.wait(status_every):
            status()
        status()  # the last word before stopping: what the seed saw, even in a run shorter than a period
    finally:
        if swarm_page is not None:
            swarm_page.close()
        dht.close()
    log.info("seed stopped")
    return 0


def _start_page(cfg: NodeConfig, dht, keyspace, identity, addresses: list[str], page: tuple[str, int]):
    from sapo_core.swarm.page import start_page
    from sapo_core.tasks import TaskSet

    tasks = TaskSet(cfg.tasks, seed=cfg.seed)  # regenerates peers' questions to verify them
    return start_page(dht, keyspace, tasks, identity, addresses, page[0], page[1], data_dir=cfg.run_dir)


def _write_json(path: Path, obj: dict) -> None:
    from sapo_core.fsutil import atomic_write_bytes

    atomic_write_bytes(path, (json.dumps(obj, indent=2) + "\n").encode())


def main(args: argparse.Namespace) -> int:
    try:
        cfg = seed_config(args)
    except ConfigError as e:
        print(f"sapo-node seed: bad config: {e}", file=sys.stderr)
        return 2
    except ValueError as e:  # a listed swarm that cannot be used (run.JoinChoiceError)
        print(f"sapo-node seed: {e}", file=sys.stderr)
        return 2
    logs.to_stderr(prefix="sapo-node seed: ", stream=sys.stdout)  # a service's log: stdout, for journald
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    page = (args.page_host or args.host, args.page_port) if args.page_port else None
    from sapo_core.swarm.leandht import use_dht_without_torch

    use_dht_without_torch()  # a seed trains nothing: hivemind's DHT without torch, 240 MB less
    return serve(cfg, stop, args.status_every, page)
