"""What the volunteer gave and what came back, read from the run store.

`sapo-node stats`, the model card written on export and the app's contribution card show these:
totals over the run and over today and this week (rounds, CPU-hours, completions, groups trained
from our own questions and from peers', groups published), the rounds' running intervals for the
clock-axis plot, peers' receipts (how often our groups were trained on, by how many peers), and
the newest held-out evaluation against the base model. Only the figures summed are read, by
SQLite (`RunStore.spans`): the app reads the totals after every round.
"""

from __future__ import annotations

import datetime as dt
import time
from collections.abc import Iterable
from dataclasses import dataclass

from sapo_core.control import vocabulary as K
from sapo_core.store import RunStore


def start_of_today(now: float | None = None) -> float:
    d = dt.datetime.fromtimestamp(time.time() if now is None else now).date()
    return dt.datetime.combine(d, dt.time()).timestamp()


def start_of_week(now: float | None = None) -> float:
    """Midnight (local time) at the start of the last 7 days, today included (calendar days: a
    daylight-saving change makes the week an hour shorter or longer)."""
    d = dt.datetime.fromtimestamp(time.time() if now is None else now).date() - dt.timedelta(days=6)
    return dt.datetime.combine(d, dt.time()).timestamp()


TOTALS_KEYS = (
    K.CPU_SECONDS,
    K.GROUPS_EXTERNAL,
    K.GROUPS_LOCAL,
    K.ROUND_GROUP_SIZE,
    K.TOKENS_SAMPLED,
    K.GROUPS_TRAINED,
    K.SWARM_PUBLISHED,
    K.SWARM_PEERS,
    K.SWARM_ADOPT_GUIDED,
)


def contribution_totals(store: RunStore, until_round: int | None = None, now: float | None = None) -> dict[str, float]:
    """Totals over the run: rounds, CPU-hours, completions sampled, groups trained (own / peers'; of
    the peers', how many a peer's right answer guided where all of ours were wrong), groups
    published, peers, and time spent in rounds today and this week (pauses excluded)."""
    today, week = start_of_today(now), start_of_week(now)
    t: dict[str, float] = dict.fromkeys(
        (
            "rounds",
            "cpu_hours",
            "completions",
            "tokens",
            "groups_own",
            "groups_peers",
            "groups_published",
            "peer_guided",
            "peers_max",
            "seconds_today",
            "seconds_week",
            "cpu_hours_today",
            "cpu_hours_week",
            "rounds_today",
            "rounds_week",
        ),
        0.0,
    )
    first, last = None, None
    # only the figures summed are read (SQLite's json_extract), not every row's whole JSON
    for started, ended, f in store.spans(0.0, TOTALS_KEYS, until_round):
        cpu_s, ext, local, group_size, tokens, trained, published, peers, guided = f
        first = started if first is None else first
        last = ended
        cpu_h = cpu_s / 3600
        t["rounds"] += 1
        t["cpu_hours"] += cpu_h
        t["completions"] += local * group_size
        t["tokens"] += tokens
        t["groups_own"] += max(0.0, trained - ext)
        t["groups_peers"] += ext
        t["groups_published"] += published
        t["peer_guided"] += guided  # swarm.take = mixed: all of ours wrong, a peer's right answer guided
        t["peers_max"] = max(t["peers_max"], peers)
        secs = max(0.0, ended - started)
        for since, suffix in ((today, "today"), (week, "week")):
            if ended >= since:
                t[f"seconds_{suffix}"] += min(secs, ended - since)
                t[f"cpu_hours_{suffix}"] += cpu_h
                t[f"rounds_{suffix}"] += 1
    t["first_started"] = first or 0.0
    t["last_ended"] = last or 0.0
    return t


def from_peers_words(totals: dict[str, float]) -> str:
    """What peers' groups did for this model, in words (`stats`, the model card, the app's card)."""
    n, guided = totals["groups_peers"], totals["peer_guided"]
    if not n:
        return "no peer's group trained here yet"
    words = f"{n:,.0f} peers' groups trained here"
    if guided:
        q = "question" if guided == 1 else "questions"
        words += f"; on {guided:,.0f} {q} none of this model's answers was right and a peer's right one guided it"
    return words


def daily_activity(store: RunStore, days: int = 7, now: float | None = None) -> list[tuple[float, float, float]]:
    """(start, end, cpu seconds) of each round in the last `days` days, for bars on a clock axis:
    the gaps between them are the pauses."""
    since = start_of_today(now) - (days - 1) * 86400
    return [(s, e, f[0]) for s, e, f in store.spans(since, (K.CPU_SECONDS,))]


def receipt_totals(store: RunStore, since: float = 0.0, ignored: Iterable[str] = ()) -> dict[str, int]:
    """How often our groups were trained on, by how many peers, since `since`: receipts from
    `ignored` peers do not count (the source drops them already; a peer ignored later is
    dropped here too)."""
    skip = set(ignored)
    kept = [r for r in store.receipts(since) if r[0] not in skip]
    return {"receipts": len(kept), "peers": len({r[0] for r in kept}), "groups": len({(r[1], r[2]) for r in kept})}


@dataclass(frozen=True)
class HeldOutSummary:
    """Held-out solve rate at the start (the base model) and now, from the `eval/*` figures."""

    base: float
    now: float
    round: int
    gain: float
    ci_low: float | None
    ci_high: float | None

    @property
    def ci_half_width(self) -> float | None:
        if self.ci_low is None or self.ci_high is None:
            return None
        return (self.ci_high - self.ci_low) / 2

    def sentence(self) -> str:
        ci = f", ±{self.ci_half_width:.2f}" if self.ci_half_width is not None else ""
        return f"held-out: {self.base:.2f} at start -> {self.now:.2f} now ({self.gain:+.2f}{ci})"


def held_out_summary(store: RunStore, until_round: int | None = None) -> HeldOutSummary | None:
    """The newest evaluation against the base model, or None when no evaluation has run."""
    rounds, rates = store.series(K.EVAL_SOLVE_RATE)
    pairs = [(r, v) for r, v in zip(rounds, rates) if until_round is None or r <= until_round]
    if not pairs:
        return None
    r, now = pairs[-1]
    m = next(row.metrics for row in store.rounds(since=r - 1, limit=1))
    base_rounds, bases = store.series(K.EVAL_SOLVE_RATE_BASE)
    base = m.get(K.EVAL_SOLVE_RATE_BASE, bases[0] if bases else pairs[0][1])
    return HeldOutSummary(
        base=base,
        now=now,
        round=r,
        gain=m.get(K.EVAL_GAIN, now - base),
        ci_low=m.get(K.EVAL_GAIN_CI_LOW),
        ci_high=m.get(K.EVAL_GAIN_CI_HIGH),
    )


__all__ = [
    "contribution_totals",
    "daily_activity",
    "receipt_totals",
    "held_out_summary",
    "HeldOutSummary",
    "start_of_today",
    "start_of_week",
    "TOTALS_KEYS",
]
