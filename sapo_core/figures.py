"""The round's figures: what it sampled, scored and trained, and how long each phase took.

Keys are namespaced (`reward/mean`, `groups/external`, `time/sample`...), declared with the
round's phases in sapo_core/control/vocabulary.py, and land in the run store's row for the
round, which the dashboard, `sapo-node stats` and the benchmarks read. `reward/sum` is per
question, as the SAPO paper sums rewards over rounds.
"""

from __future__ import annotations

import contextlib
import time
from collections import defaultdict
from collections.abc import Iterator, Sequence

from sapo_core.control import vocabulary as K
from sapo_core.rollouts import Group
from sapo_core.roundshape import RoundShape
from sapo_core.sampler import SampledSequence


class PhaseTimer:
    """Wall seconds per phase of a round: `with timer(SAMPLE): ...` (phases may repeat; each one of
    vocabulary.PHASE_NAMES, so its time lands in a band of the dashboard's plot)."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = defaultdict(float)

    @contextlib.contextmanager
    def __call__(self, phase: str) -> Iterator[None]:
        assert phase in K.PHASE_NAMES, f"{phase!r} is not a phase of vocabulary.PHASES"
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[phase] += time.perf_counter() - t0


def round_figures(
    local: Sequence[Group],
    external: Sequence[Group],
    trained_groups: int,
    samples: Sequence[Sequence[SampledSequence]],
    seconds: dict[str, float],
    shape: RoundShape,
    levels: dict[str, int],
    sampler_name: str,
) -> dict[str, float]:
    """`levels`: each dataset's curriculum level; `seconds`: the phases' times so far."""
    per_task: dict[str, list[float]] = defaultdict(list)
    for g in local:
        per_task[g.question.id.dataset].extend(g.rewards)
    rewards = [x for g in local for x in g.rewards]
    m: dict[str, float] = {
        K.REWARD_MEAN: _mean(rewards),
        K.REWARD_SUM: float(sum(rewards)) / max(1, shape.group_size),
        K.ACCURACY_MEAN: _solved(rewards),
        K.GROUPS_LOCAL: float(len(local)),
        K.GROUPS_LOCAL_WITH_SIGNAL: float(sum(g.has_signal() for g in local)),
        K.GROUPS_EXTERNAL: float(len(external)),
        K.GROUPS_EXTERNAL_SHARE: len(external) / max(1, len(local) + len(external)),
        K.GROUPS_TRAINED: float(trained_groups),
        K.ROUND_LOCAL_GROUPS: float(shape.local),
        K.ROUND_EXTERNAL_GROUPS: float(shape.external),
        K.ROUND_GROUP_SIZE: float(shape.group_size),
    }
    for task, level in levels.items():
        m[K.curriculum_level_of(task)] = float(level)
    for task, xs in per_task.items():
        m[K.reward_of(task)] = _mean(xs)
        m[K.accuracy_of(task)] = _solved(xs)
    if external:
        m[K.REWARD_EXTERNAL_MEAN] = _mean([x for g in external for x in g.rewards])
    seqs = [s for group in samples for s in group]
    n_tok = sum(len(s.token_ids) for s in seqs)
    m[K.TOKENS_SAMPLED] = float(n_tok)
    m[K.COMPLETIONS_MEAN_TOKENS] = n_tok / max(1, len(seqs))
    m[K.COMPLETIONS_FINISHED_FRAC] = _mean([1.0 if s.finished else 0.0 for s in seqs])
    sample_s = seconds.get(K.SAMPLE, 0.0)
    m[K.SAMPLER_TOK_PER_S] = n_tok / sample_s if sample_s > 0 else 0.0
    m[K.SAMPLER_BACKEND_LLAMACPP] = 1.0 if sampler_name == "llamacpp" else 0.0
    for phase, secs in seconds.items():
        m[K.time_of(phase)] = secs
    return m


def _mean(xs: Sequence[float]) -> float:
    return float(sum(xs) / len(xs)) if xs else 0.0


def _solved(rewards: Sequence[float]) -> float:
    """The share of completions fully right (reward 1)."""
    return _mean([1.0 if x >= 1.0 else 0.0 for x in rewards])


__all__ = ["PhaseTimer", "round_figures"]
