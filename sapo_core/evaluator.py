"""The node's held-out evaluation: the policy against the base model on the held-out sets.

What is measured and the figures are in evaluation.py; the base model's results (measured once,
cached or shipped) in evalbase.py.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path

from sapo_core.config import EvalConfig
from sapo_core.evalbase import (
    base_cache_path,
    base_weights,
    load_cached,
    load_shipped,
    measured_where,
    save_cached,
    shipped_key,
)
from sapo_core.evaluation import (
    Cell,
    EvalScores,
    EvalSettings,
    _mean,
    capability,
    cell_questions,
    eval_set,
    eval_within_share,
    held_out_line,
    measure,
    start_levels,
    summarize,
    upper_cells,
)
from sapo_core.hooks import RoundHooks
from sapo_core.sampler import SamplerError
from sapo_core.store import RunStore
from sapo_core.tasks import TaskSet

log = logging.getLogger(__name__)


class Evaluator:
    """The node's held-out evaluation: the start-level set against the base model, and every level
    above it (the all-levels cells), each against the base model's result (cached)."""

    def __init__(
        self,
        tasks: TaskSet,
        settings: EvalSettings,
        per_dataset: int,
        cache_dir: Path,
        per_level: int = 0,
        model_sha256: str = "",
    ) -> None:
        """`model_sha256`: the model file's SHA-256, where known: a shipped base result for it is
        used instead of measuring the base model (evalbase.py)."""
        self.tasks = tasks
        self.model_sha256 = model_sha256
        self.settings = settings
        self.per_dataset = per_dataset
        self.cache_dir = Path(cache_dir)
        self.start = start_levels(tasks)
        self.questions = eval_set(tasks.datasets, self.start, per_dataset)
        self.cells = upper_cells(tasks.datasets, self.start, per_level) if per_level else []
        self.upper_questions = cell_questions(self.cells)
        self.base: EvalScores | None = None
        self.upper_base: EvalScores | None = None
        self.last: EvalScores | None = None  # the policy's latest result on the start-level set
        self.last_upper: EvalScores | None = None

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
        upper = None
        if self.cells:
            upper_base = self.upper_base
            upper = (
                upper_base
                if (upper_base is not None and policy.version == 0)
                else measure(sampler, policy, self.tasks, self.upper_questions, self.settings.without_greedy(), hooks)
            )
            self.last_upper = upper
            m.update(self._cell_figures(current, base, upper, upper_base))
        m.update(self._level_figures(current, upper))
        return m

    def run_timed(self, sampler, policy, hooks: RoundHooks) -> dict[str, float]:
        """`run` through the node's resilient sampler, with its time (`time/eval`) and its line in
        the log; {} when the sampler's backend fails."""
        t0 = time.perf_counter()
        try:
            # the backend itself: a crash skips this evaluation, and the next round's sampling falls back
            m = self.run(sampler.inner, policy, hooks)
        except SamplerError as e:
            log.error(f"held-out evaluation skipped: sampler {sampler.name} failed ({e})")
            return {}
        m["time/eval"] = time.perf_counter() - t0
        log.info(held_out_line(m, untrained=policy.version == 0))
        return m

    def _cell_figures(
        self, current: EvalScores, base: EvalScores | None, upper: EvalScores, upper_base: EvalScores | None
    ) -> dict[str, float]:
        """Per (dataset, level) solve rates, and the capability figure over every cell."""
        m: dict[str, float] = {}
        cells: list[tuple[list[float], list[float] | None]] = []
        for d in self.tasks.datasets:  # the start level's cell: the start-level set's questions
            idx = [i for i, ds in enumerate(current.datasets) if ds == d]
            cur = [current.per_question[i] for i in idx]
            cells.append((cur, [base.per_question[i] for i in idx] if base is not None else None))
            m[f"eval/{d}/{Cell(d, self.start[d], 0, 0).level_name}/solve_rate"] = _mean(cur)
        for c in self.cells:
            cur = upper.per_question[c.start : c.start + c.count]
            was = upper_base.per_question[c.start : c.start + c.count] if upper_base is not None else None
            cells.append((cur, was))
            m[f"eval/{c.dataset}/{c.level_name}/solve_rate"] = _mean(cur)
        m.update(capability(cells))
        return m

    def _level_figures(self, current: EvalScores, upper: EvalScores | None) -> dict[str, float]:
        """The solve rate at each dataset's current curriculum level (`eval/level_solve_rate`)."""
        m: dict[str, float] = {}
        rates = []
        for d in self.tasks.datasets:
            level = self.tasks.curriculum.level(d)
            cell = next((c for c in self.cells if (c.dataset, c.level) == (d, level)), None)
            if level == self.start[d] or cell is None or upper is None:
                solved = [x for s, ds in zip(current.solved, current.datasets) if ds == d for x in s]
            else:
                solved = [x for s in upper.solved[cell.start : cell.start + cell.count] for x in s]
            if level != self.start[d]:
                m[f"eval/{d}/level_solve_rate"] = _mean(solved)
            rates.extend(solved)
        m["eval/level_solve_rate"] = _mean(rates)
        return m

    def _base(self, sampler, policy, hooks: RoundHooks) -> EvalScores | None:
        if self.base is not None:
            return self.base
        self.base = self._base_of(self.questions, self.settings, sampler, policy, hooks)
        if self.cells:
            self.upper_base = self._base_of(
                self.upper_questions, self.settings.without_greedy(), sampler, policy, hooks
            )
        return self.base

    def _base_of(self, questions, settings: EvalSettings, sampler, policy, hooks: RoundHooks) -> EvalScores | None:
        path = base_cache_path(self.cache_dir, policy, questions, settings, self.tasks, sampler.name)
        cached = load_cached(path, questions)
        if cached is not None:
            return cached
        if self.model_sha256:
            key = shipped_key(policy.model_id, self.model_sha256, questions, settings, self.tasks, sampler.name)
            shipped = load_shipped(key, questions, sampler.kernels)
            if shipped is not None:
                where = measured_where(shipped.kernels, sampler.kernels)
                log.info("the base model's held-out result: as shipped with the app, %s", where)
                save_cached(path, shipped.scores)
                return shipped.scores
        if policy.version == 0:
            scores = measure(sampler, policy, self.tasks, questions, settings, hooks)
        elif policy.lora:
            log.info("measuring the base model on the held-out set (not in the cache)")
            with base_weights(policy, sampler):
                scores = measure(sampler, policy, self.tasks, questions, settings, hooks)
        else:
            log.warning("no cached base result and full fine-tuning keeps no base weights: no gain figure")
            return None
        save_cached(path, scores)
        return scores


def eval_due(store: RunStore, cfg: EvalConfig, r: int) -> bool:
    """Whether round `r` ends with a held-out evaluation: every eval.every_rounds, once the rounds
    since the last one (the run store's times) leave it within eval.max_share of the node's time."""
    every = cfg.every_rounds
    if not every or r % every:
        return False
    eval_rounds, eval_seconds = store.series("time/eval")
    if not eval_rounds:
        return True
    since = [t for x, t in zip(*store.series("time/round")) if x > eval_rounds[-1]]
    return eval_within_share(eval_seconds[-1], sum(since), cfg.max_share)


__all__ = ["Evaluator", "eval_due"]
