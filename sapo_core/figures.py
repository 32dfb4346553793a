"""The round's figures: what it sampled, scored and trained, and how long each phase took.

Keys are namespaced (`reward/mean`, `groups/external`, `time/sample`...) and land in the run
store's row for the round, which the dashboard, `sapo-node stats` and the benchmarks read.
`reward/sum` is per question, as the SAPO paper sums rewards over rounds.
"""

from __future__ import annotations

import contextlib
import time
from collections import defaultdict
from collections.abc import Iterator, Sequence

from sapo_core.rollouts import Group
from sapo_core.roundshape import RoundShape
from sapo_core.sampler import SampledSequence


class PhaseTimer:
    """Wall seconds per phase of a round: `with timer("sample"): ...` (phases may repeat)."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = defaultdict(float)

    @contextlib.contextmanager
    def __call__(self, phase: str) -> Iterator[None]:
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
        "reward/mean": _mean(rewards),
        "reward/sum": float(sum(rewards)) / max(1, shape.group_size),
        "accuracy/mean": _solved(rewards),
        "groups/local": float(len(local)),
        "groups/local_with_signal": float(sum(g.has_signal() for g in local)),
        "groups/external": float(len(external)),
        "groups/external_share": len(external) / max(1, len(local) + len(external)),
        "groups/trained": float(trained_groups),
        "round/local_groups": float(shape.local),
        "round/external_groups": float(shape.external),
        "round/group_size": float(shape.group_size),
    }
    for task, level in levels.items():
        m[f"curriculum/{task}_level"] = float(level)
    for task, xs in per_task.items():
        m[f"reward/{task}"] = _mean(xs)
        m[f"accuracy/{task}"] = _solved(xs)
    if external:
        m["reward/external_mean"] = _mean([x for g in external for x in g.rewards])
    seqs = [s for group in samples for s in group]
    n_tok = sum(len(s.token_ids) for s in seqs)
    m["tokens/sampled"] = float(n_tok)
    m["completions/mean_tokens"] = n_tok / max(1, len(seqs))
    m["completions/finished_frac"] = _mean([1.0 if s.finished else 0.0 for s in seqs])
    sample_s = seconds.get("sample", 0.0)
    m["sampler/tok_per_s"] = n_tok / sample_s if sample_s > 0 else 0.0
    m["sampler/backend_llamacpp"] = 1.0 if sampler_name == "llamacpp" else 0.0
    for phase, secs in seconds.items():
        m[f"time/{phase}"] = secs
    return m


def _mean(xs: Sequence[float]) -> float:
    return float(sum(xs) / len(xs)) if xs else 0.0


def _solved(rewards: Sequence[float]) -> float:
    """The share of completions fully right (reward 1)."""
    return _mean([1.0 if x >= 1.0 else 0.0 for x in rewards])


__all__ = ["PhaseTimer", "round_figures"]
