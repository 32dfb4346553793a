"""Rewards: plain functions registered by name, and the lenient answer extraction they share.

A reward function is `reward(prompts, completions, **meta) -> list[float | None]`, one value
per completion (None: this reward does not apply), with per-completion metadata lists in
`meta` (TRL's convention). Two are registered:

- `accuracy`: ReasoningGYM's own `score_answer` on the answer `extract_answer` finds
  (with the question's answer shape, see `answer_shape`). Needs
  `dataset=[name, ...]`, `entry=[rg_entry, ...]` and `config=[rg_config, ...]` (some scorers
  read their tolerance from the dataset config, e.g. decimal_arithmetic).
- `correct`: 1 when `accuracy` is full marks, else 0 -- the reward nodes train on by default
  (docs/environment.md, 'ReasoningGYM'): ReasoningGYM's partial credit (0.05 for any wrong
  fraction, 0.1 for any wrong weekday, 0.5 for "13" when the answer is "3") divided by a flat
  group's tiny std weighs as much as a right answer, so advantages, the zero-advantage filter and
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
from collections.abc import Callable, Mapping, Sequence
from typing import Any

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
#
# Completions come from peers, so every function here runs in time linear in the text (issue
# 10: the regexes this replaces were quadratic on a run of spaces after "answer" and on a long
# run of digits): regexes only for fixed literals and single-pass scans, the rest by hand.

_ANSWER_WORD = re.compile(r"\banswer\b", re.IGNORECASE)
_IS_WORD = re.compile(r"is\b", re.IGNORECASE)
_TAG_OPEN = re.compile(r"<answer>", re.IGNORECASE)
_TAG_CLOSE = re.compile(r"</answer>", re.IGNORECASE)
_BOXED = re.compile(r"\\boxed\s*\{")
_THOUSANDS = re.compile(r"[-+]?\d{1,3}(?:,\d{3})+(?:\.\d+)?")
_WRAPPERS = ("__", '"', "'", "$")
_TEXT_CMD = re.compile(r"^\\(?:text|textbf|mathrm)\{(.*)\}$", re.DOTALL)
_BLANKS = " \t"


def _skip(text: str, i: int, chars: str = _BLANKS) -> int:
    while i < len(text) and text[i] in chars:
        i += 1
    return i


def _skip_emphasis(text: str, i: int) -> int:
    return i + 2 if text.startswith(("**", "__"), i) else i


def _marker_end(text: str, i: int) -> int | None:
    """Where an answer marker that starts with the word 'answer' ending at `i` ends, or None.

    The grammar (what the old regex said): answer [ \t]* (**|__)? [ \t]* (is\b [ \t]* :? | [:：=])
    [ \t]* (**|__)?. Scanned greedily once: each optional part can only be taken one way."""
    i = _skip(text, _skip_emphasis(text, _skip(text, i)))
    if i < len(text) and text[i] in ":：=":
        i += 1
    else:
        m = _IS_WORD.match(text, i)
        if m is None:
            return None
        i = _skip(text, m.end())
        if i < len(text) and text[i] == ":":
            i += 1
    return _skip_emphasis(text, _skip(text, i))


def _last_marker_end(text: str) -> int | None:
    """End of the last 'Answer:' / 'answer is' / 'answer =' marker (the last one counts)."""
    ends = [m.end() for m in _ANSWER_WORD.finditer(text)]
    for start in reversed(ends):  # each check scans only up to the next non-blank: O(n) in all
        end = _marker_end(text, start)
        if end is not None:
            return end
    return None


def _last_tag_contents(text: str) -> str | None:
    """Contents of the last complete <answer>...</answer> (matched left to right, as findall
    would: an opening tag takes the first closing tag after it)."""
    opens = [m for m in _TAG_OPEN.finditer(text)]
    closes = [m for m in _TAG_CLOSE.finditer(text)]
    found, c = None, 0
    pos = 0
    for o in opens:
        if o.start() < pos:
            continue
        while c < len(closes) and closes[c].start() < o.end():
            c += 1
        if c == len(closes):
            break
        found, pos = text[o.end() : closes[c].start()], closes[c].end()
        c += 1
    return found


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
                return text[starts[-1] : i]
        i += 1
    return None  # unclosed


def _after_marker(text: str) -> str | None:
    """Text after the last answer marker: the rest of its line, or when that is empty the
    block of lines below it up to a blank line (a matrix or grid answer)."""
    end = _last_marker_end(text)
    if end is None:
        return None
    rest = text[end:]
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


# Longer than this after collapsing blanks, an answer is returned uncleaned: it scores 0 anyway
# (MAX_ANSWER_CHARS), and the cleaning loop costs a copy per decoration it removes.
_CLEAN_LIMIT = 2 * MAX_ANSWER_CHARS


def clean_answer(answer: str) -> str:
    """Undo decoration that is never part of an answer: surrounding whitespace, markdown
    emphasis, quotes and $...$, \\text{...}, a leading '=', trailing sentence punctuation,
    thousands separators in a plain number, runs of spaces inside a line."""
    lines = [re.sub(r"[ \t]+", " ", ln.strip()) for ln in answer.strip().split("\n")]
    s = "\n".join(ln for ln in lines if ln)
    if len(s) > _CLEAN_LIMIT:  # each pass below copies the text: bounded, as no scorer reads it anyway
        return s
    changed = True
    while changed and s:
        before = s
        s = s.strip().strip("*`").strip()  # markdown emphasis, also when unbalanced ("5**")
        s = s.rstrip(".!;,。")
        for w in _WRAPPERS:
            if len(s) >= 2 * len(w) and s.startswith(w) and s.endswith(w):
                s = s[len(w) : -len(w)]
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
    for found in (_last_tag_contents(text), _boxed_contents(text), _after_marker(text)):
        if found is not None and clean_answer(found):
            return clean_answer(found)
    return None


# The shape of a final answer, for completions that give no explicit one: the last match in
# the text is taken. Datasets whose answers have no distinctive shape (grids, a program's
# output, formulas, digits in any base) have none.
_NUMBER = r"[-+]?\d+(?:,\d{3})*(?:\.\d+)?"
_WEEKDAY = r"\b(?:Monday|Tuesday|Wednesday|Thursday|Friday|Saturday|Sunday)\b"
_FRAC = re.compile(r"\\d?frac\s*\{\s*\d+\s*\}\s*\{\s*\d+\s*\}")  # linear: it starts at a backslash


class FractionShape:
    """`\\d?frac{a}{b}` or `a / b`, with `findall` as a compiled regex of the two would give,
    in linear time: the regex `\\d+\\s*/\\s*\\d+` retries from every digit of a long run of
    digits that is not followed by a fraction bar (quadratic). The two alternatives can never
    overlap (a frac holds no '/' between its digits; `a / b` holds no backslash)."""

    pattern = "\\d?frac{a}{b} | a/b"

    def findall(self, text: str) -> list[str]:
        found = [(m.start(), m.group()) for m in _FRAC.finditer(text)]
        found += self._bars(text)
        return [g for _, g in sorted(found)]

    @staticmethod
    def _bars(text: str) -> list[tuple[int, str]]:
        # `\d` and `\s` of a str regex are str.isdecimal() and str.isspace()
        out, i, n = [], 0, len(text)
        while i < n:
            if not text[i].isdecimal():
                i += 1
                continue
            start = i
            while i < n and text[i].isdecimal():
                i += 1
            j = i
            while j < n and text[j].isspace():
                j += 1
            if j < n and text[j] == "/":
                k = j + 1
                while k < n and text[k].isspace():
                    k += 1
                end = k
                while end < n and text[end].isdecimal():
                    end += 1
                if end > k:
                    out.append((start, text[start:end]))
                    i = end
        return out


ANSWER_SHAPES: dict[str, Any] = {  # each has findall(text) -> list[str]
    "number": re.compile(_NUMBER),
    "fraction": FractionShape(),
    "weekday": re.compile(_WEEKDAY, re.IGNORECASE),
    "yes_no": re.compile(r"\b(?:Yes|No)\b", re.IGNORECASE),
}
_CALENDAR_SHAPES = {
    "is_leap_year": "yes_no",
    "count_days": "number",
    "count_business_days": "number",
    "recurring_event_day": "number",
}  # the other calendar tasks ask for a weekday


def answer_shape(dataset: str, entry: Mapping[str, Any] | None = None) -> Any:
    """The shape of a right answer to this question, if it has a distinctive one."""
    if dataset in ("basic_arithmetic", "decimal_arithmetic"):
        return ANSWER_SHAPES["number"]
    if dataset == "fraction_simplification":
        return ANSWER_SHAPES["fraction"]
    if dataset == "calendar_arithmetic":
        task = ((entry or {}).get("metadata") or {}).get("task")
        return ANSWER_SHAPES[_CALENDAR_SHAPES.get(task, "weekday")]
    return None


def extract_answer(text: str, shape: Any = None) -> str | None:
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
    from sapo_core import gym

    config = json.loads(config_json)
    return gym.create_dataset(dataset, seed=0, size=1, **config).score_answer


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


__all__ = [
    "REWARDS",
    "RewardFn",
    "register",
    "extract_answer",
    "explicit_answer",
    "answer_shape",
    "clean_answer",
    "has_answer_line",
    "score_answer",
    "accuracy_reward",
    "correct_reward",
    "format_reward",
    "is_solved",
    "MAX_ANSWER_CHARS",
    "SOLVED",
]
