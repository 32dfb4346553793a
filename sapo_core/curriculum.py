"""Per-dataset difficulty levels that follow the model's accuracy.

A small model learns nothing from questions it never solves and little from questions it
always solves (GRPO's advantage is zero when all rewards in a group are equal). So each
dataset sits on one of its difficulty levels (see `tasks.LEVELS`); the curriculum keeps the
last `window` results of our *own* completions at that level and

- raises the level when the rolling accuracy reaches `raise_at`,
- lowers it when the rolling accuracy falls to `lower_at` or below ("collapse"),

never below the level the user started from (`floor`) nor above the hardest. A decision
needs a full window of results at the current level, and a change clears the window, so
every level is judged on its own results only. "Accuracy" is the share of completions with
full credit (reward 1); ReasoningGYM's partial credits do not count.

Pure and deterministic: the state is a plain JSON-serialisable dict (it goes into the
checkpoint) and the same observations always give the same levels. No ReasoningGYM import.

Departure from the SAPO paper: the paper trains on fixed ReasoningGYM settings; it does not
describe a curriculum.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

STATE_VERSION = 1


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
    ) -> None:
        """`levels`: dataset -> its level names, easiest first; `floor`: dataset -> the level
        it starts at and never goes below (missing: the easiest)."""
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
        self._level = dict(self.floor)
        self._results: dict[str, list[int]] = {name: [] for name in self.level_names}

    def level(self, dataset: str) -> int:
        """Index of the dataset's current level in its `level_names`."""
        return self._level[dataset]

    def level_name(self, dataset: str) -> str:
        return self.level_names[dataset][self._level[dataset]]

    def accuracy(self, dataset: str) -> float | None:
        """Rolling accuracy at the current level; None before the first result."""
        r = self._results[dataset]
        return sum(r) / len(r) if r else None

    def observe(self, dataset: str, level: int, solved: Sequence[bool]) -> LevelChange | None:
        """Record our own completions' results on a question of `dataset` at `level`.

        Results at another level than the current one (questions sampled before a change)
        are ignored. Disabled, it keeps the rolling accuracy but never moves. Returns the
        change this caused, if any.
        """
        if dataset not in self._level:
            raise KeyError(f"unknown dataset {dataset!r}")
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

    # --- checkpoint state ------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        """Plain JSON data: each dataset's level by name and its current window."""
        return {
            "version": STATE_VERSION,
            "levels": {name: self.level_name(name) for name in self.level_names},
            "results": {name: list(r) for name, r in self._results.items()},
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore a saved state. Datasets it does not name keep their start; a saved level
        below today's floor (the user raised the difficulty since) is lifted to the floor."""
        if not isinstance(state, Mapping) or state.get("version") != STATE_VERSION:
            raise ValueError(f"not a curriculum state of version {STATE_VERSION}: {state!r:.200}")
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
