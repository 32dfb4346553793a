"""LAN discovery: nodes of the same swarm on one network find each other with no typing.

Each node announces a DNS-SD service `_sapo-swarm._tcp.local.` over mDNS (python-zeroconf)
whose TXT record names the swarm, the peer id and up to three listening multiaddrs, and browses
for the others. A found node of our swarm is handed to `on_found(peer_id, maddrs)` (called in
zeroconf's thread); the DHT thread dials it. A node listening nowhere only browses.

Announcements are untrusted: `parse_announcement` checks every field (sizes, characters, the
swarm's name) and drops anything else; a bogus one costs one failed dial. Off with
`swarm.lan_discovery = false`; `swarm.lan_interfaces` limits it to some interfaces (the tests
use loopback only).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from sapo_core.config import SwarmConfig

SERVICE_TYPE = "_sapo-swarm._tcp.local."
MAX_ADDRS = 3
MAX_MADDR_CHARS = 200
PEER_ID_CHARS = set("123456789ABCDEFGHJKLMNPQRSTUVWXYZabcdefghijkmnopqrstuvwxyz")  # base58
FoundFn = Callable[[str, list[str]], None]


class DiscoveryError(RuntimeError):
    """mDNS could not start here (no multicast-capable interface, port 5353 refused, ...)."""


def announcement(swarm: str, peer_id: str, maddrs: Sequence[str]) -> dict[str, str]:
    """The TXT properties we announce (each value well under DNS-SD's 255 bytes)."""
    props = {"v": "1", "swarm": swarm, "peer": peer_id}
    for i, m in enumerate([m for m in maddrs if len(m) <= MAX_MADDR_CHARS][:MAX_ADDRS]):
        props[f"a{i}"] = m
    return props


def parse_announcement(
    props: Mapping[bytes | str, bytes | str | None], swarm: str, own_peer_id: str
) -> tuple[str, list[str]] | None:
    """(peer id, multiaddrs) of a node of `swarm` other than us; None for anything else."""

    def text(key: str) -> str:
        value = props.get(key.encode(), props.get(key))
        if isinstance(value, bytes):
            try:
                return value.decode("ascii")
            except UnicodeDecodeError:
                return ""
        return value if isinstance(value, str) else ""

    if text("v") != "1" or text("swarm") != swarm:
        return None
    peer = text("peer")
    if not (20 <= len(peer) <= 64 and set(peer) <= PEER_ID_CHARS) or peer == own_peer_id:
        return None
    addrs = []
    for i in range(MAX_ADDRS):
        m = text(f"a{i}")
        if (
            m.startswith("/")
            and len(m) <= MAX_MADDR_CHARS
            and "p2p-circuit" not in m
            and all(c.isalnum() or c in "/.:-_" for c in m)
        ):
            addrs.append(m.split("/p2p/")[0])  # the transport part; the peer id is given separately
    return (peer, addrs) if addrs else None


def discovery_interfaces(cfg: SwarmConfig) -> list[str] | None:
    """Where mDNS runs: `swarm.lan_interfaces` if given, else the interfaces the node listens on;
    [] means all (listening on 0.0.0.0 or nowhere); None means nowhere: a node listening on
    loopback only is a test or an experiment on one machine, and must not meet other processes'
    nodes (other test runs) by surprise; give lan_interfaces = ["127.0.0.1"] to want that."""
    from sapo_core.swarm.reachability import ip_of

    if cfg.lan_interfaces:
        return list(cfg.lan_interfaces)
    ips = [ip_of(m) for m in cfg.host_maddrs]
    if not ips or any(ip is None or ip in ("0.0.0.0", "::") for ip in ips):
        return []
    ips = sorted(set(ip for ip in ips if ip and not ip.startswith("127.") and ip != "::1"))
    return ips or None


def addresses_to_announce(maddrs: Sequence[str], interfaces: Sequence[str]) -> list[str]:
    """Our direct addresses, loopback ones only when announcing on loopback (or nothing else)."""
    direct = [m for m in maddrs if "/p2p-circuit" not in m]
    outside = [m for m in direct if "/ip4/127." not in m and "/ip6/::1/" not in m]
    return direct if "127.0.0.1" in interfaces or not outside else outside


def _instance_name(swarm: str, peer_id: str) -> str:
    return f"{swarm[:40]}-{peer_id[-12:]}.{SERVICE_TYPE}"


class LanDiscovery:
    """Announce this node and browse for others of the same swarm until `close()`."""

    def __init__(
        self, swarm: str, peer_id: str, maddrs: Sequence[str], on_found: FoundFn, interfaces: Sequence[str] = ()
    ) -> None:
        self.swarm, self.peer_id, self.maddrs = swarm, peer_id, list(maddrs)
        self.on_found = on_found
        self.interfaces = list(interfaces)
        self.found: dict[str, list[str]] = {}
        self._lock = threading.Lock()
        self._zc = None
        self._browser = None
        self._info = None

    def start(self) -> None:
        try:
            from zeroconf import InterfaceChoice, ServiceBrowser, ServiceInfo, Zeroconf
        except ImportError as e:
            raise DiscoveryError(f"python-zeroconf is not installed ({e}); pip install zeroconf") from None
        try:
            self._zc = Zeroconf(interfaces=self.interfaces or InterfaceChoice.All)
        except OSError as e:
            raise DiscoveryError(f"mDNS could not start: {e}") from None
        tcp = [m for m in self.maddrs if "/tcp/" in m]
        if tcp:
            from sapo_core.swarm.reachability import ip_of, tcp_ports

            ips = sorted({ip for ip in (ip_of(m) for m in tcp) if ip and ip != "0.0.0.0"})
            import ipaddress

            self._info = ServiceInfo(
                SERVICE_TYPE,
                _instance_name(self.swarm, self.peer_id),
                port=tcp_ports(tcp)[0],
                addresses=[ipaddress.ip_address(ip).packed for ip in ips],
                properties=announcement(self.swarm, self.peer_id, tcp),
            )
            try:
                self._zc.register_service(self._info, allow_name_change=True)
            except Exception as e:  # noqa: BLE001 - zeroconf raises several kinds; none is fatal
                self.close()
                raise DiscoveryError(f"mDNS announcement failed: {type(e).__name__}: {e}") from None
        self._browser = ServiceBrowser(self._zc, SERVICE_TYPE, handlers=[self._on_service_state_change])

    def _on_service_state_change(self, zeroconf, service_type: str, name: str, state_change) -> None:
        from zeroconf import ServiceStateChange

        if state_change not in (ServiceStateChange.Added, ServiceStateChange.Updated):
            return
        try:
            info = zeroconf.get_service_info(service_type, name, timeout=2000)
        except Exception:  # noqa: BLE001 - a malformed answer is one lost announcement
            return
        if info is None or not info.properties:
            return
        parsed = parse_announcement(info.properties, self.swarm, self.peer_id)
        if parsed is None:
            return
        peer, addrs = parsed
        with self._lock:
            if self.found.get(peer) == addrs or len(self.found) >= 256:
                return
            self.found[peer] = addrs
        self.on_found(peer, addrs)

    def close(self) -> None:
        zc, self._zc = self._zc, None
        if zc is None:
            return
        try:
            if self._browser is not None:
                self._browser.cancel()
            if self._info is not None:
                zc.unregister_service(self._info)
        finally:
            zc.close()


__all__ = [
    "LanDiscovery",
    "DiscoveryError",
    "announcement",
    "parse_announcement",
    "discovery_interfaces",
    "addresses_to_announce",
    "SERVICE_TYPE",
]
