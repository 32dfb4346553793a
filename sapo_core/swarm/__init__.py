"""The swarm: share rollouts over a hivemind DHT with no coordinator, signed and never trusted blindly.

- `identity`: the node's persistent RSA key, its peer id and readable name.
- `keys`: DHT time windows, per-peer record keys and the sharded index.
- `records`: the versioned msgpack wire format and its limits; `publish`: `fit_record` and the
  items a round publishes.
- `validation`: the DHT's validator chain (signature, then schema and key binding).
- `verify`: checks on receipt (regenerate, compare, re-score, filter) and peer reputation.
- `selection`: which peers a gather reads and which of their groups it takes (pure);
  `judge`: what a fetched record costs its peer (pure).
- `dht`: the `DHTNode` in its own thread; `joining`: joining with retries; `p2pd`: its options.
- `source`: `RolloutSource` (what the node uses), `NoSwarm`, `open_swarm`; `dhtsource`:
  `DhtRolloutSource`, which runs the steps.

docs/swarm.md explains the design and the arithmetic for 10,000 nodes.
"""

from sapo_core.swarm.source import DhtRolloutSource, NoSwarm, RolloutSource, open_swarm

__all__ = ["DhtRolloutSource", "NoSwarm", "RolloutSource", "open_swarm"]
