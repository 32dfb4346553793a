"""Holding native compute at once: the sampler's child process, and whether the round waits on it.

A pause takes effect at the round's next checkpoint, but the round thread can be inside one
long call into llama.cpp (decoding a prompt of a few hundred tokens takes seconds on a busy
machine, more for larger models) that has none. llama.cpp runs in a child process of the
node (sampler/guard.py starts it as `python -m sapo_core.sampler.<engine>`), so the node can
suspend that child the moment a pause is asked (SIGSTOP, or NtSuspendProcess on Windows,
through psutil) and resume it when the pause ends. The swarm's p2p daemon is a child too and
is never touched: peers must keep reaching a paused node.

`thread_cpu_seconds` lets the controller see that the round thread has stopped using CPU
(it waits on the suspended child), so it can report the node paused without a checkpoint.
"""

from __future__ import annotations

import psutil

SAMPLER_MODULE_PREFIX = "sapo_core.sampler."


def sampler_processes() -> list[psutil.Process]:
    """This process's children that run a sampler engine (never the p2p daemon)."""
    out = []
    for child in psutil.Process().children():
        try:
            cmd = child.cmdline()
        except psutil.Error:
            continue
        module = cmd[cmd.index("-m") + 1] if "-m" in cmd[:-1] else ""
        if module.startswith(SAMPLER_MODULE_PREFIX):
            out.append(child)
    return out


def hold_sampler(suspend: bool) -> None:
    """Suspend (True) or resume (False) every sampler child."""
    for proc in sampler_processes():
        try:
            proc.suspend() if suspend else proc.resume()
        except psutil.NoSuchProcess:
            continue


def thread_cpu_seconds(native_id: int) -> float | None:
    """User + system CPU time of one thread of this process, None where the OS does not say."""
    try:
        for t in psutil.Process().threads():
            if t.id == native_id:
                return t.user_time + t.system_time
    except (psutil.Error, NotImplementedError):
        return None
    return None


__all__ = ["hold_sampler", "sampler_processes", "thread_cpu_seconds", "SAMPLER_MODULE_PREFIX"]
