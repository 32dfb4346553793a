"""Questions asked again: a node's recent questions whose last group had reward spread.

`tasks.reask_share` (0 = off, the default) asks that share of a round's own questions again from
a pool of the node's recent questions that taught something: ExGRPO (arXiv 2510.02245) replays
questions of medium difficulty, which a model that solves some of its answers can still learn
from, where a fresh draw at a level already learnt or out of reach is all right or all wrong.
Here only the question is replayed: its completions are sampled anew from the current policy,
so the update stays on-policy.

The rules (tests/test_reask.py holds their table):
- a group of our own, first draw, refill or re-asked, with reward spread puts its question at
  the pool's newest end (moved there if it was in); one without spread takes it out: the model
  now solves it every time, or none;
- the pool keeps the `POOL_SIZE` newest; the oldest leaves first;
- a round asks `int(share * n + 0.5)` of its n questions again, at most as many as the pool
  holds, drawn without replacement from the round's own random numbers; they leave the pool
  until their new group puts them back;
- re-asked groups do not feed the curriculum (they are not a fair draw of their level).
"""

from __future__ import annotations

import random
from collections.abc import Iterable
from typing import Any

from sapo_core.rollouts import QuestionId

POOL_SIZE = 64  # 16 rounds of 4 questions: a pool question is at most a few dozen rounds old


def reask_count(share: float, n: int, pooled: int) -> int:
    """How many of a round's n questions are asked again: share * n rounded half up, within the pool."""
    return min(pooled, int(share * n + 0.5))


class ReaskPool:
    """The node's recent questions with reward spread, oldest first."""

    def __init__(self, size: int = POOL_SIZE) -> None:
        self.size = size
        self._pool: dict[QuestionId, None] = {}  # insertion order: oldest first
        self.asked: set[QuestionId] = set()  # the latest draw's re-asked questions

    def __len__(self) -> int:
        return len(self._pool)

    def ids(self) -> list[QuestionId]:
        return list(self._pool)

    def observe(self, qid: QuestionId, spread: bool) -> None:
        """One group of ours on `qid`: in at the newest end with spread, out without."""
        self._pool.pop(qid, None)
        if spread:
            self._pool[qid] = None
            while len(self._pool) > self.size:
                del self._pool[next(iter(self._pool))]

    def draw(self, rng: random.Random, k: int) -> list[QuestionId]:
        """k pooled questions drawn with `rng` (TaskSet's, keyed by the node's seed and the round:
        the same rng and pool give the same ones), taken out of the pool until their new groups
        say whether they still teach."""
        chosen = rng.sample(list(self._pool), min(k, len(self._pool)))
        for qid in chosen:
            del self._pool[qid]
        self.asked = set(chosen)
        return chosen

    def state_dict(self) -> list[list[Any]]:
        return [[q.dataset, q.config_digest, q.seed, q.index] for q in self._pool]

    def load_state_dict(self, state: Iterable[list[Any]]) -> None:
        self._pool = {QuestionId(str(d), str(c), int(s), int(i)): None for d, c, s, i in state}
        self.asked = set()


__all__ = ["POOL_SIZE", "ReaskPool", "reask_count"]
