"""CPU time and cores as the node counts them: one place for what psutil reports.

A node is a process tree (the node, its llama.cpp sampler child, hivemind's p2pd daemon), so
what it "used" is the user + system time of the whole tree. The run store bills each round
with it (`cpu/seconds`), the heartbeat reports it, the thread governor subtracts it from the
machine's busy time to see what other programs use, and `sapo-bench control` measures the
throttle by it.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import sys
from pathlib import Path

import psutil


def tree_cpu_seconds(proc: psutil.Process | int | None = None) -> float:
    """User + system CPU seconds of a process (default: this one; a pid or a Process) and all its
    descendants; processes that are gone or hidden are skipped."""
    return tree_usage(proc)[0]


def tree_usage(proc: psutil.Process | int | None = None) -> tuple[float, int]:
    """(CPU seconds, resident bytes) of a process and all its descendants, as `tree_cpu_seconds`."""
    if proc is None:
        proc = psutil.Process()
    elif isinstance(proc, int):
        proc = psutil.Process(proc)
    cpu, rss = 0.0, 0
    for p in [proc, *proc.children(recursive=True)]:
        try:
            t = p.cpu_times()
            cpu, rss = cpu + t.user + t.system, rss + p.memory_info().rss
        except psutil.Error:
            continue
    return cpu, rss


def busy_seconds() -> float:
    """CPU seconds the whole machine has spent busy (all CPUs, everything but idle and iowait;
    Linux counts guest time inside user time already)."""
    t = psutil.cpu_times()
    skip = ("idle", "iowait", "guest", "guest_nice")
    return sum(getattr(t, f) for f in t._fields if f not in skip)


def usable_cpus() -> int:
    """Logical CPUs this process may run on: its affinity mask where the OS has one (a container
    or `taskset` narrows it below what psutil counts), else every logical CPU; at least 1."""
    if hasattr(os, "sched_getaffinity"):
        return max(1, len(os.sched_getaffinity(0)))
    return psutil.cpu_count(logical=True) or 1


def physical_cores() -> int:
    """Physical cores (logical CPUs where psutil cannot tell), capped at the CPUs this process may
    use, at least 1: a node's thread count starts here, and more threads than usable CPUs only
    take turns."""
    return max(1, min(psutil.cpu_count(logical=False) or psutil.cpu_count() or 1, usable_cpus()))


__all__ = ["tree_cpu_seconds", "tree_usage", "busy_seconds", "physical_cores", "usable_cpus"]


def cpu_flags() -> set[str] | None:
    """The CPU's feature flags as Linux lists them in /proc/cpuinfo (`flags` on x86, `Features`
    on Arm), or None where they cannot be read (not Linux)."""
    try:
        text = Path("/proc/cpuinfo").read_text(errors="replace")
    except OSError:
        return None
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() in ("flags", "Features"):
            return set(value.split())
    return None


def trim_heap() -> bool:
    """Hand the C heap's free pages back to the system (glibc's malloc_trim; elsewhere nothing).

    Converting the GGUF and exporting the sampler's copy free hundreds of MB that glibc keeps
    for later, so the node's resident size stays that much above what it uses; the update's
    peak then lands on top (docs/calibration.md, 'Update precision and checkpointed layers')."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        return bool(libc.malloc_trim(0))
    except (OSError, AttributeError):  # not glibc (musl has no malloc_trim)
        return False


MMAP_THRESHOLD = 1 << 20  # bytes: allocations this large get pages of their own, returned on free


def tune_heap() -> bool:
    """Keep large allocations out of glibc's heap: a fixed mmap threshold (1 MiB) instead of
    glibc's dynamic one, which after the first large frees rises to 32 MiB and puts the update's
    tensors on the heap, where rounds of different sizes fragment it and the resident size
    creeps (`sapo-bench soak`). Each large tensor then maps its own pages and gives them back
    when freed. Elsewhere than glibc nothing happens."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        m_mmap_threshold = -3
        return bool(libc.mallopt(m_mmap_threshold, MMAP_THRESHOLD))
    except (OSError, AttributeError):
        return False
