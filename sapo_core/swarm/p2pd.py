"""The DHT node's host side: the options `DHTNode.create` is given, and p2pd's leftovers.

hivemind's DHT node runs libp2p in a `p2pd` child process that talks to us over unix sockets.
`node_options` turns a `SwarmConfig` into `DHTNode.create`'s arguments (listen or not, relays,
NAT port mapping only where others may dial); `sweep_stale_sockets` removes the socket files of
daemons killed without cleaning up, which otherwise pile up in /tmp (dht.py calls it before
each start).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sapo_core.config import SwarmConfig
from sapo_core.swarm.identity import NodeIdentity

SOCKET_DIR = "/tmp"  # where hivemind's p2pd and its client put their unix sockets
_SOCKET_PATTERNS = ("hivemind-p2pd-*.sock", "hivemind-p2pclient-*.sock")


def sweep_stale_sockets(directory: str = SOCKET_DIR, min_age: float = 10.0) -> int:
    """Remove the unix socket files of p2p daemons that died without cleaning up (a node killed
    with SIGKILL leaves its daemon's; a clean stop removes it): ours (same uid), older than
    `min_age` seconds, and nobody listening (connecting is refused). A live daemon's socket,
    ours or another hivemind program's, always accepts, so it stays. Returns how many went."""
    import glob
    import os
    import socket
    import stat
    import time

    removed = 0
    for pattern in _SOCKET_PATTERNS:
        for path in glob.glob(os.path.join(directory, pattern)):
            try:
                st = os.lstat(path)
                if not stat.S_ISSOCK(st.st_mode) or st.st_uid != os.getuid() or time.time() - st.st_mtime < min_age:
                    continue
                with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
                    s.settimeout(1.0)
                    try:
                        s.connect(path)
                        continue  # someone listens: a live daemon
                    except ConnectionRefusedError:
                        pass
                os.unlink(path)
                removed += 1
            except OSError:  # gone meanwhile, not ours to touch, a slow listener: leave it
                continue
    return removed


def listens_beyond_loopback(host_maddrs: Sequence[str]) -> bool:
    """Whether any listen address is more than loopback (0.0.0.0 and :: are everything)."""
    import ipaddress

    for maddr in host_maddrs:
        parts = maddr.split("/")
        if len(parts) < 3 or parts[1] not in ("ip4", "ip6"):
            return True  # a DNS name or something else: assume it can be reached
        try:
            if not ipaddress.ip_address(parts[2]).is_loopback:
                return True
        except ValueError:
            return True
    return False


def node_options(cfg: SwarmConfig, identity: NodeIdentity, validator: Any, client_mode: bool) -> dict[str, Any]:
    """`DHTNode.create`'s keyword arguments for this node (`validator`: our record validator)."""
    from hivemind.dht.routing import DHTID

    kwargs: dict[str, Any] = dict(
        node_id=DHTID.generate(source=identity.peer_id),  # stable across restarts, as the peer id
        initial_peers=list(cfg.initial_peers) or None,
        identity_path=str(identity.path),
        # p2pd checks a reused identity is not running elsewhere (one more daemon start);
        # a key made just now cannot be
        check_if_identity_free=not identity.fresh,
        record_validator=validator,
        client_mode=client_mode,
        use_relay=cfg.use_relay,
        # behind NAT, p2pd reserves a slot at a relay (the bootstrap peers by default)
        use_auto_relay=cfg.use_relay and cfg.reachability != "reachable",
        num_replicas=cfg.replicas,
        wait_timeout=cfg.rpc_timeout,
        bootstrap_timeout=cfg.join_timeout,
        ensure_bootstrap_success=False,  # no answer: train alone and retry (joining.py)
        startup_timeout=cfg.start_timeout,
        # UPnP / NAT-PMP asks the router on the local network: only for a node others may dial
        nat_port_map=cfg.nat_port_map and listens_beyond_loopback(cfg.host_maddrs),
    )
    if cfg.host_maddrs:
        kwargs["host_maddrs"] = list(cfg.host_maddrs)
    else:
        kwargs["no_listen"] = True
    if cfg.announce_maddrs:
        kwargs["announce_maddrs"] = list(cfg.announce_maddrs)
    if client_mode:
        kwargs["force_reachability"] = "private"
    return kwargs
