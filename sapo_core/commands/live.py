"""The terminal display of a running node: the phase of the current round and a line per round."""

from __future__ import annotations

import signal
import sys
import time
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

from sapo_core.config import NodeConfig
from sapo_core.hooks import Interrupted

PHASES = {"sample": "sampling", "score": "scoring", "share": "sharing", "gather": "gathering",
          "update": "training", "save": "saving"}


def round_summary(r: int, m: dict[str, float]) -> str:
    parts = [
        f"round {r:>4}",
        f"reward {m.get('reward/mean', 0):.3f}",
        f"acc {m.get('accuracy/mean', 0):.2f}",
        f"groups {int(m.get('groups/local', 0))}+{int(m.get('groups/external', 0))} ext",
        f"trained {int(m.get('groups/trained', 0))}",
        f"sample {m.get('sampler/tok_per_s', 0):.0f} tok/s",
        f"loss {m.get('loss/policy', 0):+.4f}",
    ]
    if "sampler/logprob_drift" in m:
        parts.append(f"drift {m['sampler/logprob_drift']:.3f}")
    if "swarm/peers" in m:
        parts.append(f"peers {int(m['swarm/peers'])}")
    parts.append(f"{m.get('time/round', 0):.0f} s")
    return "  ".join(parts)


class ConsoleHooks:
    """Round hooks that draw a progress bar and honour Ctrl-C between two hot-loop steps."""

    def __init__(self, console: Console, progress: Progress | None) -> None:
        self.console, self.bar = console, progress
        self.task = progress.add_task("starting", total=None) if progress else None
        self.stop_requested = False

    def checkpoint(self) -> None:
        if self.stop_requested:
            raise Interrupted("stop requested")

    def progress(self, phase: str, done: int, total: int, **info: Any) -> None:
        if self.bar is not None and self.task is not None:
            self.bar.update(self.task, description=PHASES.get(phase, phase), completed=done, total=total or None)

    def log(self, level: str, message: str) -> None:
        style = {"error": "red", "warning": "yellow"}.get(level, "dim")
        self.console.print(f"[{style}]{level}: {message}[/]")


def run_with_display(cfg: NodeConfig, rounds: int = 0, quiet: bool = False) -> int:
    from sapo_core.node import Node

    console = Console(stderr=False, highlight=False)
    interactive = console.is_terminal and not quiet
    progress = Progress(TextColumn("{task.description:>10}"), BarColumn(), TextColumn("{task.completed}/{task.total}"),
                        TimeElapsedColumn(), console=console, transient=True) if interactive else None
    hooks = ConsoleHooks(console, progress)
    old = signal.signal(signal.SIGINT, lambda *_: setattr(hooks, "stop_requested", True))
    node = Node(cfg, hooks)
    done = 0
    try:
        if progress:
            progress.start()
        console.print(f"[bold]SAPO Swarm node[/] — run dir {node.run_dir}")
        t = time.time()
        node.setup()
        console.print(f"ready in {time.time() - t:.0f} s: model {node.policy.model_id}, sampler {node.sampler_name}, "
                      f"next round {node.next_round}")
        while not hooks.stop_requested:
            if rounds and done >= rounds:
                break
            if cfg.round.max_rounds and node.next_round > cfg.round.max_rounds:
                console.print(f"reached round.max_rounds = {cfg.round.max_rounds}")
                break
            r = node.next_round
            try:
                m = node.run_round()
            except Interrupted:
                console.print(f"stopped during round {r}; it will run again on the next start")
                break
            console.print(round_summary(r, m))
            done += 1
        return 0
    except Exception as e:  # the user gets a readable line, the trace goes to stderr
        import traceback

        traceback.print_exc(file=sys.stderr)
        console.print(f"[red]error: {e}[/]")
        return 1
    finally:
        if progress:
            progress.stop()
        node.close()
        signal.signal(signal.SIGINT, old)
