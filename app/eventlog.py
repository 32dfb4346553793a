"""The event log in words, and node errors as the user reads them (plain Python, no Qt).

`EventLog` keeps what happened, newest last and bounded: states with their reasons, rounds,
commands, the node's own log lines and errors. `readable_error` turns an Error event into a
headline and what to do about it.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass

from app.models import STATE_WORDS
from sapo_core.control import protocol as P
from sapo_core.control import vocabulary as K


@dataclass(frozen=True)
class LogLine:
    t: float
    level: str  # info, warning, error, state, round, command
    text: str

    def format(self) -> str:
        return f"{time.strftime('%H:%M:%S', time.localtime(self.t))}  {self.level:<7}  {self.text}"


class EventLog:
    """What happened, in words: states with reasons, rounds, commands, the node's log and errors."""

    def __init__(self, limit: int = 2000) -> None:
        self.lines: deque[LogLine] = deque(maxlen=limit)

    def add(self, level: str, text: str, t: float | None = None) -> LogLine:
        line = LogLine(time.time() if t is None else t, level, text)
        self.lines.append(line)
        return line

    def from_event(self, ev: P.Message) -> LogLine | None:
        """The line an event deserves, or None (heartbeats, progress)."""
        if isinstance(ev, P.State):
            word = STATE_WORDS.get(ev.state, ev.state)
            return self.add("state", word + (f": {ev.reason}" if ev.reason else ""))
        if isinstance(ev, P.RoundDone):
            m = ev.metrics
            return self.add(
                "round",
                f"round {ev.round} done: reward {m.get(K.REWARD_MEAN, 0):.3f}, "
                f"accuracy {m.get(K.ACCURACY_MEAN, 0):.2f}, "
                f"{int(m.get(K.GROUPS_EXTERNAL, 0))} group(s) from peers, "
                f"{m.get(K.TIME_ROUND, 0):.1f} s",
            )
        if isinstance(ev, P.Log):
            return self.add(ev.level, ev.message, ev.t or None)
        if isinstance(ev, P.Error):
            trace = ev.traceback.rstrip()
            return self.add("error", ev.message + (f"\n{trace}" if trace and ev.kind == P.CRASH else ""))
        if isinstance(ev, P.NodeInfo):
            who = f", swarm identity {ev.node_name or ev.peer_id}" if ev.peer_id else ", training alone"
            return self.add(
                "info", f"node ready: model {ev.model_id}, sampler {ev.sampler}, next round {ev.next_round}{who}"
            )
        if isinstance(ev, P.Exited):
            return self.add("state" if ev.clean else "error", f"node process exited ({ev.reason or ev.returncode})")
        if isinstance(ev, P.Hello):
            return self.add("info", f"node process {ev.pid} started (protocol {ev.protocol}, python {ev.python})")
        return None

    def text(self, last: int | None = None) -> str:
        lines = list(self.lines)[-last:] if last else list(self.lines)
        return "\n".join(x.format() for x in lines)


def readable_error(ev: P.Error) -> tuple[str, str]:
    """(headline, what to do) for a node error, in the user's words."""
    if ev.kind == P.CONFIG:
        return (
            f"The node cannot run with these settings: {ev.message}",
            "Change the setting it names (Settings tab, or Setup again from the menu), then press Start.",
        )
    if ev.kind == P.COMMAND:
        return f"The node refused a command: {ev.message}", "The node goes on as before."
    if ev.fatal:
        return (
            f"The node stopped on an error: {ev.message}",
            "It restarts by itself after a short pause. If it keeps failing, use Copy diagnostics in the "
            "Log tab and report it.",
        )
    return f"The node reported an error: {ev.message}", "The node goes on."


__all__ = ["EventLog", "LogLine", "readable_error"]
