"""Questions asked again (`tasks.reask_share`, sapo_core/reask.py): the pool's rules as a hand table,
the draw inside `TaskSet.sample_questions`, the curriculum left out, the checkpoint, and peers kept
out of the pool."""

from __future__ import annotations

import json
import random

import pytest

from sapo_core.config import ConfigError, TaskConfig
from sapo_core.reask import ReaskPool, reask_count
from sapo_core.rollouts import Completion, Group, QuestionId
from sapo_core.tasks import TaskSet


def qid(i: int) -> QuestionId:
    return QuestionId("basic_arithmetic", "d", 0, i)


@pytest.mark.parametrize(
    ("share", "n", "pooled", "expected"),
    [
        (0.0, 4, 10, 0),
        (0.5, 4, 10, 2),
        (0.5, 4, 1, 1),  # no more than the pool holds
        (0.25, 4, 10, 1),
        (0.3, 4, 10, 1),  # 1.2 -> 1
        (0.4, 4, 10, 2),  # 1.6 -> 2
        (0.125, 4, 10, 1),  # 0.5 rounds up
        (1.0, 4, 3, 3),
        (0.5, 0, 10, 0),
    ],
)
def test_how_many_are_asked_again(share, n, pooled, expected):
    assert reask_count(share, n, pooled) == expected


def test_the_pool_keeps_the_newest_with_spread_and_drops_the_rest():
    pool = ReaskPool(size=3)
    steps = [  # (question, spread) -> the pool after it, oldest first
        (1, True, [1]),
        (2, True, [1, 2]),
        (3, False, [1, 2]),  # no spread: never in
        (1, True, [2, 1]),  # seen again with spread: to the newest end
        (3, True, [2, 1, 3]),
        (4, True, [1, 3, 4]),  # full: the oldest (2) leaves
        (3, False, [1, 4]),  # no spread any more: out
        (9, False, [1, 4]),
    ]
    for i, spread, after in steps:
        pool.observe(qid(i), spread)
        assert pool.ids() == [qid(j) for j in after], (i, spread)


def test_a_draw_takes_its_questions_out_until_their_groups_put_them_back():
    pool = ReaskPool()
    for i in range(5):
        pool.observe(qid(i), True)
    drawn = pool.draw(random.Random(3), k=2)
    assert len(set(drawn)) == 2 and pool.asked == set(drawn)
    assert len(pool) == 3 and not set(drawn) & set(pool.ids())
    again = ReaskPool()
    for i in range(5):
        again.observe(qid(i), True)
    assert again.draw(random.Random(3), k=2) == drawn  # the same random numbers and pool: the same questions
    pool.observe(drawn[0], True)  # still teaches: back in, at the newest end
    pool.observe(drawn[1], False)  # learnt (or lost): stays out
    assert pool.ids()[-1] == drawn[0] and drawn[1] not in pool.ids()
    assert pool.draw(random.Random(4), k=10) and len(pool) == 0  # never more than it holds


def _group(tasks: TaskSet, question, right: int, wrong: int, source: str = "local") -> Group:
    texts = [f"Answer: {question.answer}"] * right + ["Answer: none"] * wrong
    comps = [Completion(t) for t in texts]
    for c, reward in zip(comps, tasks.score(question, texts)):
        c.reward = float(reward)
    return Group(question=question, completions=comps, source=source)


def test_a_round_asks_its_share_again_after_the_fresh_draw():
    cfg = TaskConfig(weights={"basic_arithmetic": 1.0}, reask_share=0.5)
    tasks, plain = TaskSet(cfg, seed=1), TaskSet(TaskConfig(weights={"basic_arithmetic": 1.0}), seed=1)
    assert [q.id for q in tasks.sample_questions(1, 4)] == [q.id for q in plain.sample_questions(1, 4)]  # pool empty
    first = tasks.sample_questions(1, 4)
    for q, right in zip(first, (4, 0, 8, 2)):  # spread in the first and the last
        tasks.observe(_group(tasks, q, right, 8 - right))
    assert tasks.reask.ids() == [first[0].id, first[3].id]

    second = tasks.sample_questions(2, 4)
    assert [q.id for q in second[:2]] == [q.id for q in plain.sample_questions(2, 4)[:2]]  # the fresh ones
    assert {q.id for q in second[2:]} == {first[0].id, first[3].id}  # then the pool's two
    assert second[2].text == {q.id: q for q in first}[second[2].id].text  # regenerated from its id
    assert tasks.reask_figures([_group(tasks, q, 4, 4) for q in second]) == {
        "groups/reasked": 2.0,
        "groups/reasked_with_signal": 2.0,
    }
    assert tasks.sample_questions(2, 4, part=1) == plain.sample_questions(2, 4, part=1)  # a refill asks none again
    assert plain.reask_figures(second) == {}  # off: no figures


def test_re_asked_groups_do_not_feed_the_curriculum():
    cfg = TaskConfig(weights={"basic_arithmetic": 1.0}, reask_share=1.0, curriculum_window=8)
    tasks = TaskSet(cfg, seed=2)
    q = tasks.sample_questions(1, 1)[0]
    tasks.observe(_group(tasks, q, 4, 4))  # fresh: the curriculum sees it
    seen = json.dumps(tasks.curriculum.state_dict())
    again = tasks.sample_questions(2, 1)
    assert [x.id for x in again] == [q.id]
    assert tasks.observe(_group(tasks, again[0], 8, 0)) is None  # all right, asked again: not counted
    assert json.dumps(tasks.curriculum.state_dict()) == seen
    assert tasks.reask.ids() == []  # and learnt: out of the pool


def test_the_pool_survives_a_checkpoint_and_an_old_one_loads():
    cfg = TaskConfig(weights={"basic_arithmetic": 1.0}, reask_share=0.5)
    tasks = TaskSet(cfg, seed=3)
    for q in tasks.sample_questions(1, 4):
        tasks.observe(_group(tasks, q, 3, 5))
    state = json.loads(json.dumps(tasks.state_dict()))  # as the checkpoint stores it
    resumed = TaskSet(cfg, seed=3)
    resumed.load_state_dict(state)
    assert resumed.reask.ids() == tasks.reask.ids() and len(resumed.reask) == 4
    assert [q.id for q in resumed.sample_questions(2, 4)] == [q.id for q in tasks.sample_questions(2, 4)]
    old = TaskSet(cfg, seed=3)
    old.load_state_dict({"curriculum": state["curriculum"]})  # written before the pool existed
    assert len(old.reask) == 0


def test_a_peers_group_never_enters_the_pool():
    """Hostile peers: a peer's group with spread on any question (even one of ours) is not ours;
    only our own completions say the question still teaches this model."""
    cfg = TaskConfig(weights={"basic_arithmetic": 1.0}, reask_share=1.0)
    tasks = TaskSet(cfg, seed=4)
    q = tasks.sample_questions(1, 1)[0]
    for _ in range(3):
        tasks.observe(_group(tasks, q, 1, 7, source="peer-that-lies"))
    assert len(tasks.reask) == 0
    assert tasks.sample_questions(2, 1)[0].id != q.id


@pytest.mark.parametrize("share", [-0.1, 1.5])
def test_a_share_outside_0_to_1_is_refused(share):
    with pytest.raises(ConfigError, match="tasks.reask_share"):
        TaskConfig(reask_share=share)
