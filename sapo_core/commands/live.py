"""The terminal display of a running node: a client of the node process, like the desktop app.

`run_with_display` starts the node through `NodeClient` and draws its events: a progress
bar for the phase of the current round, a line per round, state changes with their
reasons, log lines and errors; on a first start, the model's download every few seconds. Where
the node chose its model by the formula's round time (no probe of this machine: it errs long, ~20x
on the embedded model), the pace its first rounds measured, once.
Ctrl-C asks the node to stop (the round in progress, or the download, is abandoned and reruns
on the next start); a second Ctrl-C kills it (it resumes from its last checkpoint). A crash
prints its reason and the node's last lines of stderr, and exits 1.

Imports no torch: the node process does the work.
"""

from __future__ import annotations

import signal
import sys
import threading
import time
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

from sapo_core.config import NodeConfig
from sapo_core.control import protocol as P
from sapo_core.control import vocabulary as K
from sapo_core.control.client import NodeClient, NodeStartError
from sapo_core.downloads import DownloadLines
from sapo_core.estimates import FORMULA_BASIS

PACE_ROUNDS = 3  # rounds of this run whose median round time the pace line quotes

STATE_STYLE = {
    P.PAUSED: "yellow",
    P.SNOOZED: "yellow",
    P.PAUSING: "yellow",
    P.STOPPING: "dim",
    P.CRASHED: "bold red",
    P.RUNNING: "green",
    P.STOPPED: "dim",
    P.STARTING: "dim",
}


def round_summary(r: int, m: dict[str, float]) -> str:
    parts = [
        f"round {r:>4}",
        f"reward {m.get(K.REWARD_MEAN, 0):.3f}",
        f"acc {m.get(K.ACCURACY_MEAN, 0):.2f}",
        f"groups {int(m.get(K.GROUPS_LOCAL, 0))}+{int(m.get(K.GROUPS_EXTERNAL, 0))} ext",
        f"trained {int(m.get(K.GROUPS_TRAINED, 0))}",
        f"sample {m.get(K.SAMPLER_TOK_PER_S, 0):.0f} tok/s",
        f"loss {m.get(K.LOSS_POLICY, 0):+.4f}",
    ]
    if K.SAMPLER_LOGPROB_DRIFT in m:
        parts.append(f"drift {m[K.SAMPLER_LOGPROB_DRIFT]:.3f}")
    if K.SWARM_PEERS in m:
        parts.append(f"peers {int(m[K.SWARM_PEERS])}")
    if K.EVAL_SOLVE_RATE in m:  # a held-out evaluation ran in this round
        parts.append(
            f"held-out {m[K.EVAL_SOLVE_RATE]:.3f}"
            + (f" (base {m[K.EVAL_SOLVE_RATE_BASE]:.3f})" if K.EVAL_SOLVE_RATE_BASE in m else "")
        )
    parts.append(f"{m.get(K.TIME_ROUND, 0):.0f} s")
    return "  ".join(parts)


class EventDisplay:
    """Draws node events on a rich console (called on the client's event thread)."""

    def __init__(self, console: Console, bar: Progress | None) -> None:
        self.console, self.bar = console, bar
        self.task = bar.add_task("starting", total=None) if bar else None
        self.started = time.monotonic()
        self.last_error = ""
        self.download_lines = DownloadLines()
        self.estimated = False  # the node's model line quoted the formula's round time
        self.round_seconds: list[float] = []

    def __call__(self, ev: P.Message) -> None:
        c = self.console
        if isinstance(ev, P.Progress):
            if ev.phase == K.DOWNLOAD:
                self._download(ev)
            elif self.bar is not None and self.task is not None:
                self.bar.update(
                    self.task,
                    description=K.PHASE_WORDS.get(ev.phase, ev.phase),
                    completed=ev.done,
                    total=ev.total or None,
                )
        elif isinstance(ev, P.RoundDone):
            c.print(round_summary(ev.round, ev.metrics))
            self._pace(ev.metrics)
        elif isinstance(ev, P.NodeInfo):
            c.print(
                f"ready in {time.monotonic() - self.started:.0f} s: model {ev.model_id}, sampler {ev.sampler}, "
                f"next round {ev.next_round}"
            )
            if ev.peer_id:
                c.print(
                    f"swarm: this node is {ev.node_name or ev.peer_id}; others join with "
                    f"--initial-peers {ev.join_address or ' '.join(ev.visible_maddrs)}"
                )
        elif isinstance(ev, P.State):
            self._state(ev)
        elif isinstance(ev, P.Log):
            # the node sends what its level lets through (SAPO_LOG_LEVEL, which it inherits from us)
            self.estimated |= ev.message.startswith("model:") and FORMULA_BASIS in ev.message
            style = {"error": "red", "warning": "yellow"}.get(ev.level, "dim")
            c.print(f"[{style}]{ev.level}: {escape(ev.message)}[/]")
        elif isinstance(ev, P.Error):
            self.last_error = ev.message
            c.print(f"[red]error: {escape(ev.message)}[/]")
            if ev.traceback and ev.kind == P.CRASH:
                print(ev.traceback, file=sys.stderr)

    def _pace(self, m: dict[str, float]) -> None:
        """After PACE_ROUNDS rounds, once, where the start quoted the formula: what they measured."""
        seconds = m.get(K.TIME_ROUND, 0.0)
        if not self.estimated or seconds <= 0 or len(self.round_seconds) >= PACE_ROUNDS:
            return
        self.round_seconds.append(seconds)
        if len(self.round_seconds) == PACE_ROUNDS:
            median = sorted(self.round_seconds)[PACE_ROUNDS // 2]
            self.console.print(
                f"measured here: a round ~{median:.0f} s (the median of this run's first {PACE_ROUNDS}), "
                f"~{3600 / median:.0f} an hour; the round time quoted at the start was the formula's estimate "
                "(`sapo-node hardware --probe` measures this machine for it)"
            )

    def _download(self, ev: P.Progress) -> None:
        """A model download on the first start: a line every few seconds or 10 % (DownloadLines),
        and the bar in MB."""
        line = self.download_lines.line(ev.done, ev.total, ev.info)
        if line is not None:
            self.console.print(f"[{'yellow' if ev.info.get('failed') else 'dim'}]{escape(line)}[/]")
        if self.bar is not None and self.task is not None:
            self.bar.update(
                self.task, description="download", completed=ev.done // 10**6, total=(ev.total // 10**6) or None
            )

    def _state(self, ev: P.State) -> None:
        if ev.state == P.RUNNING and not ev.reason:
            return  # the normal case: the round lines say it
        if ev.state in (P.STARTING, P.STOPPING):
            self.console.print(f"[dim]{escape(ev.reason if ev.state == P.STARTING else 'stopping')}…[/]")
            return
        if ev.state == P.CRASHED and ev.reason == self.last_error:
            return  # the error line said it
        text = f"{ev.state}" + (f": {ev.reason}" if ev.reason else "")
        self.console.print(f"[{STATE_STYLE.get(ev.state, 'default')}]{escape(text)}[/]")


def run_with_display(cfg: NodeConfig, rounds: int = 0, quiet: bool = False, env: dict[str, str] | None = None) -> int:
    console = Console(stderr=False, highlight=False)
    interactive = console.is_terminal and not quiet
    bar = (
        Progress(
            TextColumn("{task.description:>10}"),
            BarColumn(),
            TextColumn("{task.completed}/{task.total}"),
            TimeElapsedColumn(),
            console=console,
            transient=True,
        )
        if interactive
        else None
    )
    display = EventDisplay(console, bar)
    client = NodeClient(on_event=display, env=env)
    interrupts = 0

    def on_interrupt(*_: Any) -> None:
        nonlocal interrupts
        interrupts += 1
        if interrupts == 1:
            console.print(
                "[yellow]stopping: the round in progress runs again on the next start (Ctrl-C again to kill)[/]"
            )
            threading.Thread(target=client.stop, name="stop-node", daemon=True).start()
        else:
            client.kill()

    old = signal.signal(signal.SIGINT, on_interrupt)
    try:
        if bar:
            bar.start()
        console.print(f"[bold]SAPO Swarm node[/] — run dir {cfg.run_dir}")
        try:
            client.start(cfg, rounds=rounds)
        except NodeStartError as e:
            console.print(f"[red]error: {escape(str(e))}[/]")
            return 1
        for _ in client.events(timeout=0.5):
            pass  # the display draws them as they arrive
    finally:
        if bar:
            bar.stop()
        if client.alive:
            client.stop()
        signal.signal(signal.SIGINT, old)
    if client.exited is not None and client.exited.clean:
        return 0
    crash = client.crash
    if crash is not None:
        tail = [ln for ln in crash.stderr_tail if ln.strip()][-15:]
        if tail and crash.last_error == "":
            print("last output of the node:\n  " + "\n  ".join(tail), file=sys.stderr)
    return 2 if client.exited is not None and client.exited.returncode == P.EXIT_CONFIG else 1


__all__ = ["run_with_display", "round_summary", "EventDisplay"]
