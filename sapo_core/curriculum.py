"""Per-dataset difficulty levels that follow the model's accuracy.

A small model learns nothing from questions it never solves and little from questions it
always solves (GRPO's advantage is zero when all rewards in a group are equal). Two rules:

**step** (`rule="step"`): each dataset sits on one of its difficulty levels (see
`tasks.LEVELS`); the curriculum keeps the last `window` results of our *own* completions at
that level and

- raises the level when the rolling accuracy reaches `raise_at`,
- lowers it when the rolling accuracy falls to `lower_at` or below ("collapse"),

never below the level the user started from (`floor`) nor above the hardest. A decision
needs a full window of results at the current level, and a change clears the window, so
every level is judged on its own results only. "Accuracy" is the share of completions with
full credit (reward 1); ReasoningGYM's partial credits do not count.

**band** (`rule="band"`): every question draws its level, in proportion to how often that
level's recent groups of ours had reward spread (the groups GRPO learns from), so the round goes
where the signal is, levels already mastered keep a share in proportion to what they still
teach (nothing is forgotten unseen), and a level nobody solves yet is only probed:

- each level keeps the last `window` completions' results and the last `window // 4` groups'
  spread (at least 4);
- the levels drawn from run from the floor up to one above the highest level whose rolling
  accuracy is at least `raise_at` on a full window (the floor and the next: unlock as the step
  rule raises);
- level l's weight is its share of groups with spread over its window, at least `probe` (a
  level without spread is still probed, so the estimate stays fresh: arXiv 2605.09188), and
  `unknown` while it has fewer than 4 groups (a new level is tried).
The frontier (what `level` reports and the figures show) is the highest level drawn from.
Online difficulty filtering (arXiv 2504.03380) keeps questions in a band of solve rates; this
keeps whole levels in proportion to the signal they give, which a 135M model's easy levels
keep long after a step rule would have left them (docs/experiment.md, 'Recipe lab').

Pure and deterministic: the state is a plain JSON-serialisable dict (it goes into the
checkpoint) and the same observations always give the same levels. No ReasoningGYM import.

Departure from the SAPO paper: the paper trains on fixed ReasoningGYM settings; it does not
describe a curriculum.
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

STATE_VERSION = 1
BAND_STATE_VERSION = 2
RULES = ("step", "band")
BAND_PROBE = 0.05  # the weight of a level whose groups lately had no spread: probed, not trained on
BAND_UNKNOWN = 0.5  # the weight of a level with fewer than BAND_MIN_GROUPS groups seen
BAND_MIN_GROUPS = 4


@dataclass(frozen=True)
class LevelChange:
    """One move of one dataset, for the event log."""

    dataset: str
    old_level: str
    new_level: str
    accuracy: float  # rolling accuracy that triggered the move
    raised: bool  # True: harder now; False: fell back

    def __str__(self) -> str:
        """What the node's log says, e.g. "basic_arithmetic easy -> medium (solved 0.61 of the
        recent completions)"."""
        why = "solved" if self.raised else "only solved"
        return (
            f"{self.dataset} {self.old_level} -> {self.new_level} ({why} {self.accuracy:.2f} of the recent completions)"
        )


class Curriculum:
    """Levels per dataset; `observe` feeds results, `level` says where each dataset is."""

    def __init__(
        self,
        levels: Mapping[str, Sequence[str]],
        floor: Mapping[str, str],
        *,
        window: int = 64,
        raise_at: float = 0.5,
        lower_at: float = 0.02,
        enabled: bool = True,
        rule: str = "step",
    ) -> None:
        """`levels`: dataset -> its level names, easiest first; `floor`: dataset -> the level
        it starts at and never goes below (missing: the easiest)."""
        if rule not in RULES:
            raise ValueError(f"curriculum rule {rule!r} is not one of {', '.join(RULES)}")
        if window < 1:
            raise ValueError("curriculum window must be at least 1")
        if not 0 <= lower_at < raise_at <= 1:
            raise ValueError(f"need 0 <= lower_at < raise_at <= 1, got {lower_at} and {raise_at}")
        self.level_names = {name: tuple(names) for name, names in levels.items()}
        self.floor: dict[str, int] = {}
        for name, names in self.level_names.items():
            if not names or len(set(names)) != len(names):
                raise ValueError(f"dataset {name} needs distinct level names, got {names}")
            start = floor.get(name, names[0])
            if start not in names:
                raise ValueError(f"{name} has no level {start!r}; it has {', '.join(names)}")
            self.floor[name] = names.index(start)
        self.window = window
        self.raise_at = raise_at
        self.lower_at = lower_at
        self.enabled = enabled
        self.rule = rule
        self._level = dict(self.floor)
        self._results: dict[str, list[int]] = {name: [] for name in self.level_names}
        # band: per dataset and level, the last `window` results and the last groups' spread (1/0)
        self._solved: dict[str, list[list[int]]] = {n: [[] for _ in v] for n, v in self.level_names.items()}
        self._spread: dict[str, list[list[int]]] = {n: [[] for _ in v] for n, v in self.level_names.items()}

    @property
    def group_window(self) -> int:
        """Groups whose spread a band level's weight averages over."""
        return max(BAND_MIN_GROUPS, self.window // 4)

    def level(self, dataset: str) -> int:
        """Index of the dataset's current level in its `level_names` (band: the frontier, the
        highest level it draws from)."""
        if self.rule == "band" and self.enabled:
            return max(self.band_weights(dataset))
        return self._level[dataset]

    def band_weights(self, dataset: str) -> dict[int, float]:
        """Band rule: level index -> its weight, for the levels questions are drawn from."""
        solved, spread = self._solved[dataset], self._spread[dataset]
        top = len(self.level_names[dataset]) - 1
        floor = self.floor[dataset]
        unlocked = floor
        for lv in range(floor, top + 1):
            if len(solved[lv]) >= self.window and sum(solved[lv]) / len(solved[lv]) >= self.raise_at:
                unlocked = lv + 1
        out = {}
        for lv in range(floor, min(unlocked, top) + 1):
            s = spread[lv]
            out[lv] = BAND_UNKNOWN if len(s) < BAND_MIN_GROUPS else max(BAND_PROBE, sum(s) / len(s))
        return out

    def choose_level(self, dataset: str, rng: random.Random) -> int:
        """The level of the next question of `dataset` (step: the current level, drawing nothing
        from `rng`, so the question stream is what it always was)."""
        if self.rule != "band" or not self.enabled:
            return self._level[dataset]
        weights = self.band_weights(dataset)
        if len(weights) == 1:
            return next(iter(weights))
        return rng.choices(list(weights), weights=list(weights.values()))[0]

    def level_name(self, dataset: str) -> str:
        return self.level_names[dataset][self._level[dataset]]

    def accuracy(self, dataset: str) -> float | None:
        """Rolling accuracy at the current level; None before the first result."""
        r = self._results[dataset]
        return sum(r) / len(r) if r else None

    def observe(
        self, dataset: str, level: int, solved: Sequence[bool], spread: bool | None = None
    ) -> LevelChange | None:
        """Record our own completions' results on a question of `dataset` at `level` (`spread`:
        the group's rewards differ; by default, some but not all were solved).

        Step: results at another level than the current one (questions sampled before a change)
        are ignored. Band: every level keeps its own; a change of the frontier is returned.
        Disabled, it keeps the rolling accuracy but never moves. Returns the change this
        caused, if any.
        """
        if dataset not in self._level:
            raise KeyError(f"unknown dataset {dataset!r}")
        if self.rule == "band":
            return self._observe_band(dataset, level, solved, spread)
        if level != self._level[dataset]:
            return None
        results = self._results[dataset]
        results.extend(1 if s else 0 for s in solved)
        del results[: max(0, len(results) - self.window)]
        if len(results) < self.window or not self.enabled:
            return None
        acc = sum(results) / len(results)
        old = self._level[dataset]
        if acc >= self.raise_at and old + 1 < len(self.level_names[dataset]):
            new = old + 1
        elif acc <= self.lower_at and old > self.floor[dataset]:
            new = old - 1
        else:
            return None
        self._level[dataset] = new
        results.clear()
        names = self.level_names[dataset]
        return LevelChange(dataset, names[old], names[new], acc, raised=new > old)

    def _observe_band(
        self, dataset: str, level: int, solved: Sequence[bool], spread: bool | None
    ) -> LevelChange | None:
        if not 0 <= level < len(self.level_names[dataset]):
            return None
        before = self.level(dataset)
        results = self._solved[dataset][level]
        results.extend(1 if s else 0 for s in solved)
        del results[: max(0, len(results) - self.window)]
        if spread is None:
            spread = 0 < sum(1 for s in solved if s) < len(solved)
        groups = self._spread[dataset][level]
        groups.append(1 if spread else 0)
        del groups[: max(0, len(groups) - self.group_window)]
        # the accuracy `accuracy()` reports: the frontier's
        self._level[dataset] = after = self.level(dataset)
        self._results[dataset] = list(self._solved[dataset][after])
        if after == before:
            return None
        names = self.level_names[dataset]
        window = self._solved[dataset][max(before, after) - 1]  # the level whose accuracy (un)locked the next
        acc = sum(window) / len(window) if window else 0.0
        return LevelChange(dataset, names[before], names[after], acc, raised=after > before)

    # --- checkpoint state ------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        """Plain JSON data: each dataset's level by name and its current window (band: every
        level's windows too, by level name)."""
        if self.rule == "band":
            return {
                "version": BAND_STATE_VERSION,
                "levels": {name: self.level_name(name) for name in self.level_names},
                "results": {name: list(r) for name, r in self._results.items()},
                "band": {
                    name: {
                        lv: {"solved": list(self._solved[name][i]), "spread": list(self._spread[name][i])}
                        for i, lv in enumerate(names)
                    }
                    for name, names in self.level_names.items()
                },
            }
        return {
            "version": STATE_VERSION,
            "levels": {name: self.level_name(name) for name in self.level_names},
            "results": {name: list(r) for name, r in self._results.items()},
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore a saved state. Datasets it does not name keep their start; a saved level
        below today's floor (the user raised the difficulty since) is lifted to the floor."""
        if not isinstance(state, Mapping) or state.get("version") not in (STATE_VERSION, BAND_STATE_VERSION):
            raise ValueError(f"not a curriculum state of version {STATE_VERSION}: {state!r:.200}")
        band = state.get("band", {})
        if not isinstance(band, Mapping):
            raise ValueError("curriculum state: 'band' is not a table")
        for name, names in self.level_names.items():  # a step state leaves every band window empty
            saved = band.get(name, {})
            for i, lv in enumerate(names):
                entry = saved.get(lv, {}) if isinstance(saved, Mapping) else {}
                entry = entry if isinstance(entry, Mapping) else {}
                self._solved[name][i] = [1 if x else 0 for x in entry.get("solved", [])][-self.window :]
                self._spread[name][i] = [1 if x else 0 for x in entry.get("spread", [])][-self.group_window :]
        levels, results = state.get("levels"), state.get("results", {})
        if not isinstance(levels, Mapping) or not isinstance(results, Mapping):
            raise ValueError("curriculum state needs a 'levels' and a 'results' table")
        for name, names in self.level_names.items():
            if name not in levels:
                continue
            if levels[name] not in names:
                raise ValueError(f"curriculum state: {name} has no level {levels[name]!r}")
            saved = results.get(name, [])
            if not isinstance(saved, list):
                raise ValueError(f"curriculum state: results of {name} are not a list")
            level = names.index(levels[name])
            window = [1 if r else 0 for r in saved][-self.window :]
            if level < self.floor[name]:
                level, window = self.floor[name], []
            self._level[name] = level
            self._results[name] = window
