"""Answer extraction and rewards: tables of input -> expected output on real ReasoningGYM entries."""

from __future__ import annotations

import math
import re
from pathlib import Path

import pytest
import reasoning_gym

from sapo_core.rewards import (
    MAX_ANSWER_CHARS,
    REWARDS,
    answer_shape,
    clean_answer,
    explicit_answer,
    extract_answer,
    has_answer_line,
    is_solved,
    score_answer,
)


@pytest.mark.parametrize(
    "text, expected",
    [
        ("Answer: 42", "42"),
        ("answer: 42.", "42"),
        ("Some work first.\nAnswer: 1,234", "1234"),
        ("Answer: -1,000,000", "-1000000"),
        ("Answer: 12,5", "12,5"),  # not a thousands-separated number: left alone
        ("The answer is 7.", "7"),
        ("So the answer is: Tuesday!", "Tuesday"),
        ("**Final Answer:** Monday", "Monday"),
        ("**Answer: 5**", "5"),
        ("Answer: `Tuesday`", "Tuesday"),
        ('Answer: "Yes"', "Yes"),
        ("Answer: \\text{Monday}", "Monday"),
        ("Answer: = 9", "9"),
        ("Answer: 3\nwait, no.\nAnswer: 4", "4"),  # the last marker counts
        ("Answer: 5\nbecause 2 + 3 = 5", "5"),  # the marker's own line, not what follows
        ("Answer:\n0 1\n1  2\n\nThat is the matrix.", "0 1\n1 2"),  # a block below a bare marker
        ("We get \\boxed{3/4}.", "3/4"),
        ("so \\boxed{\\frac{1}{2}} done", "\\frac{1}{2}"),
        ("\\boxed{\\frac{1}{2}} then \\boxed{{7}}", "{7}"),  # the last box, braces balanced
        ("<answer> 12 </answer>", "12"),
        ("<answer>1</answer> ... <ANSWER>2</ANSWER>", "2"),
        ("first line\n\nlast line here  ", "last line here"),  # no marker: the last line
        ("3 + 4 = 7", "7"),  # a worked equation on the last line: its result
        ("1 + 6 = 7.\nSo it is 8", "So it is 8"),  # only the last line counts
        ("x =", "x ="),  # nothing after '=': the whole line
        ("$\\frac{1}{2}$", "\\frac{1}{2}"),
        ("0  0   1\t2", "0 0 1 2"),
        ("Answer:", "Answer:"),  # a marker with nothing after it: the last line
        ("", None),
        ("   \n  ", None),
        ("...", None),
    ],
)
def test_extract_answer(text, expected):
    assert extract_answer(text) == expected


@pytest.mark.parametrize(
    "text, dataset, task, expected",
    [
        ("This simplifies to 1/3.", "fraction_simplification", None, "1/3"),
        ("so $\\frac{1}{3}$ it is", "fraction_simplification", None, "\\frac{1}{3}"),
        ("2/6 = 1/4\nAnswer: 1:4", "fraction_simplification", None, "1:4"),  # an explicit answer wins
        ("1 + 6 equals 7. In arithmetic, that is all.", "basic_arithmetic", None, "7"),
        ("a total of 1,234 apples", "basic_arithmetic", None, "1234"),
        ("2.5 * 2 gives 5.0 exactly", "decimal_arithmetic", None, "5.0"),
        ("3 days on, it is a monday.", "calendar_arithmetic", "weekday_offset", "monday"),
        ("Yes, 2024 is a leap year", "calendar_arithmetic", "is_leap_year", "Yes"),
        ("From Monday there are 14 days", "calendar_arithmetic", "count_days", "14"),
        ("It is 10 in base 2", "base_conversion", None, "It is 10 in base 2"),  # no shape: last line
        ("no number here", "basic_arithmetic", None, "no number here"),  # no match: last line
    ],
)
def test_extract_answer_with_the_answer_shape(text, dataset, task, expected):
    assert extract_answer(text, answer_shape(dataset, {"metadata": {"task": task}})) == expected


@pytest.mark.parametrize(
    "text, expected",
    [
        ("Answer: 5", "5"),
        ("just 5", None),
        ("\\boxed{5}", "5"),
        ("Answer:", None),
    ],
)
def test_explicit_answer_needs_a_marker(text, expected):
    assert explicit_answer(text) == expected


@pytest.mark.parametrize(
    "raw, expected",
    [
        ("  42. ", "42"),
        ("'Monday'", "Monday"),
        ("$3/4$", "3/4"),
        ("1,234.5", "1234.5"),
        ("(P ∧ Q)", "(P ∧ Q)"),
        ("[[0, 1], [1, 2]]", "[[0, 1], [1, 2]]"),
    ],
)
def test_clean_answer(raw, expected):
    assert clean_answer(raw) == expected


def entry(dataset: str, index: int, **config):
    return reasoning_gym.create_dataset(dataset, seed=5, size=10, **config)[index], config


# Real entries (seed 5) and what ReasoningGYM's own scorer gives each answer.
def _score_table():
    cal_count, cal_cfg = entry("calendar_arithmetic", 0)  # count_days, oracle 14
    assert cal_count["metadata"]["task"] == "count_days" and cal_count["answer"] == "14"
    cal_day, _ = entry("calendar_arithmetic", 2)  # a weekday question, oracle Wednesday
    assert cal_day["answer"] == "Wednesday"
    frac, frac_cfg = entry("fraction_simplification", 0, styles=["latex_frac"])
    m = frac["metadata"]
    simple, unsimplified = f"{m['simplified_numerator']}/{m['simplified_denominator']}", f"{m['numerator']}/9999"
    arith, arith_cfg = entry("basic_arithmetic", 1)  # oracle -27
    assert arith["answer"] == "-27"
    dec, dec_cfg = entry("decimal_arithmetic", 2)  # oracle 25.413, tolerance 10^-3
    assert dec["answer"] == "25.413"
    logic, logic_cfg = entry("propositional_logic", 1)  # premises ¬P, Q
    assert logic["metadata"]["premises"] == ["¬P", "Q"]
    bm, bm_cfg = entry("binary_matrix", 0, min_n=2, max_n=2)  # oracle "2 1\n1 0"
    assert bm["answer"] == "2 1\n1 0"
    return [
        ("calendar_arithmetic", cal_cfg, cal_count, "Answer: 14", 1.0),
        ("calendar_arithmetic", cal_cfg, cal_count, "Answer: 13", math.exp(-5 / 14)),  # dense numeric credit
        ("calendar_arithmetic", cal_cfg, cal_count, "fourteen", 0.0),
        ("calendar_arithmetic", cal_cfg, cal_day, "The answer is Wednesday.", 1.0),
        ("calendar_arithmetic", cal_cfg, cal_day, "Answer: Monday", 0.1),  # a weekday, the wrong one
        ("calendar_arithmetic", cal_cfg, cal_day, "Answer: wednesday", 0.05),  # lower case
        ("fraction_simplification", frac_cfg, frac, f"Answer: {simple}", 1.0),
        (
            "fraction_simplification",
            frac_cfg,
            frac,
            f"Answer: $\\frac{{{m['simplified_numerator']}}}{{{m['simplified_denominator']}}}$",
            1.0,
        ),
        ("fraction_simplification", frac_cfg, frac, f"Answer: {unsimplified}", 0.1),  # kept the numerator
        ("fraction_simplification", frac_cfg, frac, "Answer: 1/2", 0.05),
        ("fraction_simplification", frac_cfg, frac, "", 0.01),  # no answer: the scorer's own floor
        ("basic_arithmetic", arith_cfg, arith, "Answer: -27", 1.0),
        ("basic_arithmetic", arith_cfg, arith, "Answer: -27.", 1.0),
        ("basic_arithmetic", arith_cfg, arith, "Answer: x -27", 3 / 5),  # default scorer: oracle inside
        ("basic_arithmetic", arith_cfg, arith, "-3 * 9 = -27", 1.0),
        ("basic_arithmetic", arith_cfg, arith, "Answer: 27", 0.0),
        ("decimal_arithmetic", dec_cfg, dec, "Answer: 25.4131", 1.0),  # within 10^-3
        ("decimal_arithmetic", dec_cfg, dec, "Answer: 25.42", 0.0),
        ("propositional_logic", logic_cfg, logic, "Answer: (Q ∧ ¬P)", 1.0),
        ("propositional_logic", logic_cfg, logic, "Answer: (P ∨ ¬P)", 0.25),  # true but trivial
        ("propositional_logic", logic_cfg, logic, "Answer: P", 0.05),  # parses, does not follow
        ("binary_matrix", bm_cfg, bm, "Answer:\n2 1\n1 0", 1.0),
        ("binary_matrix", bm_cfg, bm, "Answer: [[2, 1], [1, 0]]", 0.1),  # right, as a Python list
        ("binary_matrix", bm_cfg, bm, "Answer: 2 1 1 0", 0.0),
    ]


@pytest.mark.parametrize("case", range(len(_score_table())))
def test_accuracy_reward_matches_reasoning_gym(case):
    dataset, config, e, completion, expected = _score_table()[case]
    got = REWARDS["accuracy"]([e["question"]], [completion], dataset=[dataset], entry=[e], config=[config])
    assert got == [pytest.approx(expected)]


def test_accuracy_reward_is_one_value_per_completion():
    e, cfg = entry("basic_arithmetic", 1)
    got = REWARDS["accuracy"](
        ["q"] * 3, ["Answer: -27", "no", "-27"], dataset=["basic_arithmetic"] * 3, entry=[e] * 3, config=[cfg] * 3
    )
    assert got == [1.0, 0.0, 1.0]


def test_binary_matrix_answers_are_never_evaluated(tmp_path: Path):
    """binary_matrix's scorer eval()s a wrong answer; a peer's completion must not run code."""
    e, cfg = entry("binary_matrix", 0, min_n=2, max_n=2)
    marker = tmp_path / "pwned"
    attack = f"Answer: __import__('pathlib').Path({str(marker)!r}).write_text('x')"
    assert score_answer("binary_matrix", cfg, e, extract_answer(attack)) == 0.0
    assert not marker.exists()


@pytest.mark.parametrize(
    "answer",
    [
        "(" * 5000 + "P" + ")" * 5000,  # deep nesting for a recursive parser
        "P ∧ " * 10_000 + "P",
        "x" * (MAX_ANSWER_CHARS + 1),
    ],
)
def test_hostile_answers_score_zero_without_raising(answer):
    e, cfg = entry("propositional_logic", 1)
    assert score_answer("propositional_logic", cfg, e, answer) == 0.0


@pytest.mark.parametrize(
    "text, expected",
    [
        ("Answer: 5", 1.0),
        ("work\nThe final answer is 5", 1.0),
        ("5", 0.0),
        ("<answer>5</answer>", 0.0),  # we ask for an Answer: line, not tags
        ("Answer:", 0.0),
    ],
)
def test_format_reward(text, expected):
    assert REWARDS["format"](["q"], [text]) == [expected]
    assert has_answer_line(text) is (expected == 1.0)


def test_registry_holds_both_rewards():
    assert {"accuracy", "format"} <= set(REWARDS)


# The regexes extraction used before it was made linear-time (quadratic on runs of blanks
# after "answer" and on long digit runs): on short texts, where backtracking costs nothing,
# the linear scans must agree with them exactly.
_OLD_MARKER = re.compile(r"\banswer\b[ \t]*(?:\*\*|__)?[ \t]*(?:is\b[ \t]*:?|[:：=])[ \t]*(?:\*\*|__)?", re.IGNORECASE)
_OLD_FRACTION = re.compile(r"\\d?frac\s*\{\s*\d+\s*\}\s*\{\s*\d+\s*\}|\d+\s*/\s*\d+")
_OLD_TAG = re.compile(r"<answer>(.*?)</answer>", re.IGNORECASE | re.DOTALL)
_PIECES = [
    "answer",
    "Answer",
    "ANSWER",
    " ",
    "\t",
    "**",
    "__",
    "is",
    "IS",
    "isx",
    ":",
    "：",
    "=",
    "x",
    "\n",
    "1",
    "23",
    "٣",
    "/",
    " / ",
    "\u00a0",
    "\\frac{1}{2}",
    "\\dfrac{3}{ 4 }",
    "<answer>",
    "</answer>",
    "<ANSWER>",
    "a",
]


def test_linear_extraction_agrees_with_the_old_regexes():
    import random

    from sapo_core import rewards

    rng = random.Random(0)
    for _ in range(30000):
        t = "".join(rng.choice(_PIECES) for _ in range(rng.randint(0, 12)))
        old = [m.end() for m in _OLD_MARKER.finditer(t)]
        assert rewards._last_marker_end(t) == (old[-1] if old else None), t
        assert rewards.ANSWER_SHAPES["fraction"].findall(t) == _OLD_FRACTION.findall(t), t
        tags = _OLD_TAG.findall(t)
        assert rewards._last_tag_contents(t) == (tags[-1] if tags else None), t


@pytest.mark.parametrize(
    "attack",
    [
        "Answer" + " " * 20000,
        "1" * 20000,
        "<answer>" * 5000,
        "answer is" + " \t" * 10000,
        "Answer: " + "=" * 30000,
    ],
)
def test_peer_text_built_to_backtrack_still_extracts(attack):
    """The CPU attacks (20,000 spaces after an answer marker, long digit runs; docs/swarm.md,
    'Hostile peers') give the same
    answers as before; tests/test_swarm_attacks.py bounds their time on a real victim."""
    for shape in (None, answer_shape("fraction_simplification"), answer_shape("basic_arithmetic")):
        assert extract_answer(attack + "\nAnswer: 3", shape) == "3"


def test_registry_holds_the_rewards():
    assert {"accuracy", "correct", "format"} <= set(REWARDS)


@pytest.mark.parametrize("case", range(len(_score_table())))
def test_correct_reward_is_one_at_full_marks_else_zero(case):
    """The same table: partial credit (0.1 for a wrong weekday, 0.6 for '-27' inside other
    text, 0.25 for a true but trivial formula) is 0 under correctness."""
    dataset, config, e, completion, expected = _score_table()[case]
    got = REWARDS["correct"]([e["question"]], [completion], dataset=[dataset], entry=[e], config=[config])
    assert got == [1.0 if expected >= 1.0 else 0.0]


@pytest.mark.parametrize("score, solved", [(1.0, True), (0.999, False), (0.5, False), (0.0, False)])
def test_is_solved_only_at_full_marks(score, solved):
    assert is_solved(score) is solved
