"""Rewards: plain functions registered by name, and the lenient answer extraction they share.

A reward function is `reward(prompts, completions, **meta) -> list[float | None]`, one value
per completion (None: this reward does not apply), with per-completion metadata lists in
`meta` (TRL's convention). Two are registered:

- `accuracy`: ReasoningGYM's own `score_answer` on the answer `extract_answer` finds
  (with the question's answer shape, see `answer_shape`). Needs
  `dataset=[name, ...]`, `entry=[rg_entry, ...]` and `config=[rg_config, ...]` (some scorers
  read their tolerance from the dataset config, e.g. decimal_arithmetic).
- `correct`: 1 when `accuracy` is full marks, else 0 -- the reward nodes train on by default
  (issue 11): ReasoningGYM's partial credit (0.05 for any wrong fraction, 0.1 for any wrong
  weekday, 0.5 for "13" when the answer is "3") divided by a flat group's tiny std weighs as
  much as a right answer, so advantages, the zero-advantage filter and
  `groups/local_with_signal` stop meaning what they say. `TaskConfig.partial_credit` brings
  `accuracy` back as the training reward.
- `format`: 1 when the completion states its answer in the asked form (`Answer: ...`),
  else 0. Off by default (TaskConfig.format_reward = 0): the SAPO paper tried a format
  reward and dropped it because the format spread through the swarm at once.

Completions we score may come from peers, so scoring never raises and never hands text to
a scorer that would `eval` it (binary_matrix's does).
"""

from __future__ import annotations

import functools
import json
import re
from typing import Any, Callable, Mapping, Sequence

RewardFn = Callable[..., list]  # (prompts, completions, **meta) -> list[float | None]

REWARDS: dict[str, RewardFn] = {}

# Answers longer than this score 0 without reaching a scorer: no reference answer of our
# levels comes near, and some scorers parse recursively (propositional_logic).
MAX_ANSWER_CHARS = 2048
SOLVED = 1.0  # ReasoningGYM's full marks: the only score that counts as a right answer


def register(name: str) -> Callable[[RewardFn], RewardFn]:
    def wrap(fn: RewardFn) -> RewardFn:
        if name in REWARDS:
            raise ValueError(f"reward {name!r} is registered twice")
        REWARDS[name] = fn
        return fn

    return wrap


# --- answer extraction ------------------------------------------------------------------

_TAG = re.compile(r"<answer>(.*?)</answer>", re.IGNORECASE | re.DOTALL)
_BOXED = re.compile(r"\\boxed\s*\{")
# "Answer: x", "**Final answer:** x", "The answer is x", "answer = x" -- the last one counts.
_MARKER = re.compile(r"\banswer\b[ \t]*(?:\*\*|__)?[ \t]*(?:is\b[ \t]*:?|[:：=])[ \t]*(?:\*\*|__)?", re.IGNORECASE)
_THOUSANDS = re.compile(r"[-+]?\d{1,3}(?:,\d{3})+(?:\.\d+)?")
_WRAPPERS = ("__", '"', "'", "$")
_TEXT_CMD = re.compile(r"^\\(?:text|textbf|mathrm)\{(.*)\}$", re.DOTALL)


def _boxed_contents(text: str) -> str | None:
    """The contents of the last \\boxed{...}, with nested braces balanced."""
    starts = [m.end() for m in _BOXED.finditer(text)]
    if not starts:
        return None
    depth, i = 1, starts[-1]
    while i < len(text):
        if text[i] == "{":
            depth += 1
        elif text[i] == "}":
            depth -= 1
            if depth == 0:
                return text[starts[-1]: i]
        i += 1
    return None  # unclosed


def _after_marker(text: str) -> str | None:
    """Text after the last answer marker: the rest of its line, or when that is empty the
    block of lines below it up to a blank line (a matrix or grid answer)."""
    matches = list(_MARKER.finditer(text))
    if not matches:
        return None
    rest = text[matches[-1].end():]
    first, _, below = rest.partition("\n")
    if first.strip():
        return first
    block: list[str] = []
    for line in below.split("\n"):
        if not line.strip():
            if block:
                break
            continue
        block.append(line)
    return "\n".join(block) if block else None


def _last_line(text: str) -> str | None:
    lines = [ln for ln in text.split("\n") if ln.strip()]
    return lines[-1] if lines else None


def clean_answer(answer: str) -> str:
    """Undo decoration that is never part of an answer: surrounding whitespace, markdown
    emphasis, quotes and $...$, \\text{...}, a leading '=', trailing sentence punctuation,
    thousands separators in a plain number, runs of spaces inside a line."""
    lines = [re.sub(r"[ \t]+", " ", ln.strip()) for ln in answer.strip().split("\n")]
    s = "\n".join(ln for ln in lines if ln)
    changed = True
    while changed and s:
        before = s
        s = s.strip().strip("*`").strip()  # markdown emphasis, also when unbalanced ("5**")
        s = s.rstrip(".!;,。")
        for w in _WRAPPERS:
            if len(s) >= 2 * len(w) and s.startswith(w) and s.endswith(w):
                s = s[len(w): -len(w)]
        if s.startswith("="):
            s = s[1:]
        m = _TEXT_CMD.match(s)
        if m:
            s = m.group(1)
        changed = s != before
    if _THOUSANDS.fullmatch(s):
        s = s.replace(",", "")
    return s


def explicit_answer(text: str) -> str | None:
    """The answer a completion states explicitly: the last <answer> tag, else the last
    \\boxed{}, else what follows the last 'Answer:' / 'answer is'; cleaned. None otherwise."""
    if not isinstance(text, str):
        return None
    tags = _TAG.findall(text)
    for found in (tags[-1] if tags else None, _boxed_contents(text), _after_marker(text)):
        if found is not None and clean_answer(found):
            return clean_answer(found)
    return None


# The shape of a final answer, for completions that give no explicit one: the last match in
# the text is taken. Datasets whose answers have no distinctive shape (grids, a program's
# output, formulas, digits in any base) have none.
_NUMBER = r"[-+]?\d+(?:,\d{3})*(?:\.\d+)?"
_WEEKDAY = r"\b(?:Monday|Tuesday|Wednesday|Thursday|Friday|Saturday|Sunday)\b"
ANSWER_SHAPES: dict[str, re.Pattern[str]] = {
    "number": re.compile(_NUMBER),
    "fraction": re.compile(r"\\d?frac\s*\{\s*\d+\s*\}\s*\{\s*\d+\s*\}|\d+\s*/\s*\d+"),
    "weekday": re.compile(_WEEKDAY, re.IGNORECASE),
    "yes_no": re.compile(r"\b(?:Yes|No)\b", re.IGNORECASE),
}
_CALENDAR_SHAPES = {"is_leap_year": "yes_no", "count_days": "number", "count_business_days": "number",
                    "recurring_event_day": "number"}  # the other calendar tasks ask for a weekday


def answer_shape(dataset: str, entry: Mapping[str, Any] | None = None) -> re.Pattern[str] | None:
    """The shape of a right answer to this question, if it has a distinctive one."""
    if dataset in ("basic_arithmetic", "decimal_arithmetic"):
        return ANSWER_SHAPES["number"]
    if dataset == "fraction_simplification":
        return ANSWER_SHAPES["fraction"]
    if dataset == "calendar_arithmetic":
        task = ((entry or {}).get("metadata") or {}).get("task")
        return ANSWER_SHAPES[_CALENDAR_SHAPES.get(task, "weekday")]
    return None


def extract_answer(text: str, shape: re.Pattern[str] | None = None) -> str | None:
    """The answer a completion gives, leniently: `explicit_answer`; else the last match of
    the answer's `shape` (see `answer_shape`) in the text; else the last non-empty line --
    or, when that line is a worked equation ('3 + 4 = 7'), what follows its last '=';
    cleaned. None when there is nothing.

    The fallbacks are measured, not guessed: asked for 'Answer: ...', SmolLM2-135M mostly
    replies '3 + 4 = 7' or 'This simplifies to 1/3.' (`sapo-bench tasks`)."""
    if not isinstance(text, str) or not text.strip():
        return None
    found = explicit_answer(text)
    if found is not None:
        return found
    if shape is not None:
        matches = shape.findall(text)
        if matches:
            return clean_answer(matches[-1])
    last = _last_line(text) or ""
    if "=" in last:
        tail = clean_answer(last.rsplit("=", 1)[1])
        if tail:
            return tail
    return clean_answer(last) or None


def has_answer_line(text: str) -> bool:
    """True when the completion states an answer after an explicit marker (the asked format)."""
    if not isinstance(text, str):
        return False
    found = _after_marker(text)
    return found is not None and bool(clean_answer(found))


# --- ReasoningGYM scorers ---------------------------------------------------------------


@functools.lru_cache(maxsize=64)
def _scorer(dataset: str, config_json: str) -> Callable[[str | None, dict], float]:
    from sapo_core import paths

    paths.keep_matplotlib_cache_in_ours()
    import reasoning_gym

    config = json.loads(config_json)
    return reasoning_gym.create_dataset(dataset, seed=0, size=1, **config).score_answer


_MATRIX_CHARS = re.compile(r"[\d\s\[\],]*")


def _safe_for_scorer(dataset: str, answer: str) -> bool:
    """binary_matrix's scorer calls eval() on any answer that differs from the reference;
    only hand it text that is at most a literal list of numbers. (Other text could never
    score there anyway: the reference holds only digits and whitespace.)"""
    if dataset == "binary_matrix":
        return _MATRIX_CHARS.fullmatch(answer) is not None
    return True


def score_answer(dataset: str, config: Mapping[str, Any], entry: dict, answer: str | None) -> float:
    """ReasoningGYM's score of one extracted answer (None: no answer found, which the
    scorers handle), made safe for untrusted text: 0 for over-long or unsafe answers and
    for any scorer exception."""
    if answer is not None and (len(answer) > MAX_ANSWER_CHARS or not _safe_for_scorer(dataset, answer)):
        return 0.0
    try:
        fn = _scorer(dataset, json.dumps(dict(config), sort_keys=True))
        value = float(fn(answer, entry))
    except Exception:  # a scorer crash on odd text is a wrong answer, not a broken round
        return 0.0
    return value if 0.0 <= value <= 1.0 else 0.0


@register("accuracy")
def accuracy_reward(
    prompts: Sequence[Any],
    completions: Sequence[str],
    *,
    dataset: Sequence[str],
    entry: Sequence[dict],
    config: Sequence[Mapping[str, Any]],
    **_: Any,
) -> list[float | None]:
    """ReasoningGYM's own score of each completion's extracted answer (0..1)."""
    return [
        score_answer(ds, cfg, e, extract_answer(c, answer_shape(ds, e)))
        for c, ds, e, cfg in zip(completions, dataset, entry, config, strict=True)
    ]


def is_solved(score: float) -> bool:
    """A completion counts as solved (right) only at ReasoningGYM's full marks."""
    return score >= SOLVED


@register("correct")
def correct_reward(
    prompts: Sequence[Any],
    completions: Sequence[str],
    *,
    dataset: Sequence[str],
    entry: Sequence[dict],
    config: Sequence[Mapping[str, Any]],
    **_: Any,
) -> list[float | None]:
    """1 for a completion whose extracted answer scores full marks, else 0 (no partial credit)."""
    scores = accuracy_reward(prompts, completions, dataset=dataset, entry=entry, config=config)
    return [1.0 if s is not None and is_solved(s) else 0.0 for s in scores]


@register("format")
def format_reward(prompts: Sequence[Any], completions: Sequence[str], **_: Any) -> list[float | None]:
    """1 for a completion that ends its work with an explicit 'Answer: ...', else 0."""
    return [1.0 if has_answer_line(c) else 0.0 for c in completions]


__all__ = ["REWARDS", "RewardFn", "register", "extract_answer", "explicit_answer", "answer_shape", "clean_answer", "has_answer_line",
           "score_answer", "accuracy_reward", "correct_reward", "format_reward", "is_solved", "MAX_ANSWER_CHARS",
           "SOLVED"]
