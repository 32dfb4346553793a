"""A swarm node for tests/test_swarm_nat.py, run inside a network namespace: `python -m
tests.nat_node '<json config>' <identity dir>`. It opens the swarm, prints one JSON line about
itself, then obeys one word per stdin line: `publish`, `gather`, `quit` (each answered by a JSON line)."""

from __future__ import annotations

import json
import random
import sys
from pathlib import Path

from sapo_core.config import SwarmConfig, TaskConfig
from sapo_core.swarm.source import open_swarm
from sapo_core.tasks import TaskSet
from tests.helpers import RecordingHooks, honest_groups


def main() -> None:
    cfg = SwarmConfig(**json.loads(sys.argv[1]))
    hooks = RecordingHooks()
    node = open_swarm(cfg, TaskSet(TaskConfig(), seed=0), Path(sys.argv[2]), hooks)

    def say(**kw) -> None:
        print(json.dumps(kw), flush=True)

    say(
        node_id=node.node_id,
        address=node.join_address,
        reachability=node.dht.reachability.status,
        client_mode=node.dht.client_mode,
        peers=node.dht.num_peers(),
        log=hooks.text(),
    )
    for line in sys.stdin:
        word = line.strip()
        if word == "publish":
            node.publish(1, honest_groups(seed=len(node.node_id) + random.randrange(1000), round=1))
            say(done="publish", stats=node.stats())
        elif word == "gather":
            got = node.gather(1, 6, random.Random(0))
            say(done="gather", sources=sorted({g.source for g in got}), stats=node.stats())
        elif word == "quit":
            break
    node.close()
    say(done="quit")


if __name__ == "__main__":
    main()
