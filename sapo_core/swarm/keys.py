"""The swarm's DHT key space: time windows, per-peer record keys and a sharded index.

There is no central clock (SAPO is asynchronous): DHT time (`hivemind.get_dht_time()`, the
wall clock) is cut into windows of `window_seconds`. In the window it is in, a node writes

- its round's record (≤ 256 KiB) under its *own* key `…/rec/<window>/<peer id>`, one record
  per key, so no key ever collects many large values (one key holding 32 × 150 KB makes every
  get time out: docs/environment.md, 'hivemind: 4 MiB per key');
- a small index entry (~0.9 KB: round, group counts, record size) under
  `…/idx/<window>/<shard>`, where `shard = H(peer id, window) mod shards` spreads writers
  evenly and moves each one to another shard every window.

A reader lists index shards of the current and previous windows (a random few first, more
only while it has found too few peers), picks a bounded number of peers, and fetches their
record keys. It reads at most `records_per_gather` records whatever the swarm's size;
docs/swarm.md has the arithmetic for 10,000 nodes.

Every key carries the protocol version, the swarm name, the window length and the shard
count, so nodes that disagree on any of them never read each other's keys. Pure functions.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass
from typing import Any

# 2: record v2 (finished flags, receipts). Bump when keys or records change meaning: old and new
# nodes then never mix.
PROTOCOL_VERSION = 2


@dataclass(frozen=True)
class KeySpace:
    swarm_name: str
    window_seconds: float
    shards: int

    @property
    def prefix(self) -> str:
        return f"sapo/p{PROTOCOL_VERSION}/{self.swarm_name}/{self.window_seconds:g}s/{self.shards}"

    def window_at(self, dht_time: float) -> int:
        return math.floor(dht_time / self.window_seconds)

    def window_end(self, window: int) -> float:
        return (window + 1) * self.window_seconds

    def record_key(self, window: int, peer_id: str) -> str:
        return f"{self.prefix}/rec/{window}/{peer_id}"

    def index_key(self, window: int, shard: int) -> str:
        return f"{self.prefix}/idx/{window}/{shard}"

    def shard_of(self, peer_id: str, window: int) -> int:
        digest = hashlib.sha256(f"{peer_id}/{window}".encode()).digest()
        return int.from_bytes(digest[:8], "big") % self.shards

    def readable_windows(self, dht_time: float) -> tuple[int, int]:
        """The windows a reader reads at this time: the current one and the one before."""
        w = self.window_at(dht_time)
        return (w, w - 1)

    def expiration(self, dht_time: float) -> float:
        """When a value written now expires: after the next window, the last one that reads it.

        Later writes expire later, so a node's newer record replaces its older one in the same
        window (hivemind keeps the value with the latest expiration).
        """
        return dht_time + 2 * self.window_seconds

    def window_is_current(self, window: int, dht_time: float, slack_windows: int = 1) -> bool:
        """Whether a value claiming `window` may be stored or read now (clock skew: ±slack)."""
        now = self.window_at(dht_time)
        return now - 1 - slack_windows <= window <= now + slack_windows


def values_of(values: Any, with_subkeys: bool = False) -> list:
    """The (payload, expiration) pairs of one key's values as a get returned them (subkey ->
    (payload, expiration)), keeping only well-typed ones: bytes payloads, finite expirations.
    With `with_subkeys`, (subkey, (payload, expiration)) pairs. Never raises."""
    out: list = []
    if not isinstance(values, dict):
        return out
    for sub, item in values.items():
        if not (isinstance(item, tuple) and len(item) == 2):
            continue
        payload, expiration = item
        if (
            not isinstance(payload, (bytes, bytearray))
            or not isinstance(expiration, (int, float))
            or isinstance(expiration, bool)
            or not math.isfinite(expiration)
        ):
            continue
        out.append((sub, (payload, expiration)) if with_subkeys else (payload, expiration))
    return out
