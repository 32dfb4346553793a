"""Can peers dial this node? A dial-back by peers, as libp2p's AutoNAT does it.

p2pd runs go-libp2p's AutoNAT, but its control API does not say what AutoNAT concluded, and
AutoNAT servers refuse to dial private addresses (so on a LAN or loopback it never concludes).
So we ask joined peers ourselves: every node that serves the DHT answers `sapo.dialback`; a
node asks up to three of them to open a fresh TCP connection to the ports it listens on. Like
AutoNAT, the peer dials only the IP address it sees the request coming from (so the service
cannot be used to make peers connect anywhere else), at most `MAX_PORTS` ports, each with a
short timeout, and at most a few dial-backs at once.

Verdicts: `reachable` (some peer connected: we give out the address it reached), `unreachable`
(peers answered but none could connect: behind NAT or a firewall), `unknown` (nobody to ask).
"""

from __future__ import annotations

import asyncio
import ipaddress
import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

DIALBACK_HANDLER = "sapo.dialback"
MAX_PORTS = 4
MAX_REQUEST_BYTES = 512
DIAL_TIMEOUT = 2.0
MAX_CONCURRENT_DIALBACKS = 4
REACHABLE, UNREACHABLE, UNKNOWN = "reachable", "unreachable", "unknown"
# Addresses nobody on the internet can dial: this host, private ranges (RFC 1918, RFC 4193),
# link-local, carrier-grade NAT (RFC 6598), unspecified. (Python's is_private also counts the
# documentation ranges, which examples use as public addresses.)
PRIVATE_NETWORKS = [
    ipaddress.ip_network(n)
    for n in (
        "127.0.0.0/8",
        "10.0.0.0/8",
        "172.16.0.0/12",
        "192.168.0.0/16",
        "169.254.0.0/16",
        "100.64.0.0/10",
        "0.0.0.0/32",
        "::1/128",
        "::/128",
        "fc00::/7",
        "fe80::/10",
    )
]


@dataclass(frozen=True)
class Reachability:
    """What the dial-back found; `address` is a multiaddr a peer reached (empty if none)."""

    status: str = UNKNOWN
    address: str = ""
    asked: int = 0  # peers that answered
    detail: str = ""
    relayed: bool = False  # we hold a relay reservation (a /p2p-circuit address)
    relays: list[str] = field(default_factory=list)

    def words(self) -> str:
        """One line for the log and the app."""
        if self.status == REACHABLE:
            return f"reachable at {self.address}" if self.address else "reachable"
        if self.status == UNREACHABLE:
            how = "using a relay" if self.relayed else "joining as a DHT client (others store our records)"
            return f"behind NAT: {how}"
        return f"reachability unknown ({self.detail or 'no peer to ask yet'})"


def tcp_ports(maddrs: Sequence[str]) -> list[int]:
    """The TCP ports in our listening multiaddrs, in order, without repeats (at most MAX_PORTS)."""
    out: list[int] = []
    for m in maddrs:
        parts = m.split("/")
        if "tcp" in parts and "p2p-circuit" not in parts:
            i = parts.index("tcp")
            if i + 1 < len(parts) and parts[i + 1].isdigit():
                port = int(parts[i + 1])
                if 0 < port < 65536 and port not in out:
                    out.append(port)
    return out[:MAX_PORTS]


def ip_of(maddr: str) -> str | None:
    """'/ip4/203.0.113.5/tcp/1/p2p/Qm' -> '203.0.113.5'; None for relayed or non-IP addresses."""
    parts = maddr.split("/")
    if "p2p-circuit" in parts:
        return None
    for proto in ("ip4", "ip6"):
        if proto in parts:
            i = parts.index(proto)
            if i + 1 < len(parts):
                try:
                    return str(ipaddress.ip_address(parts[i + 1]))
                except ValueError:
                    return None
    return None


def is_private(maddr: str) -> bool:
    """True for loopback, private (RFC 1918, ULA), link-local and CGNAT addresses: nobody on the
    internet can dial them. Relayed and DNS addresses count as public."""
    ip = ip_of(maddr)
    if ip is None:
        return False
    addr = ipaddress.ip_address(ip)
    return any(addr in net for net in PRIVATE_NETWORKS if net.version == addr.version)


def parse_request(data: bytes) -> list[int]:
    """The ports a dial-back request names; [] for anything malformed (peer data is untrusted)."""
    if len(data) > MAX_REQUEST_BYTES:
        return []
    try:
        ports = json.loads(data.decode("utf-8")).get("ports", [])
    except (ValueError, UnicodeDecodeError, AttributeError):
        return []
    if not isinstance(ports, list):
        return []
    return [p for p in ports if isinstance(p, int) and not isinstance(p, bool) and 0 < p < 65536][:MAX_PORTS]


async def _can_connect(ip: str, port: int, timeout: float) -> bool:
    try:
        _, writer = await asyncio.wait_for(asyncio.open_connection(ip, port), timeout)
    except (TimeoutError, OSError):
        return False
    writer.close()
    try:
        await asyncio.wait_for(writer.wait_closed(), 1.0)
    except (TimeoutError, OSError):
        pass
    return True


class DialbackService:
    """Answers peers' dial-back requests (registered on a DHT server's p2p daemon)."""

    def __init__(self, p2p: Any, dial_timeout: float = DIAL_TIMEOUT) -> None:
        self.p2p = p2p
        self.dial_timeout = dial_timeout
        self._slots = asyncio.Semaphore(MAX_CONCURRENT_DIALBACKS)
        self.answered = 0

    async def start(self) -> None:
        from google.protobuf.wrappers_pb2 import BytesValue

        await self.p2p.add_protobuf_handler(DIALBACK_HANDLER, self._handle, BytesValue)

    async def observed_ip(self, peer: Any) -> str | None:
        """The IP address the peer's connection to us comes from (direct connections only)."""
        for info in await self.p2p.list_peers():
            if info.peer_id == peer:
                for addr in info.addrs:
                    ip = ip_of(str(addr))
                    if ip is not None:
                        return ip
        return None

    async def _handle(self, request: Any, context: Any) -> Any:
        from google.protobuf.wrappers_pb2 import BytesValue

        reached: list[str] = []
        ports = parse_request(request.value)
        ip = await self.observed_ip(context.remote_id) if ports else None
        if ip is not None and not self._slots.locked():
            async with self._slots:
                for port in ports:
                    if await _can_connect(ip, port, self.dial_timeout):
                        proto = "ip6" if ":" in ip else "ip4"
                        reached.append(f"/{proto}/{ip}/tcp/{port}")
        self.answered += 1
        return BytesValue(value=json.dumps({"seen": ip or "", "reached": reached}).encode())


def parse_answer(data: bytes) -> tuple[str, list[str]]:
    """(IP the peer saw, addresses it reached) from a dial-back answer; malformed -> ('', [])."""
    if len(data) > 4096:
        return "", []
    try:
        obj = json.loads(data.decode("utf-8"))
        seen, reached = obj.get("seen", ""), obj.get("reached", [])
    except (ValueError, UnicodeDecodeError, AttributeError):
        return "", []
    if not isinstance(seen, str) or not isinstance(reached, list):
        return "", []
    return seen[:64], [r for r in reached if isinstance(r, str) and len(r) < 128][:MAX_PORTS]


async def check(p2p: Any, peers: Sequence[Any], listen_maddrs: Sequence[str], timeout: float) -> Reachability:
    """Ask up to three `peers` to dial us back on the ports of `listen_maddrs`."""
    from google.protobuf.wrappers_pb2 import BytesValue

    ports = tcp_ports(listen_maddrs)
    if not ports:
        return Reachability(UNREACHABLE, detail="this node listens on no TCP address")
    if not peers:
        return Reachability(UNKNOWN, detail="no peer to ask yet")
    request = BytesValue(value=json.dumps({"ports": ports}).encode())

    async def ask(peer: Any) -> tuple[str, list[str]] | None:
        try:
            answer = await asyncio.wait_for(
                p2p.call_protobuf_handler(peer, DIALBACK_HANDLER, request, BytesValue), timeout
            )
        except asyncio.CancelledError:
            raise
        except Exception:  # an old peer without the handler, or gone: it just does not count
            return None
        return parse_answer(answer.value)

    answers = [a for a in await asyncio.gather(*(ask(p) for p in list(peers)[:3])) if a is not None]
    for _seen, reached in answers:
        if reached:
            return Reachability(
                REACHABLE, address=reached[0], asked=len(answers), detail=f"a peer connected to {reached[0]}"
            )
    if not answers:
        return Reachability(UNKNOWN, detail="no peer answered the dial-back request")
    seen = next((s for s, _ in answers if s), "")
    return Reachability(
        UNREACHABLE,
        asked=len(answers),
        detail=f"{len(answers)} peer(s) saw us at {seen or 'a relayed address'} and could not "
        f"connect to port(s) {', '.join(map(str, ports))}",
    )


__all__ = [
    "Reachability",
    "DialbackService",
    "check",
    "tcp_ports",
    "ip_of",
    "is_private",
    "parse_request",
    "parse_answer",
    "REACHABLE",
    "UNREACHABLE",
    "UNKNOWN",
    "DIALBACK_HANDLER",
]
