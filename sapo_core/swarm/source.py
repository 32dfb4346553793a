"""Where a round's external groups come from: the `RolloutSource` protocol the node uses.

- `NoSwarm`: training alone (publishes nothing, gathers nothing).
- `DhtRolloutSource` (dhtsource.py): publishes our groups into the swarm's DHT and gathers
  verified groups from peers.

`open_swarm` gives the node the one its config asks for.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Protocol

from sapo_core.config import SwarmConfig
from sapo_core.hooks import NullHooks, RoundHooks
from sapo_core.rollouts import Group
from sapo_core.swarm.dhtsource import DhtRolloutSource
from sapo_core.swarm.identity import KEY_FILE_NAME, load_or_create_identity
from sapo_core.swarm.keys import KeySpace
from sapo_core.swarm.records import Receipt
from sapo_core.swarm.selection import GroupChoice
from sapo_core.swarm.verify import CompletionCutter, QuestionSource

log = logging.getLogger(__name__)


class RolloutSource(Protocol):
    def publish(self, round: int, groups: Sequence[Group], receipts: Sequence[Receipt] = ()) -> None:
        """Share our scored local groups of this round, and the receipts of the external
        groups we trained on last round ((peer id, peer's round, group index) each)."""

    def gather(self, round: int, want: int, rng: random.Random, need: Mapping[str, float] | None = None) -> list[Group]:
        """Up to `want` peers' groups never returned before: verified, re-scored by us,
        zero-advantage dropped, chosen by the source's `GroupChoice` (uniformly, or by `need`:
        topic -> what our own groups lack there, selection.NeedChoice); `source` is the peer id, `round`/`index`
        name the group; `token_ids` are our tokenizer's ids of exactly the scored text when the
        source has our tokenizer (else None: the node re-tokenises)."""

    def receipts_for_us(self) -> list[tuple[str, int, int]]:
        """Receipts naming this node in the records this round's gather fetched:
        (receipting peer id, our round named, group index), deduplicated, non-ignored peers."""

    def reject(self, peer: str, reason: str, n: int = 1, strike: bool = True) -> None:
        """The node dropped n of this peer's gathered completions for `reason` (e.g.
        `unlikely`): counted against the peer, and a light strike if `strike`."""

    def stats(self) -> dict[str, float]:
        """This round's figures, namespaced `swarm/...`, for the store row."""

    def describe(self, model: str | None = None, held_out: tuple[int, float, int] | None = None) -> None:
        """What this node says about itself in its next index entries, for the swarm's page:
        its model, its latest held-out figure (after round, solve rate, completions)."""

    def close(self) -> None: ...


class NoSwarm:
    """Training alone: nothing goes out, nothing comes in."""

    node_id = "alone"

    def publish(self, round: int, groups: Sequence[Group], receipts: Sequence[Receipt] = ()) -> None:
        return None

    def gather(self, round: int, want: int, rng: random.Random, need: Mapping[str, float] | None = None) -> list[Group]:
        return []

    def receipts_for_us(self) -> list[tuple[str, int, int]]:
        return []

    def reject(self, peer: str, reason: str, n: int = 1, strike: bool = True) -> None:
        return None

    def stats(self) -> dict[str, float]:
        return {}

    def describe(self, model: str | None = None, held_out: tuple[int, float, int] | None = None) -> None:
        return None

    def close(self) -> None:
        return None


def open_swarm(
    cfg: SwarmConfig,
    tasks: QuestionSource,
    identity_dir: Path,
    hooks: RoundHooks | None = None,
    cutter: CompletionCutter | None = None,
    choice: GroupChoice | None = None,
) -> RolloutSource:
    """The node's rollout source: `NoSwarm` if sharing is off, else a started DHT source.

    `choice`: which verified peer groups a gather takes (selection.py; default `UniformChoice`).
    Raises `SwarmError` (readable) if the DHT cannot start; a swarm without reachable peers is
    not an error (the node trains alone and keeps trying to join).
    """
    hooks = hooks or NullHooks()
    if not cfg.enabled:
        return NoSwarm()
    from sapo_core.swarm.dht import SwarmDHT
    from sapo_core.swarm.validation import ReasonCounter

    identity = load_or_create_identity(
        Path(cfg.identity_path) if cfg.identity_path else Path(identity_dir) / KEY_FILE_NAME
    )
    log.info(f"swarm: this node is {identity.name} ({identity.peer_id})")
    keyspace = KeySpace(cfg.swarm_name, cfg.window_seconds, cfg.shards)
    dht = SwarmDHT(cfg, identity, keyspace, ReasonCounter())
    dht.start()
    source = DhtRolloutSource(cfg, tasks, identity, dht, hooks, cutter=cutter, choice=choice)
    if cfg.page_port:
        from sapo_core.swarm.page import start_page

        join = [source.join_address] if source.join_address else []
        try:
            args = (dht, keyspace, tasks, identity, join, cfg.page_host, cfg.page_port)
            page = start_page(*args, data_dir=identity_dir, own=source.own_figures)
            source.page = page
            log.info(f"swarm: the swarm's page, as this node sees it: {source.page.url}")
        except OSError as e:  # the node trains without its page
            log.warning(f"swarm: the swarm's page cannot listen on {cfg.page_host}:{cfg.page_port} ({e})")
    return source
