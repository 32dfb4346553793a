"""The round's vocabulary: every phase has its words and one band, the keys are the run store's
names as they were, and the figures a round records are all declared."""

from __future__ import annotations

import subprocess
import sys

import pytest

from sapo_core.control import vocabulary as K
from sapo_core.figures import PhaseTimer, round_figures
from sapo_core.rollouts import Completion, Group, Question, QuestionId
from sapo_core.roundshape import RoundShape
from sapo_core.sampler import SampledSequence


def test_the_phases_run_in_the_documented_order_each_with_words():
    assert K.PHASE_NAMES == (
        "sample",
        "score",
        "share",
        "gather",
        "likelihood",
        "prepare",
        "update",
        "sync",
        "eval",
        "save",
    )
    assert set(K.PHASE_WORDS) == set(K.PHASE_NAMES) and all(K.PHASE_WORDS.values())
    assert K.PHASE_UNITS == {"sample": "tokens", "score": "questions", "update": "micro-batches"}


def test_every_timed_phase_but_the_evaluation_is_in_exactly_one_band():
    banded = [p for _, phases in K.PHASE_BANDS for p in phases]
    assert sorted(banded) == sorted(set(K.PHASE_NAMES) - {K.EVAL})
    assert [band for band, _ in K.PHASE_BANDS] == list(K.TIME_BANDS)
    assert K.PHASE_BANDS == (
        ("sampling", ("sample",)),
        ("training", ("update", "sync")),
        ("sharing with peers", ("share", "gather", "likelihood")),
        ("other", ("score", "prepare", "save")),
    )


@pytest.mark.parametrize(
    "key, expected",
    [
        (K.EVAL_SOLVE_RATE, "eval/solve_rate"),
        (K.REWARD_MEAN, "reward/mean"),
        (K.TIME_ROUND, "time/round"),
        (K.CPU_SECONDS, "cpu/seconds"),
        (K.time_of(K.SHARE), "time/share"),
        (K.curriculum_level_of("basic_arithmetic"), "curriculum/basic_arithmetic_level"),
        (K.accuracy_of("basic_arithmetic"), "accuracy/basic_arithmetic"),
        (K.per_dataset(K.EVAL_GAIN, "basic_arithmetic"), "eval/basic_arithmetic/gain"),
        (K.per_dataset(K.EVAL_SOLVE_RATE, "chain_sum", "level_2"), "eval/chain_sum/level_2/solve_rate"),
        (K.swarm_rejected("bad_score"), "swarm/rejected/bad_score"),
        (K.swarm_dht_rejected("malformed"), "swarm/dht_rejected/malformed"),
    ],
)
def test_keys_keep_the_run_stores_names(key, expected):
    """Run stores hold these names: a renamed key would hide every earlier run's history of it."""
    assert key == expected and K.is_known(key)


def test_unknown_keys_are_told_apart():
    assert not K.is_known("time/sharing")  # not a phase
    assert not K.is_known("reward/mean/extra")
    assert not K.is_known("heldout/now")  # a dashboard curve's old id, never a figure
    assert "reward/" not in K.KEYS and "swarm/rejected/" not in K.KEYS  # prefixes are not keys


def test_every_figure_of_a_round_is_declared():
    q = Question(QuestionId("basic_arithmetic", "abc", 1, 0), "1 + 1?", "2")
    local = [Group(q, [Completion("2", reward=1.0), Completion("3", reward=0.0)])]
    external = [Group(q, [Completion("2", reward=1.0), Completion("2", reward=1.0)], source="peer")]
    timer = PhaseTimer()
    for phase in K.PHASE_NAMES:
        with timer(phase):
            pass
    samples = [[SampledSequence([1, 2], [-0.1, -0.2], True), SampledSequence([3], [-0.3], False)]]
    m = round_figures(
        local, external, 1, samples, timer.seconds, RoundShape(1, 1, 2), {"basic_arithmetic": 0}, "llamacpp"
    )
    assert [k for k in m if not K.is_known(k)] == []
    assert m[K.GROUPS_LOCAL] == 1 and m[K.time_of(K.SAMPLE)] >= 0


def test_the_timer_refuses_a_phase_the_vocabulary_does_not_know():
    with pytest.raises(AssertionError, match="not a phase"):
        with PhaseTimer()("sharing"):
            pass


def test_the_vocabulary_imports_only_the_standard_library():
    """The desktop app imports it: it must not pull in the engine (checked in a fresh interpreter)."""
    code = (
        "import sys; import sapo_core.control.vocabulary; "
        "print(sorted(m for m in sys.modules if m.startswith('sapo_core')))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "['sapo_core', 'sapo_core.control', 'sapo_core.control.vocabulary']"
