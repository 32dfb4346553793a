"""The likelihood filter on peers' completions, with hand-made log-probs (swarm/likelihood.py).

The scoring function stands in for the node's trainer forward: it returns the log-probs each
completion's text says it has, so every expected figure below is computed by hand."""

from __future__ import annotations

from sapo_core.rollouts import Completion, Group, Question, QuestionId
from sapo_core.swarm.likelihood import filter_unlikely

Q = Question(QuestionId("basic_arithmetic", "d", 0, 0), "Calculate 2 + 2.", "4")


def group(peer: str, *texts_rewards: tuple[str, float]) -> Group:
    return Group(Q, [Completion(t, reward=r) for t, r in texts_rewards], source=peer, round=3, index=1)


def by_text(pairs):
    """'lp:-0.5,-3' -> [-0.5, -3.0]; anything else -> no tokens."""
    out = []
    for _, c in pairs:
        body = c.text.split("lp:", 1)[1] if "lp:" in c.text else ""
        out.append([float(x) for x in body.split(",")] if body else [])
    return out


def test_a_floor_of_zero_turns_the_filter_off_without_scoring():
    g = group("p", ("lp:-9", 1.0), ("lp:-9", 0.0))

    def never(pairs):
        raise AssertionError("scored although the filter is off")

    v = filter_unlikely([g], never, floor=0.0, window=4)
    assert v.kept == [g] and v.unlikely == 0 and v.peers == {}


def test_unlikely_completions_go_and_a_peer_is_struck_only_when_most_of_its_were():
    a = group("peerA", ("lp:-0.5,-0.5", 1.0), ("lp:-6,-6", 0.0), ("lp:-1", 0.0))  # one of three unlikely
    b = group("peerB", ("lp:-7", 1.0), ("lp:-8", 0.0), ("lp:-0.1", 0.0))  # two of three
    v = filter_unlikely([a, b], by_text, floor=-4.0, window=2)
    assert v.unlikely == 3 and v.groups_dropped == 1  # b keeps one completion: it cannot train
    assert [len(g.completions) for g in v.kept] == [2] and v.kept[0].source == "peerA"
    assert (v.kept[0].round, v.kept[0].index) == (3, 1)  # still names the peer's group for receipts
    assert v.peers == {"peerA": (1, False), "peerB": (2, True)}


def test_the_worst_window_decides_and_a_completion_without_tokens_is_kept():
    # the mean of all four, -2.25, is over the floor; the window holding the injection, -4, is not
    injected = ("lp:-0.5,-0.5,-4,-4", 1.0)
    v = filter_unlikely([group("p", injected, ("lp:", 1.0), ("lp:-1,-1", 0.0))], by_text, floor=-3.0, window=2)
    assert v.unlikely == 1 and v.groups_dropped == 0
    assert [c.text for c in v.kept[0].completions] == ["lp:", "lp:-1,-1"]


def test_a_group_left_without_reward_spread_goes_whole():
    v = filter_unlikely([group("p", ("lp:-9", 1.0), ("lp:-1", 0.0), ("lp:-1", 0.0))], by_text, floor=-3.0, window=2)
    assert v.kept == [] and v.groups_dropped == 1 and v.peers == {"p": (1, False)}


def test_with_two_judges_a_completion_stays_when_either_finds_it_likely():
    """swarm.likelihood_judge = either: our policy and the base model judge each completion; one
    stays when its better score is at or above the floor. Poison unlikely to both still goes."""

    def sharpened(pairs):  # a trained policy: other policies' honest text looks less likely to it
        return [[x - 2.0 for x in lps] for lps in by_text(pairs)]

    honest = ("lp:-1,-2", 1.0)  # base: worst window -1.5; the trained policy: -3.5
    mine = ("lp:-0.5,-0.5", 0.0)
    poison = ("lp:-5,-5", 1.0)  # -5 and -7: under the floor for both
    g = group("p", honest, mine, poison)
    alone = filter_unlikely([g], sharpened, floor=-3.0, window=2)
    assert alone.unlikely == 2  # the trained policy alone drops the honest text with the poison
    both = filter_unlikely([g], [sharpened, by_text], floor=-3.0, window=2)
    assert both.unlikely == 1 and [c.text for c in both.kept[0].completions] == ["lp:-1,-2", "lp:-0.5,-0.5"]


def test_keeps_decides_what_is_left_of_a_group():
    """Under swarm.take = mixed a group stays while it holds a right completion, spread or not."""
    all_right = group("p", ("lp:-1", 1.0), ("lp:-9", 1.0), ("lp:-1", 1.0))
    v = filter_unlikely(
        [all_right], by_text, floor=-3.0, window=2, keeps=lambda g: any(c.reward >= 1 for c in g.completions)
    )
    assert len(v.kept) == 1 and len(v.kept[0].completions) == 2 and v.groups_dropped == 0
    default = filter_unlikely([all_right], by_text, floor=-3.0, window=2)
    assert default.kept == [] and default.groups_dropped == 1


def test_a_second_judge_scores_only_what_the_first_found_unlikely():
    """Either judge: the base model's forward pass runs on the completions our policy scored under
    the floor, and not at all when it scored none there; the verdict is the one both would give."""
    asked: list[list[str]] = []

    def base(pairs):  # finds every text 2 nats a token likelier than our policy does
        asked.append([c.text for _, c in pairs])
        return [[x + 2.0 for x in lps] for lps in by_text(pairs)]

    honest = ("lp:-4,-3", 1.0)  # ours: worst window -3.5, under -3.0; base -1.5
    mine = ("lp:-0.5,-0.5", 0.0)  # -0.5: likely to ours, never sent to base
    poison = ("lp:-6,-6", 1.0)  # -6 and -4: unlikely to both
    empty = ("lp:", 0.0)  # no tokens: no score, kept, never sent to base
    v = filter_unlikely([group("p", honest, mine, poison, empty)], [by_text, base], floor=-3.0, window=2)
    assert asked == [["lp:-4,-3", "lp:-6,-6"]]
    assert v.unlikely == 1 and [c.text for c in v.kept[0].completions] == ["lp:-4,-3", "lp:-0.5,-0.5", "lp:"]
    asked.clear()
    likely = filter_unlikely([group("p", mine, ("lp:-1", 1.0))], [by_text, base], floor=-3.0, window=2)
    assert asked == [] and likely.unlikely == 0 and len(likely.kept) == 1
