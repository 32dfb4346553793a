"""swarm.take = mixed (sapo_core/adopt.py): which peers' questions a round adopts and what trains,
by hand, and what a lying peer can and cannot do with it."""

from __future__ import annotations

import pytest

from sapo_core.adopt import TopicNeeds, adopt, adoptable, reference_guided
from sapo_core.rollouts import Completion, Group, Question, QuestionId


def q(index: int) -> Question:
    return Question(QuestionId("basic_arithmetic", "d", 5, index), f"Calculate {index} + 1.", str(index + 1))


def peer_group(index: int, rewards: list[float], source: str = "peer-a", round: int = 3) -> Group:
    """A peer's group as the verifier leaves it: rewards are our own re-scoring."""
    comps = [Completion(f"Answer: {index + 1 if r >= 1 else 0} ({k})", reward=r) for k, r in enumerate(rewards)]
    return Group(q(index), comps, source=source, round=round, index=index)


class OwnAnswers:
    """Our sampler, scripted: question index -> our rewards; records what it was asked."""

    def __init__(self, rewards: dict[int, list[float]]) -> None:
        self.rewards = rewards
        self.asked: list[int] = []

    def __call__(self, questions):
        self.asked += [x.id.index for x in questions]
        groups = [
            Group(
                x, [Completion(f"mine {k}", token_ids=[1, k], reward=r) for k, r in enumerate(self.rewards[x.id.index])]
            )
            for x in questions
        ]
        return groups, [[7, x.id.index] for x in questions]


def test_adoptable_takes_groups_with_a_right_answer_one_per_question_in_order():
    groups = [
        peer_group(1, [0.0, 0.0]),  # nothing right (after our re-scoring): nothing to adopt
        peer_group(2, [1.0, 1.0]),  # all right: flat, yet the answer is what a newcomer lacks
        peer_group(2, [1.0, 0.0], source="peer-b"),  # the same question again: taken once
        peer_group(3, [0.0, 1.0]),
        peer_group(4, [1.0, 0.0]),
    ]
    assert [g.question.id.index for g in adoptable(groups, 2)] == [2, 3]
    assert [g.source for g in adoptable(groups, 9)] == ["peer-a", "peer-a", "peer-a"]
    assert adoptable(groups, 0) == []  # none asked, none taken


def test_what_trains_follows_our_own_answers_by_hand():
    """Ours with spread: trained as ours. Ours all wrong: the peer's first right completion joins as
    the guide, with a receipt naming the peer's group. Ours all right: left."""
    groups = [peer_group(2, [0.0, 1.0, 1.0]), peer_group(3, [1.0, 1.0]), peer_group(4, [1.0, 0.0])]
    own = OwnAnswers({2: [1.0, 0.0, 0.0, 0.0], 3: [0.0, 0.0, 0.0, 0.0], 4: [1.0, 1.0, 1.0, 1.0]})
    out = adopt(groups, 3, own)
    assert own.asked == [2, 3, 4]  # one batched sampling call, the adopted questions in order
    assert [g.question.id.index for g in out.own] == [2] and out.prompts == [[7, 2]]
    (m,) = out.mixed
    assert m.own.question.id.index == 3 and m.prompt == [7, 3]
    assert [c.text for c in m.guides] == [groups[1].completions[0].text] and m.receipt == ("peer-a", 3, 3)
    assert out.solved == 1
    assert out.figures(5) == {
        "swarm/adopt_offered": 5.0,
        "swarm/adopt_on_policy": 1.0,
        "swarm/adopt_guided": 1.0,
        "swarm/adopt_solved": 1.0,
    }


def test_a_lying_peer_can_at_most_waste_a_slot():
    """A peer claiming right answers that our re-scoring refused costs nothing (not adopted, our
    sampler is not even asked); one whose question we already solve costs one sampled group and
    trains nothing; a peer never puts more than one completion of its own into a group of ours."""
    liar = [peer_group(1, [0.0, 0.0, 0.0])]  # rewards are ours: its "right" answers were wrong
    own = OwnAnswers({})
    assert adopt(liar, 4, own).own == [] and own.asked == []
    easy = adopt([peer_group(2, [1.0, 1.0])], 4, OwnAnswers({2: [1.0, 1.0, 1.0]}))
    assert (easy.own, easy.mixed, easy.solved) == ([], [], 1)
    flood = adopt([peer_group(3, [1.0] * 8)], 4, OwnAnswers({3: [0.0] * 4}))
    assert len(flood.mixed) == 1 and len(flood.mixed[0].guides) == 1


def ours(dataset: str, digest: str, rewards: list[float], index: int = 0) -> Group:
    question = Question(QuestionId(dataset, digest, 5, index), "?", "1")
    return Group(question, [Completion(str(k), reward=r) for k, r in enumerate(rewards)])


def test_topic_needs_by_hand():
    """need = (all wrong + 0.5 x with spread) / groups, over a topic's last `window` groups of ours."""
    needs = TopicNeeds(window=4)
    assert needs.need() == {}  # nothing seen: every topic unknown (the choice's own weight)
    needs.observe(
        [
            ours("fractions", "L1", [0.0, 0.0]),  # all wrong: 1
            ours("fractions", "L1", [1.0, 0.0]),  # spread: 0.5
            ours("fractions", "L1", [1.0, 1.0]),  # all right: 0
            ours("fractions", "L1", [0.5, 0.5]),  # partial credit only: nothing right, 1
            ours("calendar", "L0", [1.0, 1.0, 1.0]),  # all right: 0
            Group(Question(QuestionId("calendar", "L9", 5, 0), "?", "1"), []),  # no completions: not counted
        ]
    )
    assert needs.need() == {"fractions/L1": (1 + 0.5 + 0 + 1) / 4, "calendar/L0": 0.0}
    needs.observe([ours("fractions", "L1", [0.0, 1.0, 1.0])])  # the oldest (1) leaves the window
    assert needs.need()["fractions/L1"] == (0.5 + 0 + 1 + 0.5) / 4
    with pytest.raises(ValueError, match="window"):
        TopicNeeds(window=0)


def test_reference_guides_join_only_our_groups_without_a_right_answer_by_hand():
    """train.reference_guide: a group of ours with no completion at full credit takes its question's
    reference answer as guide; one with a right answer (spread or all right), an empty one, and one
    whose reference does not earn full credit (or is missing) stay as they were."""
    rewards = {1: [0.0, 0.0], 2: [1.0, 0.0], 3: [1.0, 1.0], 4: [0.5, 0.0], 5: [], 6: [0.0, 0.0], 7: [0.0]}
    groups = [Group(q(i), [Completion(f"mine {k}", reward=r) for k, r in enumerate(rs)]) for i, rs in rewards.items()]
    prompts = [[7, i] for i in rewards]
    guides = {1: 1.0, 2: 1.0, 3: 1.0, 4: 1.0, 5: 1.0, 6: 0.5}  # 7: no reference at all

    def guide_of(question):
        reward = guides.get(question.id.index)
        return None if reward is None else Completion(f"Answer: {question.answer}", reward=reward)

    out = reference_guided(groups, prompts, guide_of)
    assert [m.own.question.id.index for m in out] == [1, 4]  # 4: partial credit is not a right answer
    assert [m.prompt for m in out] == [[7, 1], [7, 4]]
    assert [[g.text for g in m.guides] for m in out] == [["Answer: 2"], ["Answer: 5"]]
    assert all(m.receipt is None for m in out)  # no peer to name
