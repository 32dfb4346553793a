"""Invitations: one short, copyable link that carries a swarm and the peers to join it through.

    sapo://join/<swarm>?v=1&window=300&shards=16&tasks=basic_arithmetic:1,calendar_arithmetic:1
                       &peer=/ip4/203.0.113.5/tcp/31337/p2p/Qm...&peer=...

It carries the swarm's name and the settings every node of it must share (window, shards, task
mix) and one to eight peers. An invitation is untrusted input (pasted, or opened from a web page
through the registered sapo:// scheme): `parse_invitation` accepts only this exact shape, at
most `MAX_CHARS` characters, every key known and given once (`peer` up to `MAX_PEERS` times),
and every value checked as the swarm list and the config check them; anything else raises
`InvitationError` saying what is wrong. Nothing in it is executed or fetched.

Standard library only (the GUI imports it).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from urllib.parse import parse_qsl, quote, urlsplit

from sapo_core.config import NodeConfig
from sapo_core.swarm.reachability import is_private
from sapo_core.swarm.swarmlist import SwarmEntry, SwarmListError

SCHEME = "sapo"
MAX_CHARS = 2048
MAX_PEERS = 8
VERSION = "1"
KNOWN_KEYS = ("v", "window", "shards", "tasks", "peer")


class InvitationError(ValueError):
    """The text is not a valid invitation; the message says what is wrong."""


@dataclass(frozen=True)
class Invitation:
    swarm: SwarmEntry  # name, window, shards, task mix; bootstrap = the peers
    peers: list[str] = field(default_factory=list)

    @property
    def private_only(self) -> bool:
        """Every peer is on a private network (192.168…, 10…, loopback): only computers on
        that same network can join through it."""
        return bool(self.peers) and all(is_private(p) for p in self.peers)

    def warnings(self) -> list[str]:
        if self.private_only:
            return [
                "every address in this invitation is private (a home or office network, or this computer): "
                "it works only from the same network. From elsewhere, ask for an invitation with a public "
                "address (a node that says 'reachable at' a public one)"
            ]
        return []

    def to_url(self) -> str:
        return make_invitation(self.swarm, self.peers)


def make_invitation(swarm: SwarmEntry, peers: list[str]) -> str:
    """The invitation link for `swarm` through `peers` (raises InvitationError if too long)."""
    parts = [f"v={VERSION}", f"window={swarm.window_seconds:g}", f"shards={swarm.shards}"]
    if swarm.tasks:
        parts.append("tasks=" + ",".join(f"{k}:{v:g}" for k, v in sorted(swarm.tasks.items())))
    parts += [f"peer={quote(p, safe='/:.')}" for p in list(dict.fromkeys(peers))[:MAX_PEERS]]
    url = f"{SCHEME}://join/{swarm.name}?" + "&".join(parts)
    if len(url) > MAX_CHARS:
        raise InvitationError(f"the invitation would be {len(url)} characters (at most {MAX_CHARS}); give fewer peers")
    return url


def invitation_for(cfg: NodeConfig, peers: list[str]) -> str:
    """The invitation to the swarm `cfg` runs in, through `peers` (e.g. this node's join address)."""
    entry = SwarmEntry(
        name=cfg.swarm.swarm_name,
        window_seconds=cfg.swarm.window_seconds,
        shards=cfg.swarm.shards,
        tasks={k: float(v) for k, v in cfg.tasks.weights.items()},
    )
    return make_invitation(entry, [p for p in peers if p])


def parse_invitation(text: str) -> Invitation:
    """The invitation in `text` (surrounding whitespace ignored); InvitationError if it is not one."""
    if not isinstance(text, str):
        raise InvitationError("an invitation is text")
    text = text.strip()
    if len(text) > MAX_CHARS:
        raise InvitationError(f"too long for an invitation ({len(text)} characters; at most {MAX_CHARS})")
    if not text.isascii() or any(c.isspace() or ord(c) < 32 for c in text):
        raise InvitationError("an invitation has no spaces or special characters; copy it again, whole")
    try:
        url = urlsplit(text)
    except ValueError as e:
        raise InvitationError(f"not a link: {e}") from None
    if url.scheme != SCHEME or url.netloc != "join":
        raise InvitationError(
            f"an invitation starts with {SCHEME}://join/ (this starts with "
            f"'{text[:20]}'); a bare address /ip4/... goes in the address field"
        )
    if url.fragment or url.username or url.password or url.port:
        raise InvitationError("an invitation has no '#', '@' or port after sapo://join")
    name = url.path.removeprefix("/")
    if not name or "/" in name:
        raise InvitationError("the swarm's name is missing: sapo://join/<swarm>?peer=...")
    try:
        pairs = parse_qsl(url.query, keep_blank_values=True, strict_parsing=bool(url.query), max_num_fields=32)
    except ValueError as e:
        raise InvitationError(f"the part after '?' is malformed: {e}") from None
    values: dict[str, str] = {}
    peers: list[str] = []
    for key, value in pairs:
        if key not in KNOWN_KEYS:
            raise InvitationError(f"unknown part '{key}' (known: {', '.join(KNOWN_KEYS)}); is it for a newer version?")
        if key == "peer":
            peers.append(value)
        elif key in values:
            raise InvitationError(f"'{key}' is given twice")
        else:
            values[key] = value
    if values.get("v", VERSION) != VERSION:
        raise InvitationError(f"invitation version {values['v']!r}; this SAPO Swarm reads version {VERSION}: update it")
    if not peers:
        raise InvitationError("the invitation names no peer to join through")
    if len(peers) > MAX_PEERS:
        raise InvitationError(f"{len(peers)} peers; an invitation holds at most {MAX_PEERS}")
    try:
        window = float(values.get("window", "300"))
        shards = int(values.get("shards", "16"))
    except ValueError:
        raise InvitationError("window must be a number of seconds and shards a whole number") from None
    tasks: dict[str, float] = {}
    for item in filter(None, values.get("tasks", "").split(",")):
        task, sep, weight = item.partition(":")
        try:
            tasks[task] = float(weight) if sep else 1.0
        except ValueError:
            raise InvitationError(f"task weight '{item}' is not name:number") from None
    try:
        entry = SwarmEntry(name=name, bootstrap=peers, window_seconds=window, shards=shards, tasks=tasks)
    except SwarmListError as e:
        raise InvitationError(f"invitation: {e}") from None
    return Invitation(entry, peers)


def apply_invitation(cfg: NodeConfig, invitation: Invitation) -> NodeConfig:
    """The config a node runs with to join the invited swarm (other settings of `cfg` kept)."""
    from sapo_core.swarm.swarmlist import apply_swarm

    return apply_swarm(cfg.replace(**{"swarm.listed_swarm": ""}), invitation.swarm)


__all__ = [
    "Invitation",
    "InvitationError",
    "make_invitation",
    "invitation_for",
    "parse_invitation",
    "apply_invitation",
    "SCHEME",
    "MAX_CHARS",
    "MAX_PEERS",
]
