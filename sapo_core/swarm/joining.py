"""Joining a swarm through its initial peers, and staying joined.

With `initial_peers`, the node pings them at start (`create_joined`); if none answers it logs a
clear message, keeps working alone (publishing into its own DHT) and retries in the background
with exponential backoff (`keep_joined`), also whenever it later loses every peer. p2pd refuses
to start when no bootstrap peer answers ("failed to connect to bootstrap peers"), and a started
node may still find none of them answering its ping: both count as "no answer". These run in
the DHT thread's event loop (dht.py).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

from sapo_core.config import SwarmConfig

log = logging.getLogger(__name__)


def num_peers_of(node: Any) -> int:
    """DHT peers in a node's routing table (a dict's len: atomic, read from any thread)."""
    return len(node.protocol.routing_table.uid_to_peer_id)


async def create_joined(node_cls: Any, kwargs: dict[str, Any], cfg: SwarmConfig) -> Any:
    """`node_cls.create(**kwargs)` with the initial peers, retried with backoff; alone if none answers."""
    peers = ", ".join(cfg.initial_peers)
    delay = cfg.rejoin_min_seconds
    for attempt in range(1, cfg.join_attempts + 1 if cfg.initial_peers else 1):
        try:
            node = await node_cls.create(**kwargs)
        except Exception as e:
            if "bootstrap" not in str(e):
                raise
        else:
            if num_peers_of(node) > 0:
                return node
            await node.shutdown()
        if attempt < cfg.join_attempts:
            log.warning(
                f"no peer answered at {peers} (attempt {attempt}/{cfg.join_attempts}); retrying in {delay:.0f} s"
            )
            await asyncio.sleep(delay)
            delay = min(delay * 2, cfg.rejoin_max_seconds)
    if cfg.initial_peers:
        log.warning(
            f"no peer answered at {peers}: check the address and that the peer is running. "
            f"Training alone meanwhile; retrying with backoff"
        )
    alone = dict(kwargs, initial_peers=None, check_if_identity_free=False)
    return await node_cls.create(**alone)


async def dial(node: Any, peer_id: str, transports: list[str], cfg: SwarmConfig) -> bool:
    """Connect to a peer at its transport addresses (no /p2p/ part, as p2pd's connect wants),
    ping it, and learn our neighbourhood through it; False if it did not answer."""
    from hivemind.p2p import PeerID
    from hivemind.utils.multiaddr import Multiaddr

    peer = PeerID.from_base58(peer_id)
    await asyncio.wait_for(node.p2p._client.connect(peer, [Multiaddr(m) for m in transports]), cfg.rpc_timeout)
    if await node.protocol.call_ping(peer) is None:
        return False
    await asyncio.wait_for(node.find_nearest_nodes([node.node_id]), cfg.join_timeout)
    return True


async def keep_joined(node: Any, cfg: SwarmConfig, closed: Callable[[], bool]) -> None:
    """While `node` has no peer, dial and ping the initial peers with exponential backoff;
    until `closed()`."""
    delay = cfg.rejoin_min_seconds
    alone = num_peers_of(node) == 0
    while not closed():
        if num_peers_of(node) > 0:
            if alone:  # a peer reached us, or a dial that timed out half-way still got through
                log.info(f"joined swarm '{cfg.swarm_name}' via {num_peers_of(node)} peer(s)")
                alone = False
            delay = cfg.rejoin_min_seconds
            await asyncio.sleep(cfg.rejoin_min_seconds * 4)
            continue
        alone = True
        await asyncio.sleep(delay)
        for maddr in cfg.initial_peers:
            transport, _, peer_id = maddr.rpartition("/p2p/")
            try:
                await dial(node, peer_id, [transport], cfg)
            except asyncio.CancelledError:
                raise
            except Exception:  # unreachable peers are the normal case here
                continue
            if num_peers_of(node) > 0:
                log.info(f"joined swarm '{cfg.swarm_name}' via {maddr}")
                alone = False
                break
        else:
            if delay < cfg.rejoin_max_seconds:  # say it while the pause grows, then stay quiet
                delay = min(delay * 2, cfg.rejoin_max_seconds)
                log.warning(f"still no peer answers; next try in {delay:.0f} s")
