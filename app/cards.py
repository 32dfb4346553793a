"""The dashboard's headline: is the model getting better (held-out), and what did I give.

- Held-out card: "held-out: 0.10 at start -> 0.27 now (+0.17, ±0.07)" from the `eval/*`
  figures (`sapo_core/evaluation.py`), "no evaluation yet" before the first one: the start level's
  questions (the figure every earlier result compares with); below it, where measured, every
  level's ("capability": easy to hard alike). Training reward is not a measure of progress (it
  moves with the draw of questions and the curriculum).
- Contribution card: CPU-hours, rounds and time running today, and the peers' receipts
  ("your groups were trained on N times by M peers this week"): the same figures as
  `sapo-node stats`, computed from the run store on a thread after each round.
"""

from __future__ import annotations

import math
import threading
import time
from pathlib import Path

from PySide6.QtCore import QObject, Qt, Signal
from PySide6.QtWidgets import QFrame, QHBoxLayout, QLabel, QSizePolicy, QVBoxLayout, QWidget

from app.models import RoundHistory
from sapo_core.contributions import HeldOutSummary, from_peers_words
from sapo_core.control import vocabulary as K


def held_out(history: RoundHistory) -> HeldOutSummary | None:
    """The newest evaluation in the history, as the run store's `held_out_summary` reads it."""
    if K.EVAL_SOLVE_RATE not in history.series:
        return None
    rounds, rates = history.get(K.EVAL_SOLVE_RATE)
    now = float(rates[-1])
    base = history.last(K.EVAL_SOLVE_RATE_BASE, float(rates[0]))
    gain = history.last(K.EVAL_GAIN, now - base)
    low, high = history.last(K.EVAL_GAIN_CI_LOW), history.last(K.EVAL_GAIN_CI_HIGH)
    return HeldOutSummary(
        base=base,
        now=now,
        round=int(rounds[-1]),
        gain=gain,
        ci_low=None if math.isnan(low) else low,
        ci_high=None if math.isnan(high) else high,
    )


def held_out_text(history: RoundHistory) -> tuple[str, str]:
    """(headline, detail) of the held-out card."""
    h = held_out(history)
    if h is None:
        return (
            "no evaluation yet",
            "The node scores a fixed set of held-out questions now and then; "
            "the base model's score is the starting point.",
        )
    words = h.sentence().removeprefix("held-out: ")
    if h.ci_low is not None and h.ci_low > 0:
        verdict = "better than the base model (the 95 % interval is above zero)"
    elif h.ci_high is not None and h.ci_high < 0:
        verdict = "worse than the base model so far"
    else:
        verdict = "not yet distinguishable from the base model"
    detail = f"share of held-out questions at the start level solved, round {h.round:,}: {verdict}"
    if K.EVAL_CAPABILITY in history.series:
        now = history.last(K.EVAL_CAPABILITY)
        base = history.last(K.EVAL_CAPABILITY_BASE)
        was = "" if math.isnan(base) else f"{base:.2f} at start -> "
        detail += f"<br>every level, easy to hard (capability): {was}{now:.2f} now"
    return words, detail


def summary_text(history: RoundHistory, window: int, rolling: float | None = None) -> str:
    """The line over the dashboard's plots: rounds, reward (and its rolling mean over `window`
    rounds, unless given), accuracy, the share of groups from peers, sampling speed."""
    h = history
    if not h.rounds:
        return (
            "No rounds yet. The curves fill in as rounds end; "
            "a run's history comes back from its run store when the app restarts."
        )
    if rolling is None:
        _, means = h.rolling(K.REWARD_MEAN, window)
        rolling = float(means[-1]) if len(means) else None
    parts = [
        f"<b>{h.rounds:,} round{'s' * (h.rounds != 1)}</b> (last: {h.last_round:,})",
        f"reward {h.last(K.REWARD_MEAN):.3f}" + (f", rolling mean {rolling:.3f}" if rolling is not None else ""),
        f"accuracy {h.last(K.ACCURACY_MEAN):.2f}",
    ]
    share = h.last(K.GROUPS_EXTERNAL_SHARE)
    if not math.isnan(share):
        parts.append(f"{share:.0%} of groups from peers")
    speed = h.last(K.SAMPLER_TOK_PER_S)
    if not math.isnan(speed):
        parts.append(f"{speed:.0f} tok/s sampling")
    return " · ".join(parts)


def _duration(seconds: float) -> str:
    h, m = divmod(int(round(seconds / 60)), 60)
    return f"{h} h {m:02d} min" if h else f"{m} min"


def contribution_text(stats: dict | None, history: RoundHistory) -> tuple[str, str]:
    """(headline, detail) of the contribution card, from `sapo-node stats`' figures."""
    if not stats:
        cpu_h = history.total(K.CPU_SECONDS) / 3600
        return (f"{cpu_h:.1f} CPU-hours · {history.rounds:,} rounds", "counting…")
    c, rw = stats["contribution"], stats["receipts_week"]
    head = f"{c['cpu_hours']:.1f} CPU-hours · {c['rounds']:,.0f} rounds"
    if stats["receipts_total"]["receipts"]:
        back = f"your groups were trained on {rw['receipts']:,} times by {rw['peers']:,} peers this week"
    elif c["groups_published"]:
        back = f"{c['groups_published']:,.0f} groups shared; no peer has reported training on them yet"
    elif not c["groups_peers"]:
        return head, f"{_running(c)}<br>training alone (nothing shared)"
    else:
        back = "nothing of yours shared yet"
    return head, f"{_running(c)}<br>{back}<br>{from_peers_words(c)}"


def _running(c: dict) -> str:
    return f"running {_duration(c['seconds_today'])} today, {_duration(c['seconds_week'])} this week"


class StatsLoader(QObject):
    """`sapo-node stats`' figures read from the run store on a thread (thousands of rows)."""

    loaded = Signal(object)
    """The figures (dict), or None when the store cannot be read."""

    _done = Signal(object)

    def __init__(self, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self._done.connect(self._on_done, Qt.ConnectionType.QueuedConnection)
        self.busy = False

    def load(self, path: Path) -> None:
        if self.busy:
            return
        self.busy = True
        threading.Thread(target=self._read, args=(path,), name="sapo-read-stats", daemon=True).start()

    def _read(self, path: Path) -> None:
        from sapo_core.commands.stats import gather_stats
        from sapo_core.store import RunStore

        try:
            store = RunStore(path, readonly=True)
            try:
                stats = gather_stats(store, now=time.time())
            finally:
                store.close()
        except Exception:  # the card is optional: it keeps its last figures
            stats = None
        self._done.emit(stats)

    def _on_done(self, stats: dict | None) -> None:
        self.busy = False
        self.loaded.emit(stats)


class SteadyLabel(QWidget):
    """A word-wrapped QLabel whose new text relays out the window only when it needs more or
    fewer lines. QLabel.setText relays out every layout up to the window (QLayout.activate always
    passes the request up), which was half of a dashboard redraw's CPU (`sapo-bench gui`): here
    the label sits in a holder without a layout, so a same-height change stops at the holder."""

    def __init__(self, object_name: str, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.label = QLabel(self, wordWrap=True)
        self.label.setObjectName(object_name)
        policy = QSizePolicy(QSizePolicy.Policy.Preferred, QSizePolicy.Policy.Preferred)
        policy.setHeightForWidth(True)
        self.setSizePolicy(policy)

    def text(self) -> str:
        return self.label.text()

    def setText(self, text: str) -> None:
        if text == self.label.text():
            return
        width = self.width()
        before = self.label.heightForWidth(width)
        self.label.setText(text)
        if not self.isVisible() or width <= 0 or self.label.heightForWidth(width) != before:
            self.updateGeometry()  # another line (or one fewer): the layout around us must know

    def setToolTip(self, tip: str) -> None:
        self.label.setToolTip(tip)

    # the layout asks the holder; the label answers
    def sizeHint(self):  # noqa: N802 (Qt's name)
        return self.label.sizeHint()

    def minimumSizeHint(self):  # noqa: N802
        return self.label.minimumSizeHint()

    def hasHeightForWidth(self) -> bool:  # noqa: N802
        return True

    def heightForWidth(self, width: int) -> int:  # noqa: N802
        return self.label.heightForWidth(width)

    def resizeEvent(self, event) -> None:  # noqa: N802
        self.label.setGeometry(self.rect())
        super().resizeEvent(event)


class Card(QFrame):
    def __init__(self, title: str, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("card")
        self.title = QLabel(title)
        self.title.setObjectName("cardTitle")
        self.value = SteadyLabel("cardValue")
        self.detail = SteadyLabel("cardDetail")
        col = QVBoxLayout(self)
        col.setContentsMargins(10, 6, 10, 6)
        col.setSpacing(2)
        for w in (self.title, self.value, self.detail):
            col.addWidget(w)

    def set_text(self, value: str, detail: str) -> None:
        if (value, detail) == (self.value.text(), self.detail.text()):
            return  # every round calls this: an unchanged card costs no layout
        self.value.setText(value)
        self.detail.setText(detail)
        self.setAccessibleDescription(f"{self.title.text()}: {value}. {detail}")


class HeadlineCards(QWidget):
    def __init__(self, history: RoundHistory, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.history = history
        self.stats: dict | None = None
        self.store_file: Path | None = None
        self.held = Card("Is it getting better? (held-out questions)")
        self.given = Card("What you gave, and what came back")
        self.loader = StatsLoader(self)
        self.loader.loaded.connect(self._on_loader_loaded)
        row = QHBoxLayout(self)
        row.setContentsMargins(0, 0, 0, 0)
        row.addWidget(self.held, 1)
        row.addWidget(self.given, 1)
        self._stats_rounds = -1
        self.refresh()

    def refresh(self) -> None:
        self.held.set_text(*held_out_text(self.history))
        self.given.set_text(*contribution_text(self.stats, self.history))
        if self.store_file is not None and self.history.rounds != self._stats_rounds and self.store_file.is_file():
            self._stats_rounds = self.history.rounds
            self.loader.load(self.store_file)

    def _on_loader_loaded(self, stats: dict | None) -> None:
        if stats is not None:
            self.stats = stats
            self.given.set_text(*contribution_text(self.stats, self.history))


__all__ = ["HeadlineCards", "SteadyLabel", "held_out", "held_out_text", "contribution_text", "StatsLoader"]
