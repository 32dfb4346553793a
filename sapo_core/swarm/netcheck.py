"""`sapo-node doctor --network`: can this node join a swarm, and if not, why and what to do.

One child Python (p2pd can hang or crash; the doctor must not) starts a DHT node as the node
would (the config's listen addresses), then, each step bounded in time: lists the addresses it
listens on, pings every bootstrap peer of the config (round trip, and the clock offset read from
the peer's answer: DHT windows depend on clocks), asks the peers that answered to dial it back
(reachability.py), and, if LAN discovery is on, listens a few seconds for nodes of the swarm on
the local network. It prints one JSON line; `judge_network` turns it into the doctor's checks,
each with a fix, so the judging is tested with made-up probe results too.
"""

from __future__ import annotations

import json
from typing import Any

from sapo_core.config import SwarmConfig

CLOCK_WARN_S = 2.0  # hivemind's ping refuses peers more than 3 s apart (MAX_DHT_TIME_DISCREPANCY_SECONDS)
CLOCK_FAIL_S = 30.0
NETWORK_CHECKS = ("daemon", "addresses", "bootstrap", "reachability", "clock", "lan")

NETWORK_PROBE = r"""
import asyncio, json, sys, time
args = json.loads(sys.argv[1])
out = {"started": False}

async def main():
    from hivemind.dht.node import DHTNode
    from hivemind.p2p import PeerID
    from hivemind.proto import dht_pb2
    from hivemind.utils.multiaddr import Multiaddr
    from hivemind.utils import get_dht_time
    from sapo_core.swarm import reachability
    t = time.perf_counter()
    kwargs = dict(host_maddrs=args["host_maddrs"]) if args["host_maddrs"] else dict(no_listen=True)
    node = await DHTNode.create(startup_timeout=args["timeout"], use_relay=True, **kwargs)
    out.update(started=True, start_s=time.perf_counter() - t)
    try:
        try:
            out["maddrs"] = [str(m) for m in await node.get_visible_maddrs(latest=True)]
        except ValueError:
            out["maddrs"] = []
        await reachability.DialbackService(node.p2p).start()
        peers, answered = [], []
        for maddr in args["initial_peers"]:
            item = {"maddr": maddr, "ok": False}
            peers.append(item)
            try:
                m = Multiaddr(maddr)
                peer = PeerID.from_base58(m["p2p"])
                transport = m.decapsulate(Multiaddr(f"/p2p/{m['p2p']}"))
                await asyncio.wait_for(node.p2p._client.connect(peer, [transport]), args["timeout"])
                t0 = get_dht_time()
                request = dht_pb2.PingRequest(peer=node.protocol.node_info, validate=False)
                response = await asyncio.wait_for(node.protocol.get_stub(peer).rpc_ping(request), args["timeout"])
                t1 = get_dht_time()
                item.update(ok=True, rtt=t1 - t0)
                if response.dht_time:
                    item["offset"] = response.dht_time - (t0 + t1) / 2
                answered.append(peer)
            except Exception as e:
                item["error"] = f"{type(e).__name__}: {e}"[:200]
        out["peers"] = peers
        found = await reachability.check(node.p2p, answered, out["maddrs"], args["timeout"])
        out["reachability"] = {"status": found.status, "address": found.address, "detail": found.detail,
                               "words": found.words()}
    finally:
        await node.shutdown()

def lan():
    if not args["lan"] or args["lan_interfaces"] is None:
        return {"enabled": False}
    from sapo_core.swarm.discovery import DiscoveryError, LanDiscovery
    seen = {}
    d = LanDiscovery(
        args["swarm"], "doctor", [], lambda p, m: seen.__setitem__(p, m), interfaces=args["lan_interfaces"]
    )
    try:
        d.start()
    except DiscoveryError as e:
        return {"enabled": True, "ok": False, "error": str(e)}
    time.sleep(args["lan_seconds"])
    d.close()
    return {"enabled": True, "ok": True, "found": sorted(seen)}

try:
    asyncio.run(asyncio.wait_for(main(), args["timeout"] * (3 + len(args["initial_peers"]))))
except Exception as e:
    out["error"] = f"{type(e).__name__}: {e}"[:300]
out["lan"] = lan()
print(json.dumps(out))
"""


def probe_args(cfg: SwarmConfig, timeout: float = 10.0, lan_seconds: float = 3.0) -> str:
    from sapo_core.swarm.discovery import discovery_interfaces

    return json.dumps(
        {
            "host_maddrs": list(cfg.host_maddrs),
            "initial_peers": list(cfg.initial_peers),
            "timeout": timeout,
            "lan": cfg.lan_discovery,
            "lan_interfaces": discovery_interfaces(cfg),
            "swarm": cfg.swarm_name,
            "lan_seconds": lan_seconds,
        }
    )


def judge_network(payload: dict[str, Any] | None, failure: str | None, cfg: SwarmConfig, check: Any) -> list[Any]:
    """The doctor's network checks from what the probe saw; `check` builds one (doctor.Check).
    One check per entry of NETWORK_CHECKS, each judged by its own function below."""
    p = payload or {}
    if not p.get("started"):
        why = p.get("error") or failure or "no answer"
        return [
            check(
                "daemon",
                "fail",
                f"the p2p daemon (p2pd) did not start: {why}",
                "reinstall hivemind (pip install --force-reinstall hivemind: its wheel carries p2pd); if the "
                "error names an address, fix swarm.host_maddrs (e.g. /ip4/0.0.0.0/tcp/31337)",
            )
        ]
    peers = p.get("peers", [])
    return [
        check("daemon", "ok", f"p2pd started in {float(p.get('start_s', 0)):.1f} s"),
        _addresses(p.get("maddrs", []), check),
        _bootstrap(peers, cfg, check),
        _reachability(p.get("reachability") or {}, check),
        _clock(peers, check),
        _lan(p.get("lan") or {}, cfg, check),
    ]


def _addresses(visible: list[str], check: Any) -> Any:
    maddrs = [m.split("/p2p/")[0] for m in visible]
    if maddrs:
        return check("addresses", "ok", "listening on " + ", ".join(maddrs[:6]))
    return check(
        "addresses",
        "warn",
        "listening on no address: peers cannot dial this node (it joins as a DHT client)",
        'to serve the swarm, listen: swarm.host_maddrs = ["/ip4/0.0.0.0/tcp/31337"]',
    )


def _bootstrap(peers: list[dict[str, Any]], cfg: SwarmConfig, check: Any) -> Any:
    if not cfg.initial_peers:
        return check(
            "bootstrap",
            "warn",
            "no bootstrap peers configured: this node starts its own swarm",
            "to join one: sapo-node run --join <invitation>, or --swarm <name> (resources/swarms.toml)",
        )
    ok = [x for x in peers if x.get("ok")]
    lines = [
        f"{x['maddr'].split('/p2p/')[0]}: "
        + (
            f"answered in {1000 * float(x.get('rtt', 0)):.0f} ms"
            if x.get("ok")
            else f"no answer ({x.get('error', '?')})"
        )
        for x in peers
    ]
    status = "ok" if len(ok) == len(peers) else ("warn" if ok else "fail")
    return check(
        "bootstrap",
        status,
        f"{len(ok)} of {len(peers)} bootstrap peer(s) answered: " + "; ".join(lines),
        ""
        if ok
        else "check the addresses (a peer's Swarm tab or invitation "
        "shows its current one) and that the peer is running; a firewall may block outgoing "
        "connections",
    )


def _reachability(r: dict[str, Any], check: Any) -> Any:
    status = r.get("status", "unknown")
    if status == "reachable":
        return check("reachability", "ok", r.get("words", "reachable"))
    if status == "unreachable":
        return check(
            "reachability",
            "warn",
            f"peers cannot dial this node ({r.get('detail', '')}); it will "
            "join as a DHT client and use relays, which works but serves nobody",
            "to serve the swarm: forward a TCP port on your router to this computer, listen on it "
            '(swarm.host_maddrs = ["/ip4/0.0.0.0/tcp/31337"]) and announce it '
            '(swarm.announce_maddrs = ["/ip4/<public IP>/tcp/31337"])',
        )
    return check(
        "reachability",
        "warn",
        f"unknown: {r.get('detail') or 'no peer answered to dial back'}",
        "it is checked again once the node has joined peers; the app's Swarm tab shows the result",
    )


def _clock(peers: list[dict[str, Any]], check: Any) -> Any:
    offsets = [float(x["offset"]) for x in peers if x.get("ok") and "offset" in x]
    if not offsets:
        return check(
            "clock", "warn", "clock offset unknown: no peer answered", "checked against peers once some answer"
        )
    worst = max(offsets, key=abs)
    status = "ok" if abs(worst) <= CLOCK_WARN_S else ("warn" if abs(worst) <= CLOCK_FAIL_S else "fail")
    return check(
        "clock",
        status,
        f"clock offset against peers: {worst:+.2f} s (largest of {len(offsets)})",
        ""
        if status == "ok"
        else "turn on automatic time (NTP): Linux `timedatectl set-ntp true`, "
        "Windows/macOS date and time settings; DHT windows and record expiry depend on clocks",
    )


def _lan(lan: dict[str, Any], cfg: SwarmConfig, check: Any) -> Any:
    if not lan.get("enabled"):
        return check("lan", "ok", "LAN discovery is off (swarm.lan_discovery = false, or listening on loopback only)")
    if not lan.get("ok"):
        return check(
            "lan",
            "warn",
            f"LAN discovery cannot run: {lan.get('error', '?')}",
            "allow multicast (UDP 5353) on this network or firewall, or turn it off: swarm.lan_discovery = false",
        )
    found = lan.get("found", [])
    return check(
        "lan",
        "ok",
        f"LAN discovery works; {len(found)} node(s) of '{cfg.swarm_name}' on this "
        "network" + (f": {', '.join(f[:16] + '…' for f in found[:4])}" if found else ""),
    )


__all__ = ["NETWORK_PROBE", "NETWORK_CHECKS", "probe_args", "judge_network"]
