"""Sharing that teaches what the node cannot find alone: peers' questions, with their right answers.

With `swarm.take = mixed` the J groups a node takes from peers are not trained as the peers wrote
them. For each peer group that holds a verified right completion (our own re-scoring said so), the
node adopts the question: it samples G completions of its own and scores them, then

- our group has reward spread: it trains as any of our own groups (on-policy; the peer chose a
  question at a level where we can learn, and the peer's completions are not needed);
- our group is all wrong: the peer's right completion joins it as a guide (LUFFY's mixed group,
  arXiv 2504.14945; hints only where the learner fails everything, arXiv 2506.13923): the group now
  has spread, our completions learn from the contrast and the guide's tokens carry the
  policy-shaped objective (trainer.py);
- our group is all right: nothing to learn; the question is left.

The paper's rule (take peer groups with spread, trained as if ours) drops exactly what a newcomer
lacks: a veteran's all-right answers to a question the newcomer gets wrong (docs/experiment.md,
'Sharing that teaches'). Here a peer's text enters training only where we failed, one completion
per group, after verification and the likelihood floor: a lying peer can at most make us sample a
question (its answer is regenerated from the id and re-scored by us), and an injected text still has
to pass the floor.

Pure apart from the sampling function it is given, which the node backs with its sampler.
"""

from __future__ import annotations

import itertools
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

from sapo_core.batch import Mixed
from sapo_core.control import vocabulary as K
from sapo_core.rollouts import Completion, Group, Question, one_per_question

# questions -> (our scored groups, their encoded prompts), one group per question, in order
SampleOwn = Callable[[list[Question]], tuple[list[Group], list[list[int]]]]


def right_completions(group: Group) -> list:
    """The completions of a (verified, re-scored) group that earned full credit."""
    return [c for c in group.completions if c.reward >= 1.0]


@dataclass
class Adopted:
    """What a round takes from peers under swarm.take = mixed."""

    own: list[Group] = field(default_factory=list)  # our groups on peers' questions, with spread
    prompts: list[list[int]] = field(default_factory=list)  # their prompts
    mixed: list[Mixed] = field(default_factory=list)  # our all-wrong groups, each with a peer's guide
    solved: int = 0  # questions our own completions all got right: left

    def figures(self, offered: int) -> dict[str, float]:
        return {
            K.SWARM_ADOPT_OFFERED: float(offered),
            K.SWARM_ADOPT_ON_POLICY: float(len(self.own)),
            K.SWARM_ADOPT_GUIDED: float(len(self.mixed)),
            K.SWARM_ADOPT_SOLVED: float(self.solved),
        }


def adoptable(groups: Sequence[Group], want: int) -> list[Group]:
    """Up to `want` peer groups holding a right completion, one per question, in the order given
    (the gather's own random order): the questions a round adopts."""
    return list(itertools.islice(one_per_question(g for g in groups if right_completions(g)), max(want, 0)))


def adopt(groups: Sequence[Group], want: int, sample_own: SampleOwn) -> Adopted:
    """Adopt up to `want` of the peers' groups' questions (module docstring)."""
    chosen = adoptable(groups, want)
    out = Adopted()
    if not chosen:
        return out
    own_groups, prompts = sample_own([g.question for g in chosen])
    for peer, own, prompt in zip(chosen, own_groups, prompts):
        if own.has_signal():
            out.own.append(own)
            out.prompts.append(prompt)
        elif right_completions(own):
            out.solved += 1
        else:
            guide = right_completions(peer)[0]
            out.mixed.append(Mixed(own, prompt, [guide], (peer.source, peer.round, peer.index)))
    return out


def reference_guided(
    groups: Sequence[Group], prompts: Sequence[list[int]], guide_of: Callable[[Question], Completion | None]
) -> list[Mixed]:
    """train.reference_guide: each of our groups without a right completion, with its question's
    reference answer (`guide_of`, None where that does not earn full credit: the group is left as
    it was) as a guide. The same mixed group as a peer's right answer makes, from a text no peer
    wrote: the upper bound of what guidance from the swarm can bring."""
    out = []
    for g, prompt in zip(groups, prompts):
        if g.completions and not right_completions(g):
            guide = guide_of(g.question)
            if guide is not None and guide.reward >= 1.0:
                out.append(Mixed(g, prompt, [guide]))
    return out


NEED_WINDOW = 16  # a topic's last groups of ours its need is read from
NEED_SPREAD = 0.5  # a question where our own answers already have spread, next to one we fail (1)


class TopicNeeds:
    """How much a peer's verified right answer on a topic (a dataset at one level) would teach
    us, from our own last `window` groups there (swarm.choice = need; selection.NeedChoice):

        need = (all wrong + NEED_SPREAD × with spread) / groups

    A question we fail entirely is where a peer's right answer guides (LUFFY's mixed group: what
    we cannot find alone), one with spread we could have drawn ourselves, one we always get right
    teaches nothing. Topics without groups of ours are left out (the choice gives them its
    `unknown` weight). Fed only with our own scored groups, never with what peers claim; kept in
    memory (a restarted node relearns it in a few rounds)."""

    def __init__(self, window: int = NEED_WINDOW) -> None:
        if window < 1:
            raise ValueError(f"window must be at least 1, not {window}")
        self.window = window
        self._seen: dict[str, deque[float]] = {}

    def observe(self, groups: Iterable[Group]) -> None:
        for g in groups:
            if not g.completions:
                continue
            right = len(right_completions(g))
            worth = 1.0 if right == 0 else (0.0 if right == len(g.completions) else NEED_SPREAD)
            self._seen.setdefault(g.question.id.topic(), deque(maxlen=self.window)).append(worth)

    def need(self) -> dict[str, float]:
        return {topic: sum(seen) / len(seen) for topic, seen in self._seen.items()}


__all__ = [
    "NEED_SPREAD",
    "Adopted",
    "SampleOwn",
    "TopicNeeds",
    "adopt",
    "adoptable",
    "reference_guided",
    "right_completions",
]
