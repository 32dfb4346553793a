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
- The measure: k completions per question at the training temperature (the solve rate: share of
  completions fully right; the mean reward under the node's reward setting) and one greedy one,
  at the start level and, once the curriculum has moved a dataset up, at its current level too.
- Against the base model: the same questions, the same per-question seeds (common random
  numbers: the pair differs only by the weights), measured once per (model, set, settings) and
  cached in the cache directory. The gain's 95 % interval is a paired bootstrap over questions.

The figures go into the round's metrics under `eval/...` (names in `EVAL_KEYS` and
`summarize`), so the run store and the GUI's RoundDone events carry them.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import random
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from sapo_core.config import NodeConfig
from sapo_core.fsutil import atomic_write_bytes
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

    @classmethod
    def for_config(cls, cfg: NodeConfig) -> EvalSettings:
        """eval.samples and eval.greedy, at the node's own sampling settings."""
        s = cfg.sampler
        return cls(cfg.eval.samples, cfg.eval.greedy, s.temperature, s.top_p, s.max_new_tokens)


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


@contextlib.contextmanager
def base_weights(policy, sampler) -> Iterator[None]:
    """The sampler follows the base model inside the block (LoRA B matrices at zero), the
    trained policy again after it. Full fine-tuning has no base copy: ValueError."""
    if not policy.lora:
        raise ValueError("the base model's weights are gone once all weights are trained")
    import torch

    saved = policy.trainable_state_dict()
    version = policy.version
    try:
        with torch.no_grad():
            for name, p in policy.model.named_parameters():
                if p.requires_grad and "lora_B" in name:
                    p.zero_()
        policy.version = -1  # a version no update has: the sampler syncs to it
        sampler.sync_policy(policy)
        yield
    finally:
        policy.load_trainable_state_dict(saved)
        policy.version = version
        sampler.sync_policy(policy)


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


# --- the base model's result, cached ----------------------------------------------------------


def base_cache_path(
    cache_dir: Path, policy, questions: Sequence[Question], settings: EvalSettings, tasks: TaskSet, sampler_name: str
) -> Path:
    """One file per (model file, held-out set, sampling settings, prompt, reward setting, sampler)."""
    source = ""
    if policy.gguf_path is not None and Path(policy.gguf_path).is_file():
        st = Path(policy.gguf_path).stat()
        source = f"{Path(policy.gguf_path).resolve()}:{st.st_size}:{st.st_mtime_ns}"
    key = json.dumps(
        {
            "format": EVAL_FORMAT,
            "model": policy.model_id,
            "source": source,
            "set": set_name(questions),
            "settings": asdict(settings),
            "prompt": tasks.cfg.prompt,
            "system": tasks.cfg.system_prompt,
            "partial_credit": tasks.cfg.partial_credit,
            "format_reward": tasks.cfg.format_reward,
            "sampler": sampler_name,
        },
        sort_keys=True,
    )
    digest = hashlib.blake2b(key.encode(), digest_size=10).hexdigest()
    return Path(cache_dir) / "eval" / f"base-{policy.model_id}-{digest}.json"


def load_cached(path: Path, questions: Sequence[Question]) -> EvalScores | None:
    try:
        scores = EvalScores.from_json(json.loads(path.read_text(encoding="utf-8")))
    except (OSError, ValueError, KeyError, TypeError):
        return None  # absent or damaged: measured again
    return scores if scores.keys == [q.id.key() for q in questions] else None


def save_cached(path: Path, scores: EvalScores) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_bytes(path, json.dumps(scores.to_json()).encode())


# --- what the node runs -----------------------------------------------------------------------


def start_levels(tasks: TaskSet) -> dict[str, int]:
    """Each trained dataset's start level index (the level the held-out gain is measured at)."""
    from sapo_core.tasks import level_names, start_level

    cfg = tasks.cfg
    return {d: level_names(d).index(start_level(d, cfg.levels.get(d, cfg.difficulty))) for d in tasks.datasets}


class Evaluator:
    """The node's held-out evaluation: the start-level set against the base model (cached), and
    the current curriculum level where the curriculum has moved a dataset."""

    def __init__(self, tasks: TaskSet, settings: EvalSettings, per_dataset: int, cache_dir: Path) -> None:
        self.tasks = tasks
        self.settings = settings
        self.per_dataset = per_dataset
        self.cache_dir = Path(cache_dir)
        self.start = start_levels(tasks)
        self.questions = eval_set(tasks.datasets, self.start, per_dataset)
        self.base: EvalScores | None = None
        self.last: EvalScores | None = None  # the policy's latest result on the start-level set

    def run(self, sampler, policy, hooks: RoundHooks) -> dict[str, float]:
        """Measure the policy as the sampler now follows it; the base model first if not cached."""
        base = self._base(sampler, policy, hooks)
        current = (
            base
            if (base is not None and policy.version == 0)
            else measure(sampler, policy, self.tasks, self.questions, self.settings, hooks)
        )
        self.last = current
        m = summarize(current, base)
        levels = {d: self.tasks.curriculum.level(d) for d in self.tasks.datasets}
        moved = [d for d in self.tasks.datasets if levels[d] != self.start[d]]
        solved = {
            d: [x for s, ds in zip(current.solved, current.datasets) if ds == d for x in s] for d in self.tasks.datasets
        }
        if moved:
            above = measure(
                sampler, policy, self.tasks, eval_set(moved, levels, self.per_dataset), self.settings, hooks
            )
            for d in moved:
                solved[d] = [x for s, ds in zip(above.solved, above.datasets) if ds == d for x in s]
                m[f"eval/{d}/level_solve_rate"] = _mean(solved[d])
        m["eval/level_solve_rate"] = _mean([x for d in self.tasks.datasets for x in solved[d]])
        return m

    def _base(self, sampler, policy, hooks: RoundHooks) -> EvalScores | None:
        if self.base is not None:
            return self.base
        path = base_cache_path(self.cache_dir, policy, self.questions, self.settings, self.tasks, sampler.name)
        self.base = load_cached(path, self.questions)
        if self.base is not None:
            return self.base
        if policy.version == 0:
            self.base = measure(sampler, policy, self.tasks, self.questions, self.settings, hooks)
        elif policy.lora:
            log.info("measuring the base model on the held-out set (not in the cache)")
            with base_weights(policy, sampler):
                self.base = measure(sampler, policy, self.tasks, self.questions, self.settings, hooks)
        else:
            log.warning("no cached base result and full fine-tuning keeps no base weights: no gain figure")
            return None
        save_cached(path, self.base)
        return self.base


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
    "Evaluator",
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
    "base_weights",
    "paired_bootstrap",
    "summarize",
    "gains_by_dataset",
    "eval_within_share",
    "held_out_line",
    "base_cache_path",
    "load_cached",
    "save_cached",
]
