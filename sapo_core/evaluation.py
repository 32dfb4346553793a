"""Held-out evaluation: does the policy solve more fresh questions than the base model did?

Training reward says little about that (it swings with the draw of questions and follows the
curriculum's level), so the node measures a fixed set of questions no node ever trains on
(the held-out set):

- The set: per dataset, questions 0..Q-1 of ReasoningGYM at a level, built from `EVAL_SEED`.
  ReasoningGYM builds item i of a dataset made with seed s from `Random(s + i)` alone; training
  seeds are below 2**32 and indices below 2**31 (`tasks.MAX_SEED`, `MAX_INDEX`), so no training
  draw, ours or a peer's, reaches `EVAL_SEED` and above. The small easy levels still repeat
  question texts under different seeds ("Calculate 4 - 1." comes up often), so training also
  skips any question whose text is in the set (`HeldOut`, used by `TaskSet.sample_questions`).
  The seed is a constant: every node evaluates the same questions, so their figures compare.
- The measure: k completions per question at the training temperature (or `eval.temperature`;
  the solve rate: share of completions fully right; the mean reward under the node's reward
  setting) and one greedy one, at the start level: `eval/solve_rate`, the figure every earlier
  result is comparable with.
- Every level too: `eval.level_questions` questions per dataset at each level above the start
  level (k completions, no greedy), one cell per (dataset, level). `eval/capability` is the mean
  of all cells' solve rates, the start level's included, each cell weighing alike: a node that
  learns medium questions shows it there, and one that forgets easy ones while climbing shows
  that. Its gain's 95 % interval is a paired bootstrap over questions within each cell. 16
  questions x 4 completions a cell: a cell's solve rate then has a standard error of at most about
  0.07 over questions, the mean of nine cells about 0.025, under the +0.05 changes a recipe must
  show (docs/experiment.md, 'How many held-out questions'). The curriculum's current level is one
  of these cells (`eval/<dataset>/level_solve_rate`, `eval/level_solve_rate`).
- Against the base model: the same questions, the same per-question seeds (common random
  numbers: the pair differs only by the weights), measured once per (model, set, settings) and
  cached in the cache directory. The gain's 95 % interval is a paired bootstrap over questions.

The figures go into the round's metrics under `eval/...` (names in `EVAL_KEYS` and
`summarize`), so the run store and the GUI's RoundDone events carry them.
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import random
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from sapo_core.config import NodeConfig
from sapo_core.hooks import RoundHooks
from sapo_core.rollouts import Question, QuestionId
from sapo_core.sampler import SamplingParams
from sapo_core.tasks import LEVELS, MAX_INDEX, MAX_SEED, TaskSet, _generate, _reference_answer, config_digest

log = logging.getLogger(__name__)

# Every training (seed + index) is below MAX_SEED + MAX_INDEX (= 2**32 + 2**31): none reaches here.
EVAL_SEED = 2**33
assert EVAL_SEED >= MAX_SEED + MAX_INDEX
MAX_EVAL_QUESTIONS = 512  # per dataset and level
GREEDY_TEMPERATURE = 1e-5  # the samplers need T > 0; at 1e-5 only exact logit ties are not argmax
BOOTSTRAP_RESAMPLES = 2000
EVAL_FORMAT = 1  # bump when the measure changes: cached base results are then measured again


def eval_question(dataset: str, level: int, index: int) -> Question:
    """Question `index` of the held-out set of (dataset, level)."""
    if not 0 <= index < MAX_EVAL_QUESTIONS:
        raise ValueError(f"held-out index {index} outside 0..{MAX_EVAL_QUESTIONS - 1}")
    entry = _generate(dataset, level, EVAL_SEED, index)
    qid = QuestionId(dataset, config_digest(dataset, LEVELS[dataset][level]), EVAL_SEED, index)
    return Question(id=qid, text=str(entry["question"]), answer=_reference_answer(entry), entry=entry)


def eval_set(datasets: Sequence[str], levels: dict[str, int], per_dataset: int) -> list[Question]:
    """The held-out questions of each dataset at its level, dataset by dataset."""
    return [eval_question(d, levels[d], i) for d in datasets for i in range(per_dataset)]


class HeldOut:
    """The question texts of the held-out sets (`per_dataset` questions per dataset and level),
    built on first use of each (dataset, level); `TaskSet.sample_questions` asks before it keeps
    a training question, so training never sees a held-out question, whatever its seed."""

    def __init__(self, per_dataset: int) -> None:
        self.per_dataset = per_dataset
        self._texts: dict[tuple[str, int], frozenset[str]] = {}

    def texts(self, dataset: str, level: int) -> frozenset[str]:
        key = (dataset, level)
        if key not in self._texts:
            self._texts[key] = frozenset(eval_question(dataset, level, i).text for i in range(self.per_dataset))
        return self._texts[key]

    def __call__(self, dataset: str, level: int, text: str) -> bool:
        return text in self.texts(dataset, level)


def set_name(questions: Sequence[Question]) -> str:
    """16 hex digits naming a held-out set by its questions' ids, texts and answers."""
    h = hashlib.blake2b(digest_size=8)
    for q in questions:
        h.update(f"{q.id.key()}\0{q.text}\0{q.answer}\n".encode())
    return h.hexdigest()


# --- measuring ------------------------------------------------------------------------------


@dataclass
class EvalScores:
    """One policy on one held-out set: per question (in set order) k sampled completions'
    correctness (1/0) and reward, and the greedy completion's correctness."""

    keys: list[str]
    datasets: list[str]
    solved: list[list[float]]  # (Q, k)
    rewards: list[list[float]]  # (Q, k)
    greedy: list[float] = field(default_factory=list)  # (Q,), empty without greedy

    @property
    def per_question(self) -> list[float]:
        return [sum(s) / len(s) if s else 0.0 for s in self.solved]

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> EvalScores:
        return cls(**{k: data[k] for k in ("keys", "datasets", "solved", "rewards", "greedy")})


@dataclass(frozen=True)
class EvalSettings:
    """How completions are drawn: the node's own sampling settings, k samples, greedy or not."""

    samples: int
    greedy: bool
    temperature: float
    top_p: float
    max_new_tokens: int
    seed: int = 0  # per-question seeds derive from it and the question, never from the node
    quantization: str = ""  # the weights llama.cpp samples from (sampler.quantization): part of a base result's key

    @classmethod
    def for_config(cls, cfg: NodeConfig) -> EvalSettings:
        """eval.samples and eval.greedy, at the node's own sampling settings (its completion length
        and temperature unless eval.max_new_tokens and eval.temperature set them)."""
        s, e = cfg.sampler, cfg.eval
        temperature = e.temperature or s.temperature
        return cls(e.samples, e.greedy, temperature, s.top_p, e.max_new_tokens or s.max_new_tokens, 0, s.quantization)

    def without_greedy(self) -> EvalSettings:
        return dataclasses.replace(self, greedy=False)


def _question_seed(settings: EvalSettings, question: Question) -> int:
    h = hashlib.blake2b(f"eval:{settings.seed}:{question.id.key()}".encode(), digest_size=4).digest()
    return int.from_bytes(h, "little") & 0x7FFFFFFF


class _EvalHooks:
    """The node's hooks (pause, throttle, stop act as in a round) with progress shown as 'eval'."""

    def __init__(self, hooks: RoundHooks) -> None:
        self._hooks = hooks

    def checkpoint(self) -> None:
        self._hooks.checkpoint()

    def progress(self, phase: str, done: int, total: int, **info: Any) -> None:
        self._hooks.progress("eval", done, total, **info)


def measure(
    sampler, policy, tasks: TaskSet, questions: Sequence[Question], settings: EvalSettings, hooks: RoundHooks
) -> EvalScores:
    """Sample the current policy on the questions (batched through the node's sampler) and score."""
    hooks = _EvalHooks(hooks)
    prompts = [policy.encode_prompt(tasks.messages(q)) for q in questions]
    seeds = [_question_seed(settings, q) for q in questions]
    params = SamplingParams(
        n=settings.samples,
        max_new_tokens=settings.max_new_tokens,
        temperature=settings.temperature,
        top_p=settings.top_p,
        stop_token_ids=policy.eos_ids,
    )
    out = EvalScores(
        keys=[q.id.key() for q in questions], datasets=[q.id.dataset for q in questions], solved=[], rewards=[]
    )
    for q, seqs in zip(questions, sampler.sample(prompts, seeds, params, hooks)):
        texts = [policy.decode(s.token_ids) for s in seqs]
        out.solved.append([1.0 if ok else 0.0 for ok in tasks.solved(q, texts)])
        out.rewards.append([float(r) for r in tasks.score(q, texts)])
    if settings.greedy:
        greedy = SamplingParams(
            n=1,
            max_new_tokens=settings.max_new_tokens,
            temperature=GREEDY_TEMPERATURE,
            top_p=1.0,
            stop_token_ids=policy.eos_ids,
        )
        for q, seqs in zip(questions, sampler.sample(prompts, seeds, greedy, hooks)):
            out.greedy.append(1.0 if tasks.solved(q, [policy.decode(seqs[0].token_ids)])[0] else 0.0)
    return out


# --- figures ---------------------------------------------------------------------------------


def paired_bootstrap(
    current: Sequence[float], base: Sequence[float], resamples: int = BOOTSTRAP_RESAMPLES, seed: int = 0
) -> tuple[float, float, float]:
    """(mean of current - base, 2.5th and 97.5th percentile of that mean over question resamples).

    current, base: (Q,) per-question solve rates of the same questions in the same order."""
    if len(current) != len(base) or not current:
        raise ValueError(f"paired bootstrap needs two equal non-empty lists, got {len(current)} and {len(base)}")
    diffs = [a - b for a, b in zip(current, base)]  # (Q,)
    n = len(diffs)
    rng = random.Random(seed)
    means = sorted(sum(diffs[rng.randrange(n)] for _ in range(n)) / n for _ in range(resamples))
    lo = means[int(0.025 * (resamples - 1))]
    hi = means[int(round(0.975 * (resamples - 1)))]
    return sum(diffs) / n, lo, hi


def _mean(xs: Sequence[float]) -> float:
    return float(sum(xs) / len(xs)) if xs else 0.0


def summarize(current: EvalScores, base: EvalScores | None) -> dict[str, float]:
    """The `eval/...` figures of one policy on the start-level set, against the base model."""
    flat = [x for s in current.solved for x in s]
    m: dict[str, float] = {
        "eval/solve_rate": _mean(flat),
        "eval/reward_mean": _mean([x for r in current.rewards for x in r]),
        "eval/questions": float(len(current.keys)),
        "eval/samples": float(len(current.solved[0]) if current.solved else 0),
    }
    if current.greedy:
        m["eval/greedy_solve_rate"] = _mean(current.greedy)
    for d in dict.fromkeys(current.datasets):
        m[f"eval/{d}/solve_rate"] = _mean([x for s, ds in zip(current.solved, current.datasets) if ds == d for x in s])
    if base is not None and base.keys == current.keys:
        m["eval/solve_rate_base"] = _mean([x for s in base.solved for x in s])
        if base.greedy:
            m["eval/greedy_solve_rate_base"] = _mean(base.greedy)
        for d, g in gains_by_dataset(current, base).items():  # "all": every question, the overall gain
            prefix = "eval" if d == "all" else f"eval/{d}"
            m.update({f"{prefix}/gain": g["gain"], f"{prefix}/gain_ci_low": g["ci_low"]})
            m[f"{prefix}/gain_ci_high"] = g["ci_high"]
    return m


def gains_by_dataset(current: EvalScores, base: EvalScores) -> dict[str, dict[str, float]]:
    """dataset (and "all") -> base and current solve rate, gain and its paired-bootstrap 95 % CI."""
    if base.keys != current.keys:
        raise ValueError("the two results are not on the same held-out questions")
    out: dict[str, dict[str, float]] = {}
    for d in [*dict.fromkeys(current.datasets), "all"]:
        idx = [i for i, ds in enumerate(current.datasets) if d in ("all", ds)]
        cur = [current.per_question[i] for i in idx]
        bas = [base.per_question[i] for i in idx]
        gain, lo, hi = paired_bootstrap(cur, bas)
        out[d] = {
            "questions": float(len(idx)),
            "base": _mean(bas),
            "current": _mean(cur),
            "gain": gain,
            "ci_low": lo,
            "ci_high": hi,
        }
        if current.greedy and base.greedy:
            out[d]["greedy_base"] = _mean([base.greedy[i] for i in idx])
            out[d]["greedy_current"] = _mean([current.greedy[i] for i in idx])
    return out


# --- what the node runs -----------------------------------------------------------------------


def start_levels(tasks: TaskSet) -> dict[str, int]:
    """Each trained dataset's start level index (the level the held-out gain is measured at)."""
    from sapo_core.tasks import level_names, start_level

    cfg = tasks.cfg
    return {d: level_names(d).index(start_level(d, cfg.levels.get(d, cfg.difficulty))) for d in tasks.datasets}


@dataclass(frozen=True)
class Cell:
    """One (dataset, level) of the all-levels set: its questions are `count` consecutive ones."""

    dataset: str
    level: int
    start: int  # its first question's position in its set
    count: int

    @property
    def level_name(self) -> str:
        from sapo_core.config import LEVEL_NAMES

        return LEVEL_NAMES[self.level]


def upper_cells(datasets: Sequence[str], start: dict[str, int], per_level: int) -> list[Cell]:
    """The cells above each dataset's start level, `per_level` questions each, in set order."""
    cells, pos = [], 0
    for d in datasets:
        for level in range(start[d] + 1, len(LEVELS[d])):
            cells.append(Cell(d, level, pos, per_level))
            pos += per_level
    return cells


def cell_questions(cells: Sequence[Cell]) -> list[Question]:
    return [eval_question(c.dataset, c.level, i) for c in cells for i in range(c.count)]


def capability(
    cells: Sequence[tuple[list[float], list[float] | None]], resamples: int = BOOTSTRAP_RESAMPLES, seed: int = 0
) -> dict[str, float]:
    """The all-levels figure from each cell's per-question solve rates (current, and the base's or
    None): the mean of the cells' means, each cell alike; with the base, the gain and its 95 %
    interval from a paired bootstrap that resamples questions within each cell."""
    current = [sum(c) / len(c) for c, _ in cells]
    out = {"eval/capability": sum(current) / len(current)}
    if any(b is None for _, b in cells):
        return out
    base = [sum(b) / len(b) for _, b in cells]
    out["eval/capability_base"] = sum(base) / len(base)
    diffs = [[x - y for x, y in zip(c, b)] for c, b in cells]  # per cell, per question
    rng = random.Random(seed)
    means = sorted(
        sum(sum(d[rng.randrange(len(d))] for _ in d) / len(d) for d in diffs) / len(diffs) for _ in range(resamples)
    )
    out["eval/capability_gain"] = out["eval/capability"] - out["eval/capability_base"]
    out["eval/capability_gain_ci_low"] = means[int(0.025 * (resamples - 1))]
    out["eval/capability_gain_ci_high"] = means[int(round(0.975 * (resamples - 1)))]
    return out


def eval_within_share(last_eval_seconds: float, rounds_seconds_since: float, share: float) -> bool:
    """Whether one more evaluation as long as the last keeps evaluation within `share` of the
    node's time: the rounds since the last one took at least (1 - share) / share times as long."""
    return share >= 1 or rounds_seconds_since * share >= last_eval_seconds * (1 - share)


def held_out_line(m: dict[str, float], untrained: bool) -> str:
    """The log line of one evaluation's figures (`eval/...`, `time/eval`)."""
    if untrained:  # the base model's own figure, no gain to speak of
        gain = " (the base model)"
    elif "eval/gain" in m:
        gain = f", gain {m['eval/gain']:+.3f} ({m['eval/gain_ci_low']:+.3f}..{m['eval/gain_ci_high']:+.3f})"
    else:
        gain = ""
    return f"held-out: solve rate {m['eval/solve_rate']:.3f}{gain}, {m['time/eval']:.0f} s"


__all__ = [
    "Cell",
    "upper_cells",
    "capability",
    "start_levels",
    "EVAL_SEED",
    "MAX_EVAL_QUESTIONS",
    "GREEDY_TEMPERATURE",
    "EvalScores",
    "EvalSettings",
    "HeldOut",
    "eval_question",
    "eval_set",
    "set_name",
    "measure",
    "paired_bootstrap",
    "summarize",
    "gains_by_dataset",
    "eval_within_share",
    "held_out_line",
]
