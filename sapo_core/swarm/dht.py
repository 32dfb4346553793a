"""A hivemind `DHTNode` in its own thread and asyncio loop inside the node process.

Why not `hivemind.DHT`: that front-end forks a child and talks to it over a pipe that dies on
values above a few KB (docs/environment.md, 'hivemind: the forked DHT pipe';
gensyn-ai/rl-swarm issues #102, #227). Driving `DHTNode` directly has no such pipe. The round
loop is synchronous, so every call here blocks with a timeout and raises `SwarmTimeout` instead
of hanging a round.

Joining (joining.py): with `initial_peers`, the node pings them at start; if none answers it
logs a clear message, keeps working alone (publishing into its own DHT) and retries in the
background with exponential backoff, also whenever it later loses every peer. Without
`initial_peers` it hosts a new swarm and logs the addresses others join with. p2pd.py has the
node's options and the daemon's leftover sockets.

Reachability (reachability.py): once joined, peers dial this node back. Reachable, it serves
the DHT, answers others' dial-backs and relays for them (p2pd's relay service); unreachable
(`swarm.reachability = "auto"`), it restarts its DHT node as a client: it stores its records on
reachable peers and reads from them, so nobody ever has to dial it; p2pd's auto-relay takes a
relay slot at a bootstrap peer where libp2p finds one. A node listening nowhere is a client from
the start. LAN discovery (discovery.py) announces and finds nodes of the same swarm by mDNS.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import threading
from collections.abc import Awaitable, Callable, Mapping, Sequence
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Any

from sapo_core.config import SwarmConfig
from sapo_core.swarm.identity import NodeIdentity
from sapo_core.swarm.joining import create_joined, dial, keep_joined, num_peers_of
from sapo_core.swarm.keys import KeySpace
from sapo_core.swarm.p2pd import node_options, sweep_stale_sockets
from sapo_core.swarm.reachability import REACHABLE, UNKNOWN, UNREACHABLE, DialbackService, Reachability
from sapo_core.swarm.validation import ReasonCounter, make_validators

log = logging.getLogger(__name__)


class SwarmError(RuntimeError):
    """The swarm could not start; the text says why and what to change."""


class SwarmTimeout(TimeoutError):
    """A DHT call took longer than its timeout (the round goes on without it)."""


class SwarmDHT:
    """Owns the event loop thread, the DHTNode (and its p2pd child) and the rejoin task."""

    def __init__(
        self, cfg: SwarmConfig, identity: NodeIdentity, keyspace: KeySpace, dht_rejections: ReasonCounter
    ) -> None:
        self.cfg = cfg
        self.identity = identity
        self.keyspace = keyspace
        self.dht_rejections = dht_rejections
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._run_loop, name="sapo-swarm-dht", daemon=True)
        self._node: Any = None
        self._rejoin_task: asyncio.Task | None = None
        self._periodic: list[asyncio.Future] = []
        self._closed = False
        self.visible_maddrs: list[str] = []
        self._hivemind_key = identity.hivemind_key()
        self.reachability = Reachability()
        self.client_mode = cfg.client_mode or cfg.reachability == "unreachable" or not cfg.host_maddrs
        self.discovery: Any = None  # discovery.LanDiscovery while it runs
        self._reachability_task: asyncio.Task | None = None
        self.lan_peers: set[str] = set()

    # --- lifecycle ------------------------------------------------------------------------

    def _run_loop(self) -> None:
        asyncio.set_event_loop(self._loop)
        self._loop.run_forever()

    def start(self) -> None:
        """Start p2pd and the DHT node; SwarmError with a readable reason if that fails."""
        swept = sweep_stale_sockets()
        if swept:
            log.info(f"swarm: removed {swept} p2p daemon socket file(s) that killed nodes left behind")
        self._thread.start()
        try:
            attempts = self.cfg.join_attempts if self.cfg.initial_peers else 0
            pauses = sum(min(self.cfg.rejoin_min_seconds * 2**k, self.cfg.rejoin_max_seconds) for k in range(attempts))
            budget = (attempts + 1) * (self.cfg.start_timeout + self.cfg.join_timeout) + pauses + 30
            self._call(self._create(), timeout=budget)
        except SwarmTimeout:
            self.close()
            raise SwarmError(
                f"the DHT did not start within {self.cfg.start_timeout:.0f} s; is the "
                f"machine overloaded? Raise swarm.start_timeout or retry"
            ) from None
        except Exception as e:
            self.close()
            text = str(e)
            if "already taken" in text:
                raise SwarmError(
                    f"another running node already uses the identity {self.identity.path} "
                    f"({self.identity.name}). Stop it, or give this node its own identity "
                    f"(swarm.identity_path)"
                ) from None
            raise SwarmError(f"the swarm's DHT did not start: {type(e).__name__}: {e}") from None

    async def _create(self) -> None:
        from hivemind.dht.node import DHTNode
        from hivemind.dht.validation import CompositeValidator

        from sapo_core.logs import adopt_library_loggers

        adopt_library_loggers()  # hivemind's records reach the Log tab, not its own stderr handler
        validator = CompositeValidator(make_validators(self._hivemind_key, self.keyspace, self.dht_rejections))
        kwargs = node_options(self.cfg, self.identity, validator, self.client_mode)
        self._node = await create_joined(DHTNode, kwargs, self.cfg)
        await self._refresh_maddrs()
        if self.client_mode:
            self.reachability = Reachability(
                UNREACHABLE,
                relayed=self._relayed(),
                detail=(
                    "this node listens on no address"
                    if not self.cfg.host_maddrs
                    else "set by swarm.reachability or swarm.client_mode"
                ),
            )
        elif self.num_peers() > 0:
            await self._check_reachability()
            if self.reachability.status == UNREACHABLE and not self.client_mode and self.cfg.reachability == "auto":
                await self._restart_as_client(DHTNode, kwargs)
        if not self.client_mode:
            await DialbackService(self._node.p2p).start()
        log.info(f"swarm: {self.reachability.words()}")
        self._reachability_task = asyncio.create_task(self._recheck_reachability())
        if self.cfg.lan_discovery:
            await self._start_discovery()
        if self.cfg.initial_peers:
            if self.num_peers() > 0:
                log.info(f"joined swarm '{self.cfg.swarm_name}' via {self.num_peers()} peer(s)")
            self._rejoin_task = asyncio.create_task(keep_joined(self._node, self.cfg, lambda: self._closed))
        else:
            self._say_hosting()

    async def _restart_as_client(self, node_cls: Any, kwargs: dict[str, Any]) -> None:
        """Peers cannot dial us: start the DHT node again as a client, which stores on and reads
        from reachable peers, so nobody ever has to dial it."""
        from hivemind.dht.routing import DHTID

        log.warning(f"swarm: peers cannot dial this node ({self.reachability.detail}); restarting it as a DHT client")
        await self._node.shutdown()
        self.client_mode = True
        # a fresh DHT id: peers still list the server we were under the old one, and a
        # search that returns the searcher's own id trips an assertion in hivemind
        kwargs.update(
            client_mode=True,
            force_reachability="private",
            check_if_identity_free=False,
            node_id=DHTID.generate(),
        )
        self._node = await create_joined(node_cls, kwargs, self.cfg)
        await self._refresh_maddrs()
        self.reachability = dataclasses.replace(self.reachability, relayed=self._relayed())

    def _say_hosting(self) -> None:
        """A node without initial peers hosts a new swarm: say the address others join with."""
        from sapo_core.swarm.reachability import is_private

        address = self.best_maddr()
        log.info(
            f"hosting a new swarm '{self.cfg.swarm_name}'; others join with "
            f"--initial-peers {address or '(no address found)'}"
        )
        if address and is_private(address):
            log.warning(
                "swarm: that address is private: only computers on this network can "
                "join through it (docs/swarm.md, Joining)"
            )

    async def _refresh_maddrs(self) -> None:
        try:
            self.visible_maddrs = [str(m) for m in await self._node.get_visible_maddrs(latest=True)]
        except ValueError:  # listening nowhere and no relay slot (yet)
            self.visible_maddrs = []

    def _relayed(self) -> bool:
        return any("/p2p-circuit" in m for m in self.visible_maddrs)

    async def _check_reachability(self) -> None:
        """Ask joined peers to dial us back (reachability.py); a client asks nobody."""
        from sapo_core.swarm import reachability

        if self.client_mode:
            return
        peers = list(self._node.protocol.routing_table.uid_to_peer_id.values())
        found = await reachability.check(self._node.p2p, peers, self.visible_maddrs, self.cfg.rpc_timeout + 3)
        if found.status != UNKNOWN or self.reachability.status == UNKNOWN:
            self.reachability = dataclasses.replace(found, relayed=self._relayed())

    async def _recheck_reachability(self) -> None:
        """While nobody could tell (no peer yet), ask again once peers turn up; then say it once."""
        while not self._closed and self.reachability.status == UNKNOWN and not self.client_mode:
            await asyncio.sleep(self.cfg.rejoin_min_seconds * 4)
            if self.num_peers() > 0:
                try:
                    await self._check_reachability()
                except asyncio.CancelledError:
                    raise
                except Exception as e:  # asked again later
                    log.warning(f"swarm: reachability check failed: {type(e).__name__}: {e}")
                    continue
                if self.reachability.status != UNKNOWN:
                    log.info(f"swarm: {self.reachability.words()}")

    async def _start_discovery(self) -> None:
        from sapo_core.swarm.discovery import DiscoveryError, LanDiscovery, addresses_to_announce, discovery_interfaces

        loop = asyncio.get_running_loop()

        def found(peer_id: str, maddrs: list[str]) -> None:  # zeroconf's thread
            loop.call_soon_threadsafe(lambda: asyncio.ensure_future(self._dial_found(peer_id, maddrs)))

        interfaces = discovery_interfaces(self.cfg)
        if interfaces is None:
            return  # listening on loopback only: see discovery_interfaces
        try:
            self.discovery = LanDiscovery(
                self.cfg.swarm_name,
                self.identity.peer_id,
                addresses_to_announce(self.visible_maddrs, interfaces),
                found,
                interfaces=interfaces,
            )
            await loop.run_in_executor(None, self.discovery.start)
        except DiscoveryError as e:
            self.discovery = None
            log.warning(f"swarm: LAN discovery is off: {e}")

    async def _dial_found(self, peer_id: str, maddrs: list[str]) -> None:
        """A node of our swarm announced itself on the LAN: dial it unless we know it already."""
        from hivemind.p2p import PeerID

        if self._closed or self._node is None:
            return
        try:
            if PeerID.from_base58(peer_id) in self._node.protocol.routing_table.peer_id_to_uid:
                return
            if await dial(self._node, peer_id, maddrs, self.cfg):
                self.lan_peers.add(peer_id)
                log.info(f"joined swarm '{self.cfg.swarm_name}' via {peer_id}, found on the local network")
        except asyncio.CancelledError:
            raise
        except Exception as e:  # a stale or bogus announcement costs one try
            log.debug(f"swarm: LAN peer {peer_id[:16]}… did not answer: {type(e).__name__}")

    def figures(self) -> dict[str, float]:
        """This node's joining state for the round's metrics (the app's Swarm tab reads them)."""
        r = self.reachability
        return {
            "swarm/reachable": {REACHABLE: 1.0, UNREACHABLE: 0.0}.get(r.status, -1.0),
            "swarm/relayed": float(self._relayed()),
            "swarm/client_mode": float(self.client_mode),
            "swarm/lan_peers": float(len(self.lan_peers)),
        }

    def best_maddr(self) -> str:
        """The address to hand out: the one a peer reached us at, else a public one, else not
        loopback if another exists; a client hands out its relayed address if it has one."""
        from sapo_core.swarm.reachability import is_private

        if self.reachability.status == REACHABLE and self.reachability.address:
            return f"{self.reachability.address}/p2p/{self.identity.peer_id}"
        if self.client_mode:
            return next((m for m in self.visible_maddrs if "/p2p-circuit" in m), "")
        public = [m for m in self.visible_maddrs if not is_private(m)]
        others = [m for m in self.visible_maddrs if "/127.0.0.1/" not in m and "/::1/" not in m]
        return (public or others or self.visible_maddrs or [""])[0]

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._thread.is_alive():
            try:
                self._call(self._shutdown(), timeout=15)
            except Exception as e:  # closing must not raise: p2pd is reaped when we exit anyway
                log.warning(f"swarm shutdown was not clean: {type(e).__name__}: {e}")
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout=5)
            if not self._thread.is_alive():
                self._loop.close()

    async def _shutdown(self) -> None:
        if self.discovery is not None:
            await asyncio.get_running_loop().run_in_executor(None, self.discovery.close)
        for task in [self._rejoin_task, self._reachability_task, *self._periodic]:
            if task is not None:
                task.cancel()
        if self._node is not None:
            await self._node.shutdown()
        # hivemind leaves background tasks (routing refresh, cache refresh): end them here
        others = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        for task in others:
            task.cancel()
        await asyncio.wait(others, timeout=5) if others else None

    # --- blocking calls -------------------------------------------------------------------

    def _call(self, coro: Awaitable[Any], timeout: float) -> Any:
        if self._loop.is_closed() or not self._thread.is_alive():
            coro.close()  # type: ignore[attr-defined]
            raise SwarmError("the swarm's DHT is not running (closed, or it failed to start)")
        future = asyncio.run_coroutine_threadsafe(coro, self._loop)  # type: ignore[arg-type]
        try:
            return future.result(timeout)
        except FutureTimeout:
            future.cancel()
            raise SwarmTimeout(f"DHT call took more than {timeout:.1f} s") from None

    def num_peers(self) -> int:
        """DHT peers in our routing table (read from any thread: a dict's len is atomic)."""
        node = self._node
        return 0 if node is None else num_peers_of(node)

    def routing_peer_ids(self) -> set[str]:
        """Peer ids (base58) of the DHT nodes in our routing table; empty before the node
        exists. Read from any thread: the table's values are copied first."""
        node = self._node
        if node is None:
            return set()
        return {p.to_base58() for p in list(node.protocol.routing_table.uid_to_peer_id.values())}

    async def _store(self, items: Sequence[tuple[str, bytes, float]]) -> dict[str, bool]:
        from sapo_core.swarm.validation import owner_tag

        subkey = owner_tag(self._hivemind_key.get_public_key().to_bytes())
        keys = [k for k, _, _ in items]
        ok = await self._node.store_many(
            keys, [v for _, v, _ in items], [e for _, _, e in items], subkeys=[subkey] * len(items)
        )
        return {k: bool(ok.get((k, subkey), False)) for k in keys}

    def store(self, items: Sequence[tuple[str, bytes, float]], timeout: float) -> dict[str, bool]:
        """Store (key, payload, expiration) items under our owner subkey; key -> stored somewhere."""
        return self._call(self._store(items), timeout)

    def store_periodically(self, interval: float, make_items: Callable[[], Sequence[tuple[str, bytes, float]]]) -> None:
        """Every `interval` s, store what `make_items()` (run in the DHT thread) returns, if anything."""

        async def loop() -> None:
            while not self._closed:
                await asyncio.sleep(interval)
                try:
                    items = make_items()
                    if items:
                        await asyncio.wait_for(self._store(items), self.cfg.publish_timeout)
                except asyncio.CancelledError:
                    raise
                except TimeoutError:
                    log.warning(
                        f"swarm: re-publishing took over {self.cfg.publish_timeout:.0f} s; "
                        f"the next round publishes anew"
                    )
                except Exception as e:  # the next round publishes anew anyway
                    log.warning(f"swarm: re-publishing failed: {type(e).__name__}: {e}")

        def schedule() -> None:
            self._periodic.append(asyncio.ensure_future(loop()))

        self._loop.call_soon_threadsafe(schedule)

    def get_many(
        self,
        keys: Sequence[str],
        timeout: float,
        newer_than: Mapping[str, float] | None = None,
        beam_size: int | None = None,
    ) -> dict[str, dict[bytes, tuple[bytes, float]]]:
        """key -> {owner subkey: (payload, expiration)} for keys found within `timeout`.

        A key in `newer_than` is searched until a value expiring at or after that time turns up
        (a record whose index entry we hold: stop at the first copy that new); other keys until
        their neighbourhood is visited (latest values, dictionaries merged across replicas).
        `beam_size` bounds how many nodes near a key a search visits. Values come validated by
        our chain. Keys still searching at the deadline are given up: a slow part of the swarm
        costs its keys, not the round.
        """
        if not keys:
            return {}
        newer_than = newer_than or {}
        by_time: dict[float, list[str]] = {}
        for key in keys:
            by_time.setdefault(newer_than.get(key, float("inf")), []).append(key)
        extra = {} if beam_size is None else {"beam_size": beam_size}

        async def run() -> dict[str, dict[bytes, tuple[bytes, float]]]:
            futures: dict[str, Any] = {}
            for sufficient, group in by_time.items():
                futures.update(
                    await self._node.get_many(
                        group, sufficient_expiration_time=sufficient, return_futures=True, **extra
                    )
                )
            _, pending = await asyncio.wait(list(futures.values()), timeout=timeout)
            for f in pending:
                f.cancel()
            out: dict[str, dict[bytes, tuple[bytes, float]]] = {}
            for key, future in futures.items():
                if future in pending or future.cancelled() or future.exception() is not None:
                    continue
                item = future.result()
                if item is None or not isinstance(item.value, dict):
                    continue
                out[key] = {
                    sub: (v.value, v.expiration_time) for sub, v in item.value.items() if isinstance(v.value, bytes)
                }
            return out

        return self._call(run(), timeout + 5)
