"""The dashboard's plots and curves as one table: which figure each curve draws, how, and in what colour.

A curve id names a line on the dashboard (`reward:raw`, `heldout:trained`) and is never a
figure's key: the figure a curve draws is its `key`, from the round's vocabulary
(sapo_core/control/vocabulary.py). app/dashboard.py builds the plots and curves from these
tables and feeds each curve its figure on every redraw. A new curve of a known kind is a row
here; docs/architecture.md, "Where to change what", says the rest. With them, the two pure
functions that place what is drawn: where the round axis ends, where the curriculum changed.

No Qt: the tests read the tables without a display.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from app.models import RoundHistory
from sapo_core.control import vocabulary as K

# how a curve draws its figure
RAW = "raw"  # the figure of each round as it is (binned by its smallest and largest value per pixel)
ROLLING = "rolling"  # its rolling mean over the dashboard's window
CUMULATIVE = "cumulative"  # its running sum
EVALUATIONS = "evaluations"  # a figure of the held-out evaluation, which runs every N rounds
BAND = "band"  # a band of the time per round (the key is a band of vocabulary.PHASE_BANDS), stacked


@dataclass(frozen=True)
class Plot:
    id: str
    title: str
    y_label: str
    share: bool = False  # y from 0 to 1
    marks_levels: bool = False  # a dotted line where any dataset's curriculum level changed
    peers_only: bool = False  # hidden while the node trains alone


@dataclass(frozen=True)
class Curve:
    id: str
    plot: str
    key: str  # the figure it draws (BAND: the band's name)
    how: str  # RAW, ROLLING, CUMULATIVE, EVALUATIONS or BAND
    label: str  # its name in the legend under the plot's title
    colour: int | str  # an index into the theme's curve colours, or a colour's name in theme.colours()
    width: float = 2.0
    dashed: bool = False
    fill: bool = False  # filled down to 0 (a band) or, without a brush, keeping 0 in the y range
    dots: bool = True  # drawn with dots too while it has few points (a single point has no line)
    fallback: str = ""  # the figure drawn where `key` is missing (a run from before it existed)

    @property
    def peak(self) -> bool:
        """Binned for the screen by each pixel's smallest and largest value, so spikes stay visible
        (a smooth curve by each pixel's mean)."""
        return self.how == RAW


# the plots in reading order
PLOTS: tuple[Plot, ...] = (
    Plot("reward", "Training reward per round", "reward (0 to 1)", marks_levels=True),
    Plot("heldout", "Held-out questions solved", "share solved", share=True, marks_levels=True),
    Plot("accuracy", "Accuracy per task (rolling mean)", "share solved", share=True, marks_levels=True),
    Plot("peers", "Share of groups from peers", "share of groups", share=True, peers_only=True),
    Plot("speed", "Tokens per second (rolling mean)", "tokens / s"),
    Plot("time", "Time per round by phase (rolling mean)", "seconds"),
    Plot("cumulative", "Cumulative training reward", "sum of rewards"),
)

CURVES: tuple[Curve, ...] = (
    Curve("reward:raw", "reward", K.REWARD_MEAN, RAW, "each round", "raw", width=1.0, dots=False),
    Curve("reward:rolling", "reward", K.REWARD_MEAN, ROLLING, "rolling mean", 0, width=2.5),
    Curve("heldout:trained", "heldout", K.EVAL_SOLVE_RATE, EVALUATIONS, "trained model", 2, width=2.5),
    Curve("heldout:base", "heldout", K.EVAL_SOLVE_RATE_BASE, EVALUATIONS, "base model", "muted", 1.5, True, dots=False),
    Curve("peers:raw", "peers", K.GROUPS_EXTERNAL_SHARE, RAW, "each round", "raw", width=1.0, dots=False),
    Curve("peers:rolling", "peers", K.GROUPS_EXTERNAL_SHARE, ROLLING, "rolling mean", 2, width=2.5),
    Curve("speed:sampling", "speed", K.SAMPLER_TOK_PER_S, ROLLING, "sampling", 0, fill=True),
    Curve("speed:training", "speed", K.TRAIN_TOK_PER_S, ROLLING, "training", 1, fill=True),
    Curve(
        "cumulative:reward",
        "cumulative",
        K.REWARD_SUM,
        CUMULATIVE,
        "sum of rewards per question",
        1,
        width=2.5,
        fallback=K.REWARD_MEAN,  # runs from before reward/sum
    ),
    # stacked: each band's curve is the running total up to its phases, filled down to 0 and drawn
    # over the ones above it, so the visible part of each fill is those phases' own share
    *(
        Curve(f"time:{band}", "time", band, BAND, band, i, width=1.0, fill=True, dots=False)
        for i, (band, _) in enumerate(K.PHASE_BANDS)
    ),
)


def task_curve(task: str, n: int) -> Curve:
    """The accuracy plot's curve of one task (its rolling mean), the `n`-th of that plot: the
    tasks are those in the history, so their curves are made as they appear."""
    return Curve(f"accuracy:{task}", "accuracy", K.accuracy_of(task), ROLLING, task.replace("_", " "), n)


def axis_end(last_round: float, least: float = 10.0) -> float:
    """Right end of the round axis: the last round plus about 10 %, rounded up to two significant
    digits, so that a new round moves the axis (and makes every axis redraw its ticks) only
    now and then: every round below 20, every 1,000 rounds around 10,000. Also the top of the
    cumulative reward's axis (`least` 1), which grows every round too."""
    target = max(least, last_round * 1.1)
    step = 10.0 ** max(0, math.floor(math.log10(target)) - 1)
    return math.ceil(target / step) * step


def curriculum_changes(history: RoundHistory) -> np.ndarray:
    """Rounds at which any dataset's curriculum level differs from the round before."""
    out = [
        x[1:][np.diff(y) != 0]
        for x, y in (history.get(k) for k in history.series if k.startswith(K.CURRICULUM_PREFIX))
        if len(y) > 1
    ]
    return np.unique(np.concatenate(out)) if out else np.empty(0)


__all__ = [
    "Plot",
    "Curve",
    "PLOTS",
    "CURVES",
    "task_curve",
    "axis_end",
    "curriculum_changes",
    "RAW",
    "ROLLING",
    "CUMULATIVE",
    "EVALUATIONS",
    "BAND",
]
