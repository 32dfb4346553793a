"""A hivemind `DHTNode` in its own thread and asyncio loop inside the node process.

Why not `hivemind.DHT`: that front-end forks a child and talks to it over a pipe that dies on
values above a few KB (docs/environment.md, 'hivemind: the forked DHT pipe';
gensyn-ai/rl-swarm issues #102, #227). Driving `DHTNode` directly has no such pipe. The round
loop is synchronous, so every call here blocks with a timeout and raises `SwarmTimeout` instead
of hanging a round.

Joining: with `initial_peers`, the node pings them at start; if none answers it logs a clear
message, keeps working alone (publishing into its own DHT) and retries in the background with
exponential backoff, also whenever it later loses every peer. Without `initial_peers` it
hosts a new swarm and logs the addresses others join with.

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
from sapo_core.swarm.keys import KeySpace
from sapo_core.swarm.reachability import REACHABLE, UNKNOWN, UNREACHABLE, DialbackService, Reachability
from sapo_core.swarm.validation import ReasonCounter, make_validators

log = logging.getLogger(__name__)


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
        from hivemind.dht.routing import DHTID
        from hivemind.dht.validation import CompositeValidator

        from sapo_core.logs import adopt_library_loggers

        adopt_library_loggers()  # hivemind's records reach the Log tab, not its own stderr handler
        validator = CompositeValidator(make_validators(self._hivemind_key, self.keyspace, self.dht_rejections))
        kwargs: dict[str, Any] = dict(
            node_id=DHTID.generate(source=self.identity.peer_id),  # stable across restarts, as the peer id
            initial_peers=list(self.cfg.initial_peers) or None,
            identity_path=str(self.identity.path),
            # p2pd checks a reused identity is not running elsewhere (one more daemon start);
            # a key made just now cannot be
            check_if_identity_free=not self.identity.fresh,
            record_validator=validator,
            client_mode=self.client_mode,
            use_relay=self.cfg.use_relay,
            # behind NAT, p2pd reserves a slot at a relay (the bootstrap peers by default)
            use_auto_relay=self.cfg.use_relay and self.cfg.reachability != "reachable",
            num_replicas=self.cfg.replicas,
            wait_timeout=self.cfg.rpc_timeout,
            bootstrap_timeout=self.cfg.join_timeout,
            ensure_bootstrap_success=False,  # no answer: train alone and retry (below)
            startup_timeout=self.cfg.start_timeout,
            # UPnP / NAT-PMP asks the router on the local network: only for a node others may dial
            nat_port_map=self.cfg.nat_port_map and listens_beyond_loopback(self.cfg.host_maddrs),
        )
        if self.cfg.host_maddrs:
            kwargs["host_maddrs"] = list(self.cfg.host_maddrs)
        else:
            kwargs["no_listen"] = True
        if self.cfg.announce_maddrs:
            kwargs["announce_maddrs"] = list(self.cfg.announce_maddrs)
        if self.client_mode:
            kwargs["force_reachability"] = "private"
        self._node = await self._create_joined(DHTNode, kwargs)
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
                log.warning(
                    f"swarm: peers cannot dial this node ({self.reachability.detail}); restarting it as a DHT client"
                )
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
                self._node = await self._create_joined(DHTNode, kwargs)
                await self._refresh_maddrs()
                self.reachability = dataclasses.replace(self.reachability, relayed=self._relayed())
        if not self.client_mode:
            await DialbackService(self._node.p2p).start()
        log.info(f"swarm: {self.reachability.words()}")
        self._reachability_task = asyncio.create_task(self._recheck_reachability())
        if self.cfg.lan_discovery:
            await self._start_discovery()
        if self.cfg.initial_peers:
            if self.num_peers() > 0:
                log.info(f"joined swarm '{self.cfg.swarm_name}' via {self.num_peers()} peer(s)")
            self._rejoin_task = asyncio.create_task(self._keep_joined())
        else:
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

    async def _create_joined(self, node_cls: Any, kwargs: dict[str, Any]) -> Any:
        """DHTNode.create with the initial peers, retried with backoff; alone if none answers.

        p2pd refuses to start when no bootstrap peer answers ("failed to connect to bootstrap
        peers"), and a started node may still find none of them answering its ping.
        """
        peers = ", ".join(self.cfg.initial_peers)
        delay = self.cfg.rejoin_min_seconds
        for attempt in range(1, self.cfg.join_attempts + 1 if self.cfg.initial_peers else 1):
            try:
                node = await node_cls.create(**kwargs)
            except Exception as e:
                if "bootstrap" not in str(e):
                    raise
            else:
                if self.num_peers_of(node) > 0:
                    return node
                await node.shutdown()
            if attempt < self.cfg.join_attempts:
                log.warning(
                    f"no peer answered at {peers} (attempt {attempt}/{self.cfg.join_attempts}); "
                    f"retrying in {delay:.0f} s"
                )
                await asyncio.sleep(delay)
                delay = min(delay * 2, self.cfg.rejoin_max_seconds)
        if self.cfg.initial_peers:
            log.warning(
                f"no peer answered at {peers}: check the address and that the peer is running. "
                f"Training alone meanwhile; retrying with backoff"
            )
        alone = dict(kwargs, initial_peers=None, check_if_identity_free=False)
        return await node_cls.create(**alone)

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
            if await self._dial(peer_id, maddrs):
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

    @staticmethod
    def num_peers_of(node: Any) -> int:
        return len(node.protocol.routing_table.uid_to_peer_id)

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

    async def _dial(self, peer_id: str, transports: list[str]) -> bool:
        """Connect to a peer at its transport addresses (no /p2p/ part, as p2pd's connect wants),
        ping it, and learn our neighbourhood through it; False if it did not answer."""
        from hivemind.p2p import PeerID
        from hivemind.utils.multiaddr import Multiaddr

        peer = PeerID.from_base58(peer_id)
        await asyncio.wait_for(
            self._node.p2p._client.connect(peer, [Multiaddr(m) for m in transports]), self.cfg.rpc_timeout
        )
        if await self._node.protocol.call_ping(peer) is None:
            return False
        await asyncio.wait_for(self._node.find_nearest_nodes([self._node.node_id]), self.cfg.join_timeout)
        return True

    async def _keep_joined(self) -> None:
        """While we have no peer, dial and ping the initial peers with exponential backoff."""
        delay = self.cfg.rejoin_min_seconds
        alone = self.num_peers() == 0
        while not self._closed:
            if self.num_peers() > 0:
                if alone:  # a peer reached us, or a dial that timed out half-way still got through
                    log.info(f"joined swarm '{self.cfg.swarm_name}' via {self.num_peers()} peer(s)")
                    alone = False
                delay = self.cfg.rejoin_min_seconds
                await asyncio.sleep(self.cfg.rejoin_min_seconds * 4)
                continue
            alone = True
            await asyncio.sleep(delay)
            for maddr in self.cfg.initial_peers:
                transport, _, peer_id = maddr.rpartition("/p2p/")
                try:
                    await self._dial(peer_id, [transport])
                except asyncio.CancelledError:
                    raise
                except Exception:  # unreachable peers are the normal case here
                    continue
                if self.num_peers() > 0:
                    log.info(f"joined swarm '{self.cfg.swarm_name}' via {maddr}")
                    alone = False
                    break
            else:
                if delay < self.cfg.rejoin_max_seconds:  # say it while the pause grows, then stay quiet
                    delay = min(delay * 2, self.cfg.rejoin_max_seconds)
                    log.warning(f"still no peer answers; next try in {delay:.0f} s")

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
        return 0 if node is None else self.num_peers_of(node)

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
