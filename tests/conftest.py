"""Shared fixtures: child processes are reaped after each test, Qt runs offscreen."""

from __future__ import annotations

import os

import psutil
import pytest

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


@pytest.fixture(autouse=True)
def reap_children():
    """Kill whatever child processes a test left behind (nodes, p2pd daemons)."""
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    yield
    leftovers = [p for p in psutil.Process().children(recursive=True) if p.pid not in before]
    for p in leftovers:
        try:
            p.terminate()
        except psutil.NoSuchProcess:
            pass
    _, alive = psutil.wait_procs(leftovers, timeout=5)
    for p in alive:
        try:
            p.kill()
        except psutil.NoSuchProcess:
            pass
