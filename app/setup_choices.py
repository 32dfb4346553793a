"""The setup's answers and what they make of the node's config: pure functions, no Qt.

`SetupChoices` holds what the three pages of the setup (app/wizard.py) ask; `apply_choices`
turns them into the NodeConfig the node runs with, `choices_from_config` back again for a
repeated setup; `default_swarm_choice` picks the swarm step's first choice and says why (never a
silent swarm of one); `address_problem` and `address_warning` check an invitation or address.
Tested without a display.
"""

from __future__ import annotations

from dataclasses import dataclass

from sapo_core.config import NodeConfig, RoundConfig
from sapo_core.swarm.invitations import InvitationError, apply_invitation, parse_invitation
from sapo_core.swarm.reachability import is_private
from sapo_core.swarm.swarmlist import SwarmEntry, apply_swarm

JOIN, LISTED, HOST, ALONE = "join", "listed", "host", "alone"  # JOIN: by invitation (or a bare address)
SHARED_WORDS = (
    "In a swarm this computer shares, with every peer: the questions it drew, the answers its model "
    "wrote and their scores, its peer id, and its IP address (peers and relays see it, as in any "
    "peer-to-peer app). Nothing else: no files, no names, no other data."
)


def _signed(x: float) -> str:
    """x to two places with its sign; one that rounds to zero is 0.00, not -0.00 or +0.00."""
    return f"{x:+.2f}" if round(x, 2) else "0.00"


@dataclass(frozen=True)
class Measured:
    """A lab comparison the setup quotes: `arm` − `baseline` in the share of held-out questions
    solved after `rounds` rounds, over `seeds` seeds (95 % interval lo..hi), and in that gain per
    hour of the node's rounds (`hourly`: mean, lo, hi; what a volunteer's computer-hour bought),
    recomputed from the committed CSVs `docs/results/<files>` by tests/test_app_words.py."""

    files: str
    baseline: str
    arm: str
    rounds: int
    seeds: int
    mean: float
    lo: float
    hi: float
    hourly: tuple[float, float, float]

    DECIDES = 6  # seeds a lead needs before the setup calls it a gain (issue 36's bar)

    def words(self) -> str:
        if self.lo <= 0:
            verdict = "no gain shown"
        else:
            verdict = "a gain" if self.seeds >= self.DECIDES else "a lead; too few seeds to decide"
        return (
            f"{_signed(self.mean)} after {self.rounds} rounds ({self.seeds} seeds, 95 % interval "
            f"{_signed(self.lo)}..{_signed(self.hi)}: {verdict}); {self.hourly_words()}"
        )

    def hourly_words(self) -> str:
        """The gain per hour of the computer's rounds against alone: less only where the whole
        interval is below zero, more only where it is above zero over DECIDES seeds."""
        m, lo, hi = self.hourly
        if hi < 0:
            verdict = "less than alone"
        elif lo > 0 and self.seeds >= self.DECIDES:
            verdict = "more than alone"
        else:
            verdict = "no difference shown"
        return f"per computing hour {_signed(m)} ({_signed(lo)}..{_signed(hi)}: {verdict})"


SYMMETRIC = Measured(
    "sharing-8n-2026-11-2?-seed*.csv", "2/0", "1/1", 100, 5, 0.007, -0.037, 0.050, (-0.330, -0.643, -0.017)
)
NEWCOMER = Measured("newcomer-50r-*.csv", "alone", "mixed", 50, 6, 0.015, -0.011, 0.040, (-0.219, -0.443, 0.006))
MIXED4 = Measured(
    "arms-ij4-2026-11-28-seed*.csv", "4/0", "2/2-mixed", 25, 8, 0.029, 0.007, 0.051, (-0.129, -0.934, 0.677)
)
WORKED4 = Measured(
    "arms-ij4-worked-2026-12-05-seed*.csv", "4/0w", "2/2w", 25, 6, 0.030, 0.018, 0.043, (0.414, 0.142, 0.6849)
)
WORKED4_100 = Measured(
    "arms-ij4-worked-100r-2026-12-06-seed*.csv",
    "4/0w",
    "2/2w",
    100,
    3,
    0.031,
    0.0173,
    0.0448,
    (0.0453, -0.0765, 0.1671),
)
WORKED8_25 = Measured(
    "arms-8n-ij4-worked-2026-12-0?-seed*.csv",
    "4/0w",
    "2/2w",
    25,
    6,
    0.0424,
    0.0190,
    0.0657,
    (0.1238, -0.1117, 0.3594),
)
WORKED8 = Measured(
    "sharing-8n-worked-2026-12-05-seed*.csv", "2/0", "1/1", 100, 6, 0.0112, -0.0068, 0.0292, (-0.372, -0.648, -0.0953)
)
# What the swarm page quotes, in its order: each line's words and the figure beside them
# (tests/test_app_words.py recomputes every one of these from its CSVs).
SHARING_LINES: tuple[tuple[str, Measured], ...] = (
    ("8 new computers sharing as the paper does, with the earlier prompt", SYMMETRIC),
    ("8 new computers doing so with today's prompt", WORKED8),
    ("4 new computers doing so with today's prompt", WORKED4),
    ("the same 4 computers, on for 100 rounds", WORKED4_100),
    ("8 new computers as those 4 (2 own and 2 peers' groups a round)", WORKED8_25),
    (
        "a newcomer among trained computers that adopts their questions and right answers "
        "(swarm.take = mixed, not the default)",
        NEWCOMER,
    ),
    ("4 new computers doing so", MIXED4),
)
SHARING_MEASURED = (
    "<b>What sharing gave, measured</b> (held-out questions solved against training alone, in this "
    "project's lab):" + "".join(f"<br>• {words}: {m.words()}" for words, m in SHARING_LINES)
)


@dataclass(frozen=True)
class SetupChoices:
    model: str = "auto"
    swarm: str = HOST  # join, listed, host, alone
    address: str = ""  # the invitation (sapo://join/...) or the multiaddr to join through
    listed: str = ""  # the listed swarm's name, for LISTED
    lan_discovery: bool = True
    throttle: float = 0.5
    threads: int = 0
    pause_on_battery: bool = True
    only_when_idle: bool = False


def address_problem(text: str) -> str:
    """'' if `text` is an invitation or a multiaddr a node can join through, else what is wrong with it."""
    text = text.strip()
    if not text:
        return "Paste the invitation (sapo://join/…) or the invite address another volunteer's Swarm tab shows."
    if text.startswith("sapo:"):
        try:
            parse_invitation(text)
        except InvitationError as e:
            return f"This invitation cannot be used: {e}."
        return ""
    if not text.startswith("/") or "/p2p/" not in text:
        return (
            "An invitation starts with sapo://join/; an invite address looks like "
            "/ip4/203.0.113.5/tcp/31337/p2p/Qm… (it ends in /p2p/ and a peer id)."
        )
    return ""


def address_warning(text: str) -> str:
    """A warning for a usable invitation or address that only works on its own network, else ''."""
    text = text.strip()
    if address_problem(text):
        return ""
    if text.startswith("sapo:"):
        return " ".join(parse_invitation(text).warnings())
    if is_private(text):
        return (
            "This address is private (a home or office network): it works only from the same network. From "
            "elsewhere, ask for an invitation with a public address."
        )
    return ""


def default_swarm_choice(
    cfg: NodeConfig | None, swarms: list[SwarmEntry], invitation: str = ""
) -> tuple[str, str, str]:
    """(choice, listed swarm name, why) the swarm step starts with; never a silent swarm of one."""
    if invitation:
        return JOIN, "", "You opened an invitation: it is filled in below."
    if cfg is not None:
        c = choices_from_config(cfg)
        return c.swarm, c.listed, "Your current setting."
    with_peers = [e for e in swarms if e.bootstrap]
    if with_peers:
        return (
            LISTED,
            with_peers[0].name,
            f"The listed swarm '{with_peers[0].name}' has bootstrap peers to join through.",
        )
    return (
        HOST,
        "",
        (
            "No listed swarm has bootstrap peers (this project has no public servers), so this computer "
            "starts a swarm on this network: computers here running SAPO Swarm join it by themselves, and "
            "others anywhere with the invitation the Swarm tab shows. Until someone joins, it trains "
            "alone, and the Swarm tab says so."
        ),
    )


def apply_choices(base: NodeConfig, c: SetupChoices, swarms: list[SwarmEntry] | None = None) -> NodeConfig:
    """The config the node runs with after the setup (other settings of `base` are kept)."""
    external = base.round.external_groups or RoundConfig().external_groups
    changes = {
        "model.name": c.model,
        "control.throttle": c.throttle,
        "sampler.threads": c.threads,
        "control.pause_on_battery": c.pause_on_battery,
        "control.only_when_idle": c.only_when_idle,
    }
    if c.swarm == ALONE:
        changes.update({"swarm.enabled": False, "round.external_groups": 0})
        return base.replace(**changes)
    changes.update(
        {
            "swarm.enabled": True,
            "round.external_groups": external,
            "swarm.lan_discovery": c.lan_discovery,
            "swarm.listed_swarm": "",
        }
    )
    cfg = base.replace(**changes)
    if c.swarm == LISTED:
        entry = next((e for e in swarms or [] if e.name == c.listed), None)
        if entry is None:
            raise ValueError(f"no listed swarm is called '{c.listed}'")
        return apply_swarm(cfg, entry)
    if c.swarm == JOIN and c.address.strip().startswith("sapo:"):
        return apply_invitation(cfg, parse_invitation(c.address))
    peers = [c.address.strip()] if c.swarm == JOIN else []
    return cfg.replace(**{"swarm.initial_peers": peers})


def choices_from_config(cfg: NodeConfig) -> SetupChoices:
    """Start a repeated setup from what the node runs with now."""
    if not cfg.swarm.enabled or cfg.round.external_groups == 0:
        swarm = ALONE
    elif cfg.swarm.listed_swarm:
        swarm = LISTED
    else:
        swarm = JOIN if cfg.swarm.initial_peers else HOST
    return SetupChoices(
        model=cfg.model.name,
        swarm=swarm,
        address=(cfg.swarm.initial_peers or [""])[0],
        listed=cfg.swarm.listed_swarm,
        lan_discovery=cfg.swarm.lan_discovery,
        throttle=cfg.control.throttle,
        threads=cfg.sampler.threads,
        pause_on_battery=cfg.control.pause_on_battery,
        only_when_idle=cfg.control.only_when_idle,
    )


__all__ = [
    "SetupChoices",
    "apply_choices",
    "choices_from_config",
    "address_problem",
    "address_warning",
    "default_swarm_choice",
    "SHARED_WORDS",
    "SHARING_MEASURED",
    "SHARING_LINES",
    "Measured",
    "JOIN",
    "LISTED",
    "HOST",
    "ALONE",
]
