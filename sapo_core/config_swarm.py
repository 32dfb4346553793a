"""The swarm's settings (`[swarm]` in node.toml): whom to join, how to listen and be reached, the
DHT's key space and timeouts, and what peers' records must pass to be trained on.

A table of its own because it is the largest; `sapo_core.config` nests it in `NodeConfig` and
re-exports `SwarmConfig`. Standard library only.
"""

from __future__ import annotations

from dataclasses import dataclass

from sapo_core.config_schema import check, setting

REACHABILITY_MODES = ("auto", "reachable", "unreachable")


def _name_ok(name: str) -> bool:
    return bool(name) and len(name) <= 64 and all(c.isascii() and (c.isalnum() or c in "._-") for c in name)


@dataclass(frozen=True)
class SwarmConfig:
    enabled: bool = setting("Share rollouts with a swarm (false = train alone).", True)
    swarm_name: str = setting(
        "Name of the swarm (letters, digits, '.', '_', '-'); nodes with other names never mix.", "sapo-public"
    )
    initial_peers: list = setting(
        "Multiaddrs of peers to join, each ending in /p2p/<peer id> (a running node prints its own); "
        "empty hosts a new swarm.",
        [],
    )
    list_urls: list = setting(
        "HTTPS URLs of the project's swarm list, fetched at start and by `sapo-node swarms update`; a list is "
        "used only when signed by a key in resources/swarmlist-keys.txt (swarm/signedlist.py).",
        [],
    )
    listed_swarm: str = setting(
        "Name of a listed swarm (resources/swarms.toml, or swarms.toml in the config directory) whose "
        "bootstrap peers and swarm-wide settings this node takes when it starts; empty: none.",
        "",
    )
    host_maddrs: list = setting(
        "Addresses to listen on; empty listens nowhere (peers cannot dial this node: it joins as a DHT client).",
        ["/ip4/0.0.0.0/tcp/0"],
    )
    announce_maddrs: list = setting("Addresses to tell peers (behind NAT; explicit ports, not 0).", [])
    client_mode: bool = setting("Only ask the DHT, never serve it (for nodes peers cannot reach).", False)
    reachability: str = setting(
        "'auto': after joining, a peer dials this node back; unreachable (behind NAT) it becomes a DHT client "
        "and takes a relay slot. 'reachable': always serve the DHT. 'unreachable': client and relay from the "
        "start.",
        "auto",
    )
    use_relay: bool = setting(
        "libp2p circuit relays: reach peers behind NAT through a relay, offer to relay for others when "
        "reachable, and, behind NAT, reserve a slot at a reachable peer (docs/swarm.md, Joining).",
        True,
    )
    lan_discovery: bool = setting(
        "Find and announce nodes of the same swarm on the local network (mDNS, _sapo-swarm._tcp); false "
        "sends nothing on the network but to the swarm's peers.",
        True,
    )
    lan_interfaces: list = setting(
        "IP addresses of the interfaces LAN discovery uses (empty: those of swarm.host_maddrs; all when "
        "listening on 0.0.0.0 or nowhere; none when listening on loopback only).",
        [],
    )
    window_seconds: float = setting(
        "Length of the DHT time windows records are published into; readers read the current and the "
        "previous one. Swarm-wide: nodes with another value never see each other.",
        300.0,
    )
    shards: int = setting(
        "Index shards per window. Swarm-wide: nodes with another value never see each other. About "
        "swarm size / 20 keeps index reads small (docs/swarm.md).",
        16,
    )
    shards_read: int = setting("Index shards a node reads first per window (more only if it finds too few peers).", 2)
    records_per_gather: int = setting(
        "Peers' records fetched and verified per round: bounds a gather whatever the swarm's size.", 6
    )
    max_record_kib: int = setting("Largest record this node publishes per round, in KiB (hard limit 256).", 256)
    replicas: int = setting("DHT nodes that store each of our values.", 5)
    publish_timeout: float = setting("Seconds a round waits for its publish before going on.", 10.0)
    nat_port_map: bool = setting(
        "Ask the home router to forward this node's port (UPnP / NAT-PMP), so peers can dial it behind "
        "NAT; this sends discovery packets to the local network. Never done when the node listens on "
        "loopback only.",
        True,
    )
    page_port: int = setting(
        "Serve the swarm's page (what this node sees of its swarm: nodes, groups verified and refused, "
        "receipts; read-only HTTP, / and /api/status) on this TCP port; 0: no page. `sapo-node seed` "
        "serves it on 31331.",
        0,
    )
    page_host: str = setting("IP address the swarm's page listens on (127.0.0.1: this computer only).", "127.0.0.1")
    gather_timeout: float = setting("Seconds a round waits for peers' groups before going on with what it has.", 10.0)
    rpc_timeout: float = setting("Seconds before one DHT request counts as lost.", 3.0)
    start_timeout: float = setting("Seconds the p2p daemon may take to start.", 30.0)
    join_timeout: float = setting("Seconds to wait for initial peers to answer at start.", 5.0)
    join_attempts: int = setting(
        "Tries to reach the initial peers at start (the pause doubles between tries) before training "
        "alone; retries go on in the background.",
        3,
    )
    rejoin_min_seconds: float = setting("First pause before retrying initial peers that did not answer.", 2.0)
    rejoin_max_seconds: float = setting("Longest pause between retries (the pause doubles up to this).", 120.0)
    strikes_to_ignore: int = setting("Records holding junk (forged, tampered, malformed) before a peer is ignored.", 3)
    ignore_minutes: float = setting("How long a peer that keeps sending junk is ignored.", 10.0)
    identity_path: str = setting(
        "RSA key file of this node (default: node.key in the data directory's identity folder).", ""
    )
    verify_cpu_seconds: float = setting(
        "CPU seconds verifying one peer's record may take; a record that needs more is junk (a strike).", 1.0
    )
    verify_grace_seconds: float = setting(
        "Seconds verification may run past gather_timeout before the rest of the records are skipped.", 1.0
    )
    likelihood_floor: float = setting(
        "Peers' completions whose mean log-likelihood per token under our policy, over their least likely "
        "likelihood_window tokens, is below this (nats) are dropped as 'unlikely': injected links and "
        "garbage preambles, not text our model would write. Set so >= 95 % of the embedded model's "
        "own completions pass and no injected link does (docs/calibration.md, 'Likelihood floor'); "
        "0 = off.",
        -3.6,
    )
    likelihood_window: int = setting("Tokens over which the likelihood floor averages (see likelihood_floor).", 16)
    likelihood_judge: str = setting(
        "Whose log-likelihood the floor reads: 'policy' (our current policy), 'base' (the base model, the "
        "LoRA adapter off: what the floor was calibrated on, and it does not drift as we train) or 'either' "
        "(kept when either finds the text likely: a peer that trained further, or less, than we did).",
        "policy",
    )
    take: str = setting(
        "How peers' groups teach: 'paper' (groups with reward spread, trained as if ours: SAPO) or 'mixed' "
        "(adopt the questions of peers' groups that hold a verified right answer: sample our own answers; "
        "where ours are all wrong, the peer's right one joins as a guide, LUFFY's mixed group; "
        "sapo_core/adopt.py).",
        "paper",
    )
    choice: str = setting(
        "Which of peers' verified groups a round takes: 'uniform' (J at random: SAPO) or 'need' (drawn in "
        "proportion to what our own recent groups lack on each group's dataset and level: all wrong weighs 1, "
        "with spread 0.5, all right 0; sapo_core/adopt.py, TopicNeeds). With take = mixed, 'need' is the "
        "success-gated sharing that prefers where this node fails.",
        "uniform",
    )
    max_external_tokens: int = setting(
        "Most completion tokens of peers' groups one update trains on, whole groups only (the default is "
        "J x G x max_new_tokens at the defaults; 0 = no limit).",
        4096,
    )

    def __post_init__(self) -> None:
        check(
            _name_ok(self.swarm_name),
            "swarm.swarm_name",
            f"'{self.swarm_name}' must be 1..64 letters, digits, '.', '_' or '-'",
        )
        self._check_addresses()
        check(
            self.reachability in REACHABILITY_MODES,
            "swarm.reachability",
            f"'{self.reachability}' must be one of {', '.join(REACHABILITY_MODES)}",
        )
        check(
            not self.listed_swarm or _name_ok(self.listed_swarm),
            "swarm.listed_swarm",
            f"'{self.listed_swarm}' must be 1..64 letters, digits, '.', '_' or '-'",
        )
        check(self.window_seconds >= 5, "swarm.window_seconds", "must be at least 5")
        check(0 <= self.page_port < 65536, "swarm.page_port", "must be 0 (no page) or 1..65535")
        check(1 <= self.shards <= 4096, "swarm.shards", "must be 1..4096")
        check(1 <= self.shards_read <= self.shards, "swarm.shards_read", "must be 1..swarm.shards")
        check(1 <= self.records_per_gather <= 64, "swarm.records_per_gather", "must be 1..64")
        check(4 <= self.max_record_kib <= 256, "swarm.max_record_kib", "must be 4..256 (256 KiB is the hard limit)")
        check(1 <= self.replicas <= 20, "swarm.replicas", "must be 1..20")
        for key in (
            "publish_timeout",
            "gather_timeout",
            "rpc_timeout",
            "start_timeout",
            "join_timeout",
            "rejoin_min_seconds",
        ):
            check(getattr(self, key) > 0, f"swarm.{key}", "must be positive")
        check(
            self.rejoin_max_seconds >= self.rejoin_min_seconds,
            "swarm.rejoin_max_seconds",
            "must be >= swarm.rejoin_min_seconds",
        )
        check(1 <= self.join_attempts <= 20, "swarm.join_attempts", "must be 1..20")
        check(self.strikes_to_ignore >= 1, "swarm.strikes_to_ignore", "must be at least 1")
        check(self.ignore_minutes >= 0, "swarm.ignore_minutes", "must be >= 0")
        check(0 < self.verify_cpu_seconds <= 60, "swarm.verify_cpu_seconds", "must be in (0, 60]")
        check(0 <= self.verify_grace_seconds <= 60, "swarm.verify_grace_seconds", "must be 0..60")
        check(-50 <= self.likelihood_floor <= 0, "swarm.likelihood_floor", "must be -50..0 (0 = off)")
        check(1 <= self.likelihood_window <= 4096, "swarm.likelihood_window", "must be 1..4096")
        check(
            self.likelihood_judge in ("policy", "base", "either"),
            "swarm.likelihood_judge",
            "must be policy, base or either",
        )
        check(self.take in ("paper", "mixed"), "swarm.take", "must be paper or mixed")
        check(self.choice in ("uniform", "need"), "swarm.choice", "must be uniform or need")
        check(self.max_external_tokens >= 0, "swarm.max_external_tokens", "must be >= 0 (0 = no limit)")

    def _check_addresses(self) -> None:
        """Peers, list URLs, listen and announce addresses, LAN interfaces: each named where it is wrong."""
        for addr in self.initial_peers:
            check(
                isinstance(addr, str) and addr.startswith("/") and "/p2p/" in addr,
                "swarm.initial_peers",
                f"'{addr}' is not a multiaddr ending in /p2p/<peer id>, e.g. /ip4/203.0.113.5/tcp/31337/p2p/QmPeer...",
            )
        for url in self.list_urls:
            check(
                isinstance(url, str) and url.startswith("https://") and len(url) <= 2048,
                "swarm.list_urls",
                f"{url!r} is not an https:// URL (the list is fetched over HTTPS only)",
            )
        for addr in list(self.host_maddrs) + list(self.announce_maddrs):
            check(
                isinstance(addr, str) and addr.startswith("/"),
                "swarm.host_maddrs",
                f"'{addr}' is not a multiaddr such as /ip4/0.0.0.0/tcp/0",
            )
        for addr in self.announce_maddrs:
            check(
                not addr.rstrip("/").endswith(("/tcp/0", "/udp/0")),
                "swarm.announce_maddrs",
                f"'{addr}' needs an explicit port, not 0",
            )
        for ip in self.lan_interfaces:
            check(
                isinstance(ip, str) and 0 < len(ip) <= 64,
                "swarm.lan_interfaces",
                f"'{ip}' is not an IP address such as 192.168.1.20",
            )
