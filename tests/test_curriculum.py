"""Curriculum transitions and the JSON round trip of its state (pure logic, no model)."""

from __future__ import annotations

import json

import pytest

from sapo_core.curriculum import Curriculum

LEVELS = {"a": ("easy", "medium", "hard"), "b": ("easy", "medium", "hard")}


def make(**kw) -> Curriculum:
    kw.setdefault("window", 4)
    kw.setdefault("raise_at", 0.5)
    kw.setdefault("lower_at", 0.25)
    floor = kw.pop("floor", {})
    return Curriculum(LEVELS, floor, **kw)


def test_starts_at_floor():
    c = make(floor={"b": "medium"})
    assert (c.level_name("a"), c.level_name("b")) == ("easy", "medium")
    assert c.accuracy("a") is None


def test_raises_only_on_a_full_window_at_threshold():
    c = make()
    assert c.observe("a", 0, [True, True, True]) is None  # 3 of 4: window not full
    change = c.observe("a", 0, [False])  # 3/4 = 0.75 >= 0.5
    assert change is not None and change.raised
    assert (change.old_level, change.new_level, change.accuracy) == ("easy", "medium", 0.75)
    assert str(change) == "a easy -> medium (solved 0.75 of the recent completions)"  # the node's log line
    assert c.level_name("a") == "medium" and c.level_name("b") == "easy"
    assert c.accuracy("a") is None  # the window restarts at the new level


def test_exact_threshold_raises_and_just_below_does_not():
    c = make(window=4, raise_at=0.5)
    assert c.observe("a", 0, [True, True, False, False]) is not None
    c = make(window=4, raise_at=0.75)
    assert c.observe("a", 0, [True, True, False, False]) is None
    assert c.level_name("a") == "easy"


def test_rolling_window_keeps_only_the_last_results():
    c = make(window=4, raise_at=0.75, lower_at=0.0)
    c.observe("a", 0, [False, False, False, False])  # 0/4: at the floor, nothing to lower
    assert c.level_name("a") == "easy" and c.accuracy("a") == 0.0
    c.observe("a", 0, [True, True])  # window: F F T T
    assert c.accuracy("a") == 0.5
    assert c.observe("a", 0, [True]).new_level == "medium"  # window: F T T T


def test_falls_back_on_collapse_but_never_below_floor():
    c = make(floor={"a": "medium"})
    assert c.observe("a", 1, [True] * 4).new_level == "hard"
    change = c.observe("a", 2, [False] * 4)  # 0 <= lower_at
    assert change is not None and not change.raised and change.new_level == "medium"
    assert str(change) == "a hard -> medium (only solved 0.00 of the recent completions)"
    assert c.observe("a", 1, [False] * 4) is None  # medium is the floor
    assert c.level_name("a") == "medium"


def test_top_level_stays():
    c = make(floor={"a": "hard"})
    assert c.observe("a", 2, [True] * 8) is None
    assert c.level_name("a") == "hard"


def test_results_of_another_level_are_ignored():
    c = make()
    assert c.observe("a", 1, [True] * 4) is None
    assert c.accuracy("a") is None and c.level_name("a") == "easy"


def test_disabled_tracks_accuracy_but_never_moves():
    c = make(enabled=False)
    assert c.observe("a", 0, [True] * 4) is None
    assert c.level_name("a") == "easy" and c.accuracy("a") == 1.0


def test_unknown_dataset_and_bad_settings_are_rejected():
    with pytest.raises(KeyError):
        make().observe("zzz", 0, [True])
    with pytest.raises(ValueError, match="lower_at"):
        make(raise_at=0.2, lower_at=0.3)
    with pytest.raises(ValueError, match="window"):
        make(window=0)
    with pytest.raises(ValueError, match="no level"):
        make(floor={"a": "extreme"})


def test_state_round_trips_through_json_and_continues_identically():
    c = make()
    c.observe("a", 0, [True] * 4)  # a -> medium
    c.observe("a", 1, [True, False])
    c.observe("b", 0, [False, True, False])
    state = json.loads(json.dumps(c.state_dict()))
    d = make()
    d.load_state_dict(state)
    assert d.state_dict() == c.state_dict()
    feed = [("a", 1, [True, True]), ("b", 0, [True]), ("a", 2, [False] * 4)]
    assert [c.observe(*f) for f in feed] == [d.observe(*f) for f in feed]
    assert c.state_dict() == d.state_dict()


def test_loaded_level_below_a_raised_floor_is_lifted():
    c = make()
    c.observe("a", 0, [True, False])
    d = make(floor={"a": "medium"})
    d.load_state_dict(c.state_dict())
    assert d.level_name("a") == "medium" and d.accuracy("a") is None


@pytest.mark.parametrize(
    "state, match",
    [
        ({"version": 99, "levels": {}, "results": {}}, "version"),
        ({"version": 1, "levels": {"a": "extreme"}, "results": {}}, "no level"),
        ({"version": 1, "levels": {"a": "easy"}, "results": {"a": 3}}, "not a list"),
        ({"version": 1, "levels": [], "results": {}}, "table"),
    ],
)
def test_bad_states_are_rejected(state, match):
    with pytest.raises(ValueError, match=match):
        make().load_state_dict(state)


# --- the band rule: levels drawn in proportion to their groups' spread -------------------------


def band(**kw) -> Curriculum:
    kw.setdefault("window", 16)  # completions per level; groups: 16 // 4 = 4
    kw.setdefault("raise_at", 0.5)
    kw.setdefault("lower_at", 0.02)
    floor = kw.pop("floor", {})
    return Curriculum(LEVELS, floor, rule="band", **kw)


def feed(c: Curriculum, dataset: str, level: int, groups: list[tuple[int, int]]) -> list:
    """Groups of (solved, of how many) completions; returns the changes."""
    return [c.observe(dataset, level, [True] * k + [False] * (n - k)) for k, n in groups]


@pytest.mark.parametrize(
    "easy, medium, weights",
    [
        # (solved, of) per group at easy and at medium -> level: weight
        ([], [], {0: 0.5}),  # nothing seen: the floor alone, unknown (0.5)
        ([(1, 4)] * 3, [], {0: 0.5}),  # 3 groups: still unknown
        ([(1, 4)] * 4, [], {0: 1.0}),  # 4 of 4 with spread, accuracy 0.25 < 0.5: medium stays locked
        ([(0, 4)] * 4, [], {0: 0.05}),  # no spread: probed only
        ([(2, 4), (2, 4), (4, 4), (4, 4)], [], {0: 0.5, 1: 0.5}),  # 12/16 = 0.75 unlocks medium (unknown)
        ([(2, 4), (2, 4), (4, 4), (4, 4)], [(0, 4)] * 4, {0: 0.5, 1: 0.05}),  # medium without spread
        ([(4, 4)] * 4, [(1, 4), (0, 4), (0, 4), (0, 4)], {0: 0.05, 1: 0.25}),  # easy mastered, medium 1 of 4
        ([(4, 4)] * 4, [(2, 4)] * 4, {0: 0.05, 1: 1.0, 2: 0.5}),  # medium at 0.5 unlocks hard
    ],
)
def test_band_weights_by_hand(easy, medium, weights):
    c = band()
    feed(c, "a", 0, easy)
    feed(c, "a", 1, medium)
    assert c.band_weights("a") == pytest.approx(weights)
    assert c.level("a") == max(weights)


def test_band_windows_roll_and_unlocking_follows_fresh_evidence():
    c = band()
    feed(c, "a", 0, [(4, 4)] * 4)  # 16/16: medium unlocked
    assert c.level_name("a") == "medium"
    changes = feed(c, "a", 0, [(0, 4)] * 3)  # the window rolls to 4/16 < 0.5: locked again
    assert c.band_weights("a") == {0: pytest.approx(0.05)}  # 4 groups without spread
    change = next(x for x in changes if x is not None)
    assert (change.old_level, change.new_level, change.raised) == ("medium", "easy", False)
    assert change.accuracy == pytest.approx(4 / 16)  # easy's window when it stopped unlocking


def test_band_draws_follow_the_weights_and_step_draws_nothing():
    import random

    c = band()
    feed(c, "a", 0, [(4, 4)] * 4)
    feed(c, "a", 1, [(2, 4)] * 4)
    rng = random.Random(0)
    draws = [c.choose_level("a", rng) for _ in range(6000)]
    total = 0.05 + 1.0 + 0.5
    for level, weight in {0: 0.05, 1: 1.0, 2: 0.5}.items():
        assert draws.count(level) / len(draws) == pytest.approx(weight / total, abs=0.02)
    step, rng = make(), random.Random(0)
    before = rng.getstate()
    assert step.choose_level("a", rng) == 0 and rng.getstate() == before


def test_band_respects_the_floor_and_the_top():
    c = band(floor={"a": "medium"})
    assert c.band_weights("a") == {1: 0.5}
    feed(c, "a", 1, [(4, 4)] * 4)
    feed(c, "a", 2, [(4, 4)] * 4)
    assert c.band_weights("a") == pytest.approx({1: 0.05, 2: 0.05})  # hard is the top: nothing above


def test_band_state_round_trips_and_a_step_state_loads():
    c = band()
    feed(c, "a", 0, [(2, 4), (3, 4), (4, 4), (4, 4)])
    feed(c, "a", 1, [(1, 4)])
    state = json.loads(json.dumps(c.state_dict()))
    assert state["version"] == 2
    d = band()
    d.load_state_dict(state)
    assert d.state_dict() == c.state_dict() and d.band_weights("a") == c.band_weights("a")
    old = make()
    old.observe("a", 0, [True] * 3)
    e = band()
    e.load_state_dict(old.state_dict())  # a run started under the step rule goes on under band
    assert e.band_weights("a") == {0: 0.5}
