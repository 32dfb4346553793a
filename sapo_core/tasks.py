"""Questions, their regeneration from an id, prompts and scoring: ReasoningGYM behind one class.

Every question is named by a `QuestionId` (dataset, config digest, seed, index). ReasoningGYM
builds item `index` of a dataset from `Random(seed + index)` alone, so any node regenerates
the question text and its reference answer from the id -- which is how a node checks what a
peer sends instead of believing it (peers send the id, the question text and completions;
never an answer we would trust). A config digest names one of the difficulty `LEVELS` below,
which every node knows; anything else is rejected with `UnknownQuestion("unknown_config")`.

Departures from the SAPO paper: the paper samples the nine specialties with ReasoningGYM's
settings; we start on easy levels and move with a curriculum (`sapo_core/curriculum.py`)
because SmolLM2-135M scores ~0 on the default settings and never writes `<answer>` tags
(docs/environment.md, 'The embedded model'). The default prompt (`worked`) shows one solved
example of the same dataset and level, then asks for an `Answer: ...` line; the extraction is
lenient (`rewards.extract_answer`). The example makes the model answer in the asked form, with
shorter completions and the same share solved (`sapo-bench tasks`; docs/calibration.md,
'Default task mix and prompt'); where the question is an expression the example writes it out
above its Answer line, which the model then does too, and more often rightly (docs/experiment.md,
'A worked example').
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import io
import json
import random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from sapo_core import gym
from sapo_core.config import LEVEL_NAMES, PAPER_SPECIALTIES, TaskConfig
from sapo_core.curriculum import Curriculum, LevelChange
from sapo_core.reask import ReaskPool, reask_count
from sapo_core.rewards import REWARDS, extract_answer, is_solved, score_answer
from sapo_core.rollouts import Group, Question, QuestionId

MAX_INDEX = 2**31  # question indices are 0 <= index < MAX_INDEX
MAX_SEED = 2**32  # seeds are 0 <= seed < MAX_SEED


# --- difficulty levels ------------------------------------------------------------------
# Per dataset, ReasoningGYM configs from easiest to hardest, named by LEVEL_NAMES in order.
# "easy" is sized so that SmolLM2-135M solves some questions (a group needs reward variance
# to teach anything); "hard" is mostly ReasoningGYM's own default. Changing a config changes
# its digest, so nodes of different versions simply reject each other's questions.
# bf stops at difficulty 2: generating one difficulty-3 item runs a compiled BF program in
# pure Python, up to tens of seconds per item -- too slow to regenerate peers' questions
# (docs/environment.md, 'ReasoningGYM'). A dataset with fewer levels uses its hardest for "hard".
LEVELS: dict[str, tuple[dict[str, Any], ...]] = {
    "base_conversion": (
        {"min_base": 8, "max_base": 10, "min_value": 0, "max_value": 50},
        {"min_base": 2, "max_base": 10, "min_value": 0, "max_value": 255},
        {"min_base": 2, "max_base": 16, "min_value": 0, "max_value": 1000},
    ),
    "basic_arithmetic": (
        {
            "min_terms": 2,
            "max_terms": 2,
            "min_digits": 1,
            "max_digits": 1,
            "operators": ["+", "-"],
            "allow_parentheses": False,
            "allow_negation": False,
        },
        {
            "min_terms": 2,
            "max_terms": 3,
            "min_digits": 1,
            "max_digits": 2,
            "operators": ["+", "-", "*"],
            "allow_parentheses": False,
            "allow_negation": False,
        },
        {
            "min_terms": 2,
            "max_terms": 6,
            "min_digits": 1,
            "max_digits": 4,
            "operators": ["+", "-", "*", "/"],
            "allow_parentheses": True,
            "allow_negation": True,
        },
    ),
    "arc_1d": (
        {"min_size": 8, "max_size": 10, "num_train": 3},
        {"min_size": 10, "max_size": 20, "num_train": 3},
        {"min_size": 10, "max_size": 30, "num_train": 3},
    ),
    "bf": ({"difficulty": 1}, {"difficulty": 2}),
    "propositional_logic": (
        {
            "min_vars": 2,
            "max_vars": 2,
            "min_statements": 2,
            "max_statements": 2,
            "min_complexity": 1,
            "max_complexity": 2,
        },
        {
            "min_vars": 2,
            "max_vars": 3,
            "min_statements": 2,
            "max_statements": 3,
            "min_complexity": 1,
            "max_complexity": 2,
        },
        {
            "min_vars": 2,
            "max_vars": 4,
            "min_statements": 2,
            "max_statements": 4,
            "min_complexity": 1,
            "max_complexity": 3,
        },
    ),
    "fraction_simplification": (
        {"min_value": 1, "max_value": 10, "min_factor": 1, "max_factor": 10, "styles": ["plain"]},
        {"min_value": 1, "max_value": 100, "min_factor": 1, "max_factor": 20, "styles": ["plain", "latex_inline"]},
        {
            "min_value": 1,
            "max_value": 1000,
            "min_factor": 1,
            "max_factor": 100,
            "styles": ["plain", "latex_inline", "latex_frac", "latex_dfrac"],
        },
    ),
    "decimal_arithmetic": (
        {"min_num_decimal_places": 1, "max_num_decimal_places": 1, "min_terms": 2, "max_terms": 2, "precision": 6},
        {"min_num_decimal_places": 1, "max_num_decimal_places": 2, "min_terms": 2, "max_terms": 3, "precision": 8},
        {"min_num_decimal_places": 3, "max_num_decimal_places": 3, "min_terms": 2, "max_terms": 6, "precision": 12},
    ),
    "calendar_arithmetic": (
        {"tasks": ["weekday_of_date", "is_leap_year", "weekday_offset"], "offset_upper_bound": 30},
        {
            "tasks": ["weekday_of_date", "is_leap_year", "weekday_offset", "count_days", "count_business_days"],
            "offset_upper_bound": 100,
        },
        {
            "tasks": [
                "weekday_offset",
                "weekday_of_date",
                "weekday_of_date_from_first_date",
                "recurring_event_day",
                "count_days",
                "count_business_days",
                "is_leap_year",
            ],
            "offset_upper_bound": 100,
        },
    ),
    "binary_matrix": (
        {"min_n": 2, "max_n": 3, "p_zero": 0.5},
        {"min_n": 3, "max_n": 5, "p_zero": 0.25},
        {"min_n": 3, "max_n": 10, "p_zero": 0.25},
    ),
}
assert tuple(LEVELS) == PAPER_SPECIALTIES and all(1 <= len(v) <= len(LEVEL_NAMES) for v in LEVELS.values())


def level_names(dataset: str) -> tuple[str, ...]:
    return LEVEL_NAMES[: len(LEVELS[dataset])]


def start_level(dataset: str, name: str) -> str:
    """The level `name` of a dataset, or its hardest when it has fewer levels."""
    names = level_names(dataset)
    return name if name in names else names[-1]


def config_digest(dataset: str, config: Mapping[str, Any]) -> str:
    """16 hex digits naming (dataset, ReasoningGYM config); key order and tuple/list don't matter."""
    canonical = json.dumps({"dataset": dataset, "config": dict(config)}, sort_keys=True, separators=(",", ":"))
    return hashlib.blake2b(canonical.encode("utf-8"), digest_size=8).hexdigest()


# digest -> (dataset, level index): the only configs a question may name.
KNOWN_CONFIGS: dict[str, tuple[str, int]] = {
    config_digest(name, cfg): (name, i) for name, levels in LEVELS.items() for i, cfg in enumerate(levels)
}


class UnknownQuestion(ValueError):
    """A QuestionId this node cannot regenerate; `.reason` is unknown_task, unknown_config or bad_index."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason


@functools.lru_cache(maxsize=256)
def _rg_dataset(dataset: str, level: int, seed: int) -> Any:
    # Item i depends only on (seed + i), not on size: one instance serves every index.
    config = json.loads(json.dumps(LEVELS[dataset][level]))  # a private copy
    return gym.create_dataset(dataset, seed=seed, size=MAX_INDEX, **config)


def _generate(dataset: str, level: int, seed: int, index: int) -> dict[str, Any]:
    if dataset != "bf":
        return _rg_dataset(dataset, level, seed)[index]
    # bf's program compiler prints while it works; keep our stdout clean (the CLI draws on it)
    with contextlib.redirect_stdout(io.StringIO()):
        return _rg_dataset(dataset, level, seed)[index]


def _reference_answer(entry: Mapping[str, Any]) -> str:
    # propositional_logic has many right answers; its entry holds one in metadata.
    answer = entry.get("answer")
    if answer is None:
        answer = entry.get("metadata", {}).get("example_answer", "")
    return str(answer)


def _is_int(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def regenerate(qid: QuestionId) -> Question:
    """Rebuild a question and its answer from its id alone; raises UnknownQuestion."""
    if not isinstance(qid.dataset, str) or qid.dataset not in LEVELS:
        raise UnknownQuestion("unknown_task", f"no dataset {qid.dataset!r:.80}")
    known = KNOWN_CONFIGS.get(qid.config_digest) if isinstance(qid.config_digest, str) else None
    if known is None or known[0] != qid.dataset:
        raise UnknownQuestion("unknown_config", f"{qid.dataset} has no config {qid.config_digest!r:.80}")
    if not (_is_int(qid.seed) and 0 <= qid.seed < MAX_SEED and _is_int(qid.index) and 0 <= qid.index < MAX_INDEX):
        raise UnknownQuestion("bad_index", f"seed {qid.seed!r:.40} / index {qid.index!r:.40} out of range")
    try:
        entry = _generate(qid.dataset, known[1], qid.seed, qid.index)
    except Exception as e:  # ReasoningGYM failing on one item: treat it as an index we cannot use
        raise UnknownQuestion("bad_index", f"{qid.key()} does not generate: {e!r:.200}") from e
    return Question(id=qid, text=str(entry["question"]), answer=_reference_answer(entry), entry=entry)


def level_of(question: Question) -> tuple[str, int]:
    """(level name, level index) of a question built here."""
    _, level = KNOWN_CONFIGS[question.id.config_digest]
    return LEVEL_NAMES[level], level


# --- prompts ----------------------------------------------------------------------------


@dataclass(frozen=True)
class PromptStyle:
    instruction: str  # appended to the question; "" for none
    one_shot: bool = False  # precede the question with a solved example of the same dataset and level
    worked: bool = False  # the example's answer shows its working where the dataset's metadata gives it


PROMPTS: dict[str, PromptStyle] = {
    "plain": PromptStyle(""),
    "answer_line": PromptStyle("Give your final answer on the last line, in the form:\nAnswer: <answer>"),
    "tags": PromptStyle("Put your final answer between <answer> and </answer>."),
    "one_shot": PromptStyle("Give your final answer on the last line, in the form:\nAnswer: <answer>", one_shot=True),
    "worked": PromptStyle(
        "Give your final answer on the last line, in the form:\nAnswer: <answer>", one_shot=True, worked=True
    ),
}
EXAMPLE_SEED = MAX_SEED - 1  # one-shot examples come from this seed (fixed per dataset and level)


def _user_text(style: PromptStyle, text: str) -> str:
    return f"{text.rstrip()}\n\n{style.instruction}" if style.instruction else text.rstrip()


def answer_text(answer: str) -> str:
    """An answer in the asked format; a multi-line answer (a matrix) goes below the marker."""
    return f"Answer:\n{answer}" if "\n" in answer else f"Answer: {answer}"


def worked_answer_text(question: Question) -> str:
    """The answer of a solved example with its working above the Answer line, where the working
    is the question's own expression: basic_arithmetic's '9 - 8 = 1'. A 135M model that writes the
    expression first completes it as it has seen sums written, and more often rightly than straight
    after 'Answer:' (docs/experiment.md, 'A worked example'). Elsewhere the answer alone: written-out
    working for fractions and weekdays made the base model's answers 2-3x longer and no better."""
    expression = (
        question.entry.get("metadata", {}).get("expression") if question.id.dataset == "basic_arithmetic" else None
    )
    if not isinstance(expression, str) or "\n" in question.answer:
        return answer_text(question.answer)
    return f"{expression.strip()} = {question.answer}\n{answer_text(question.answer)}"


@functools.lru_cache(maxsize=64)
def one_shot_example(dataset: str, digest: str) -> Question:
    """The solved example shown before questions of one (dataset, level): the first item of
    EXAMPLE_SEED whose reference answer scores full marks (propositional_logic's reference
    is sometimes a fallback that does not follow from the premises)."""
    first = None
    for index in range(32):
        q = regenerate(QuestionId(dataset, digest, EXAMPLE_SEED, index))
        first = first or q
        if score_one(q, extract_answer(answer_text(q.answer))) >= 1.0:
            return q
    return first


def build_messages(question: Question, prompt: str, system_prompt: str = "") -> list[dict[str, str]]:
    """Chat messages for one question in one prompt style."""
    style = PROMPTS[prompt]
    messages = [{"role": "system", "content": system_prompt}] if system_prompt else []
    if style.one_shot:
        example = one_shot_example(question.id.dataset, question.id.config_digest)
        messages += [
            {"role": "user", "content": _user_text(style, example.text)},
            {
                "role": "assistant",
                "content": worked_answer_text(example) if style.worked else answer_text(example.answer),
            },
        ]
    messages.append({"role": "user", "content": _user_text(style, question.text)})
    return messages


# --- the task set -----------------------------------------------------------------------


def _keyed_rng(key: str) -> random.Random:
    return random.Random(int.from_bytes(hashlib.blake2b(key.encode(), digest_size=8).digest(), "little"))


def _round_rng(seed: int, round: int, part: int = 0) -> random.Random:
    return _keyed_rng(f"questions:{seed}:{round}" + (f":{part}" if part else ""))


_HELD_OUT_REDRAWS = 1000  # far beyond need: the smallest level has ~200 texts, the held-out set <= 512


class TaskSet:
    """The datasets a node trains on, their current levels, prompts and rewards."""

    def __init__(self, cfg: TaskConfig, seed: int, held_out: Callable[[str, int, str], bool] | None = None) -> None:
        """`held_out(dataset, level, text)`: True for a question training must skip (the held-out
        evaluation's, `evaluation.HeldOut`)."""
        if not _is_int(seed) or not 0 <= seed < MAX_SEED:
            raise ValueError(f"seed must be an integer 0..{MAX_SEED - 1}, got {seed!r}")
        self.cfg = cfg
        self.seed = seed
        self.held_out = held_out
        self.datasets: list[str] = [d for d in PAPER_SPECIALTIES if cfg.weights.get(d, 0) > 0]
        self._weights = [float(cfg.weights[d]) for d in self.datasets]
        self.curriculum = Curriculum(
            {d: level_names(d) for d in LEVELS},
            {d: start_level(d, cfg.levels.get(d, cfg.difficulty)) for d in LEVELS},
            window=cfg.curriculum_window,
            raise_at=cfg.curriculum_raise,
            lower_at=cfg.curriculum_lower,
            enabled=cfg.curriculum,
            rule=cfg.curriculum_rule,
        )
        self.reask = ReaskPool()  # questions asked again (tasks.reask_share; sapo_core/reask.py)

    def levels(self) -> dict[str, str]:
        """Current level name of each dataset we train on (for logs and metrics)."""
        return {d: self.curriculum.level_name(d) for d in self.datasets}

    def current_digest(self, dataset: str) -> str:
        return config_digest(dataset, LEVELS[dataset][self.curriculum.level(dataset)])

    def sample_questions(self, round: int, n: int, part: int = 0) -> list[Question]:
        """n questions drawn with replacement by weight (as the paper samples specialties),
        each at a level the curriculum chooses; the same (seed, round, part, curriculum state)
        give the same ones. `part` > 0: another draw in the same round (a refill). In the first
        draw, with tasks.reask_share, that share of them are pooled questions asked again, after
        the fresh ones (which are the first of what the draw would be without it)."""
        rng = _round_rng(self.seed, round) if part == 0 else _round_rng(self.seed, round, part)
        again = reask_count(self.cfg.reask_share, n, len(self.reask)) if part == 0 else 0
        out = []
        for _ in range(n - again):
            dataset = rng.choices(self.datasets, weights=self._weights)[0]
            level = self.curriculum.choose_level(dataset, rng)
            digest = config_digest(dataset, LEVELS[dataset][level])
            for _attempt in range(_HELD_OUT_REDRAWS):  # a held-out question's text: draw another index
                q = regenerate(QuestionId(dataset, digest, self.seed, rng.randrange(MAX_INDEX)))
                if self.held_out is None or not self.held_out(dataset, level, q.text):
                    break
            out.append(q)
        if part == 0 and self.cfg.reask_share > 0:
            out += [regenerate(qid) for qid in self.reask.draw(_keyed_rng(f"reask:{self.seed}:{round}"), again)]
        return out

    def regenerate(self, qid: QuestionId) -> Question:
        """Any node, any seed, any of the nine datasets (also ones this node does not train on)."""
        return regenerate(qid)

    def messages(self, question: Question) -> list[dict[str, str]]:
        return build_messages(question, self.cfg.prompt, self.cfg.system_prompt)

    def reference_text(self, question: Question) -> str:
        """The question's reference answer written as this node's prompt writes its example's."""
        return worked_answer_text(question) if PROMPTS[self.cfg.prompt].worked else answer_text(question.answer)

    def reward_parts(self, question: Question, completions: Sequence[str]) -> dict[str, list[float]]:
        """Each reward in use, by name: `accuracy` (ReasoningGYM's score, partial credit included)
        and `correct` (1 at full marks, else 0) always, `format` when weighted."""
        n = len(completions)
        config = LEVELS[question.id.dataset][KNOWN_CONFIGS[question.id.config_digest][1]]
        meta = {"dataset": [question.id.dataset] * n, "entry": [question.entry] * n, "config": [config] * n}
        prompts = [question.text] * n
        accuracy = [0.0 if v is None else float(v) for v in REWARDS["accuracy"](prompts, completions, **meta)]
        parts = {"accuracy": accuracy, "correct": [1.0 if is_solved(a) else 0.0 for a in accuracy]}
        if self.cfg.format_reward > 0:
            parts["format"] = REWARDS["format"](prompts, completions, **meta)
        return {name: [0.0 if v is None else float(v) for v in values] for name, values in parts.items()}

    def score(self, question: Question, completions: Sequence[str]) -> list[float]:
        """The reward of each completion: correct (or accuracy with `partial_credit`) + format_reward * format.
        The swarm's verifier re-scores peers' completions through here, so it follows the same setting."""
        parts = self.reward_parts(question, completions)
        fmt = parts.get("format", [0.0] * len(completions))
        base = parts["accuracy"] if self.cfg.partial_credit else parts["correct"]
        return [a + self.cfg.format_reward * f for a, f in zip(base, fmt)]

    def solved(self, question: Question, completions: Sequence[str]) -> list[bool]:
        """Which completions are fully right (the solve rate's numerator), whatever the reward."""
        return [c >= 1.0 for c in self.reward_parts(question, completions)["correct"]]

    def observe(self, group: Group) -> LevelChange | None:
        """Feed one of our own groups to the curriculum (peers' groups are ignored: they say
        nothing about our model). A completion counts as solved at full accuracy credit."""
        if not group.is_local:
            return None
        question = group.question
        if self.cfg.reask_share > 0:
            self.reask.observe(question.id, group.has_signal())
            if question.id in self.reask.asked:  # asked again: not a fair draw of its level
                return None
        _, level = level_of(question)
        solved = self.solved(question, [c.text for c in group.completions])
        return self.curriculum.observe(question.id.dataset, level, solved, spread=group.has_signal())

    def reask_figures(self, local: Sequence[Group]) -> dict[str, float]:
        """With tasks.reask_share: how many of the round's own groups were asked again, and with spread."""
        if self.cfg.reask_share <= 0:
            return {}
        again = [g for g in local if g.question.id in self.reask.asked]
        return {
            "groups/reasked": float(len(again)),
            "groups/reasked_with_signal": float(sum(g.has_signal() for g in again)),
        }

    def state_dict(self) -> dict[str, Any]:
        """Plain JSON data for the checkpoint."""
        return {"curriculum": self.curriculum.state_dict(), "reask": self.reask.state_dict()}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.curriculum.load_state_dict(state["curriculum"])
        self.reask.load_state_dict(state.get("reask", []))  # checkpoints before 2026-12-07 have none


def score_one(question: Question, answer: str | None) -> float:
    """ReasoningGYM's score of one already-extracted answer to a question built here."""
    config = LEVELS[question.id.dataset][KNOWN_CONFIGS[question.id.config_digest][1]]
    return score_answer(question.id.dataset, config, question.entry, answer)
