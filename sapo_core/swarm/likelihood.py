"""Peers' completions that our own policy finds implausible are not trained on.

Verification (verify.py) proves that a peer's completion reaches the right answer; it cannot see
what else the text carries. A right answer behind an injected link or a garbage preamble scores
1 and would be imitated. So, after gathering and before advantages, every peer completion is
scored by our current policy (or the base model, or both: `swarm.likelihood_judge`):
`likelihood_score` (verify.py) is its lowest mean log-likelihood per token over any `window`
consecutive tokens, and a completion under `floor` (`swarm.likelihood_floor`) is dropped as
`unlikely`. The floor was calibrated on the base model; a policy that trains grows sharper and finds
other policies' honest text less likely (docs/calibration.md, 'Likelihood floor'), which is what the
base judge, fixed, does not do. A group left with fewer than two
completions, or without reward spread, cannot train and goes whole. A peer most of whose
completions were unlikely collects a light strike (a few honest completions fall under the
floor too); docs/swarm.md has the attack and the floor's calibration.

Pure apart from the scoring function it is given, which the node backs with its trainer's
forward pass (no gradient).
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from sapo_core.rollouts import Completion, Group
from sapo_core.swarm.verify import likelihood_score

# (group, completion) pairs -> each completion's per-token log-probs under our policy, in order
ScoreCompletions = Callable[[Sequence[tuple[Group, Completion]]], Sequence[Sequence[float]]]


@dataclass
class LikelihoodVerdict:
    kept: list[Group]  # the groups that may still train, unlikely completions removed
    unlikely: int = 0  # completions dropped
    groups_dropped: int = 0  # groups that could no longer train
    # peer -> (completions of theirs dropped, whether that is a strike: most of theirs were unlikely)
    peers: dict[str, tuple[int, bool]] = field(default_factory=dict)


def filter_unlikely(
    groups: Sequence[Group],
    score: ScoreCompletions | Sequence[ScoreCompletions],
    floor: float,
    window: int,
    keeps: Callable[[Group], bool] | None = None,
) -> LikelihoodVerdict:
    """`groups` less the completions whose likelihood score is under `floor` (a floor of 0 or more
    turns the filter off; a completion without tokens has no score and is kept). Several judges:
    a completion stays when any of them scores it at or above the floor, so each judge after the
    first scores only what the ones before it found unlikely (a forward pass saved on the rest).
    `keeps(group)`: whether what is left of a group may still train (default: two or more
    completions with reward spread)."""
    if not groups or floor >= 0:
        return LikelihoodVerdict(list(groups))
    judges = [score] if callable(score) else list(score)
    keeps = keeps or (lambda g: len(g.completions) >= 2 and g.has_signal())
    pairs = [(g, c) for g in groups for c in g.completions]
    scores = iter(_judged(pairs, judges, floor, window))
    verdict = LikelihoodVerdict([])
    per_peer: dict[str, list[int]] = defaultdict(lambda: [0, 0])  # peer -> [unlikely, completions]
    for g in groups:
        likely = [c for c in g.completions if not next(scores) < floor]  # NaN (no tokens): kept
        dropped = len(g.completions) - len(likely)
        per_peer[g.source][0] += dropped
        per_peer[g.source][1] += len(g.completions)
        verdict.unlikely += dropped
        if dropped:
            g = Group(g.question, likely, source=g.source, round=g.round, index=g.index)
        if keeps(g):
            verdict.kept.append(g)
        else:
            verdict.groups_dropped += 1
    verdict.peers = {peer: (bad, 2 * bad > total) for peer, (bad, total) in per_peer.items() if bad}
    return verdict


def _judged(pairs: list, judges: Sequence[ScoreCompletions], floor: float, window: int) -> list[float]:
    """Each pair's best score over `judges`, asking a judge only about the pairs every judge before
    it scored under `floor` (NaN, no tokens, is under nothing: no judge has a score for it)."""
    scores = [likelihood_score(lps, window) for lps in judges[0](pairs)]
    for judge in judges[1:]:
        doubtful = [i for i, s in enumerate(scores) if s < floor]
        if not doubtful:
            break
        again = judge([pairs[i] for i in doubtful])
        for i, lps in zip(doubtful, again):
            scores[i] = best_score([scores[i], likelihood_score(lps, window)])
    return scores


def best_score(scores: Sequence[float]) -> float:
    """The most favourable of several judges' scores; NaN (no tokens) when any judge has none."""
    if any(math.isnan(s) for s in scores):
        return math.nan
    return max(scores)


__all__ = ["best_score", "filter_unlikely", "LikelihoodVerdict", "ScoreCompletions"]
