"""`sapo-node run` as a client of the node process: rounds are printed from the node's events,
Ctrl-C stops the node cleanly, a node that cannot run exits with its reason, and a first run
prints no warning."""

from __future__ import annotations

import queue
import signal
import subprocess
import sys
import threading
import time

import pytest

from sapo_core.config import save_config

from helpers import light_config

pytestmark = pytest.mark.node_process

START = 300
ARGS = [
    "--model",
    "tiny-random",
    "--alone",
    "--sampler",
    "transformers",
    "--local",
    "1",
    "--group-size",
    "2",
    "--max-new-tokens",
    "12",
    "--quiet",
    "--set",
    "round.auto_scale=false",
]


@pytest.fixture
def env(env):
    return {**env, "PYTHONUNBUFFERED": "1"}  # the CLI's lines as it prints them


def sapo_node(*args: str, env: dict[str, str]) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "sapo_core.cli", "run", *args],
        env=env,
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )


def lines_of(proc: subprocess.Popen) -> queue.Queue:
    q: queue.Queue = queue.Queue()

    def pump() -> None:
        for line in proc.stdout:
            q.put(line.rstrip("\n"))
        q.put(None)

    threading.Thread(target=pump, daemon=True).start()
    return q


def wait_line(q: queue.Queue, text: str, timeout: float) -> list[str]:
    seen, deadline = [], time.monotonic() + timeout
    while (left := deadline - time.monotonic()) > 0:
        try:
            line = q.get(timeout=left)
        except queue.Empty:
            break
        if line is None:
            break
        seen.append(line)
        if text in line:
            return seen
    raise AssertionError(f"no line with {text!r}; got {seen[-10:]}")


def test_runs_the_asked_rounds_and_prints_one_line_each(env, tmp_path):
    proc = sapo_node("--rounds", "2", "--run-dir", str(tmp_path / "run"), *ARGS, env=env)
    out, err = proc.communicate(timeout=START + 300)
    assert proc.returncode == 0, err[-2000:]
    assert "ready in" in out and "model tiny-random, sampler transformers, next round 1" in out
    assert "round    1" in out and "round    2" in out
    assert "stopped: ran 2 rounds as asked" in out


def test_a_first_run_prints_no_warning(env, tmp_path):
    """A volunteer's first `sapo-node run` (a fresh data directory, the light config as a TOML
    file) says nothing they cannot act on: no warning of ours, no library's (logs.py names the
    library warnings it filters, with the call that raises each)."""
    # a KL term trains even a group without reward spread: the round's update runs too
    save_config(light_config(tmp_path / "run", **{"train.kl_beta": 0.01}), tmp_path / "node.toml")
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "sapo_core.cli",
            "run",
            "--alone",
            "--rounds",
            "1",
            "--config",
            str(tmp_path / "node.toml"),
        ],
        env={k: v for k, v in env.items() if k != "PYTHONWARNINGS"},
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    out, err = proc.communicate(timeout=START + 300)
    assert proc.returncode == 0, err[-2000:]
    assert "stopped: ran 1 round as asked" in out and "trained 1" in out
    said = out + err
    assert "warning" not in said.lower(), said


def test_ctrl_c_stops_the_node_and_the_next_run_goes_on(env, tmp_path):
    proc = sapo_node("--run-dir", str(tmp_path / "run"), *ARGS, env=env)
    q = lines_of(proc)
    wait_line(q, "round    1", START)
    proc.send_signal(signal.SIGINT)
    rest = wait_line(q, "stopped: stopped by you", 120)
    assert proc.wait(60) == 0
    assert any("stopping: the round in progress runs again" in ln for ln in rest)
    done = [int(ln.split()[1]) for ln in rest if ln.startswith("round ")]
    last = max([1, *done])
    proc = sapo_node("--rounds", "1", "--run-dir", str(tmp_path / "run"), *ARGS, env=env)
    out, _ = proc.communicate(timeout=START + 300)
    assert f"next round {last + 1}" in out and f"round {last + 1:>4}" in out


def test_a_node_that_cannot_run_exits_2_with_the_reason(env, tmp_path):
    proc = sapo_node(
        "--run-dir", str(tmp_path / "run"), *ARGS[:0], "--model", "no-such-model", "--alone", "--quiet", env=env
    )
    out, err = proc.communicate(timeout=START)
    assert proc.returncode == 2
    assert "error:" in out and "no-such-model" in out


def test_the_terminal_prints_a_download_every_ten_percent_not_every_event():
    """`sapo-node run` on a first start: 101 download events (1 % each, arriving faster than
    the 5 s between time-based lines) print 11 lines, one per 10 %, the last saying it is done."""
    import io

    from rich.console import Console

    from sapo_core.commands.live import EventDisplay
    from sapo_core.control import protocol as P

    out = io.StringIO()
    display = EventDisplay(Console(file=out, width=200, highlight=False), None)
    total, info = 386_000_000, {"model": "SmolLM2-360M-Instruct", "size_bytes": 386_000_000, "host": "huggingface.co"}
    display(P.Log(level="info", message="downloading SmolLM2-360M-Instruct (386 MB) from huggingface.co …"))
    for pct in range(101):
        display(
            P.Progress(
                round=0,
                phase="download",
                done=total * pct // 100,
                total=total,
                info={**info, "bytes_per_s": 4_000_000, "eta_s": (100 - pct) * 0.965},
            )
        )
    display(P.Progress(round=0, phase="download", done=total, total=total, info=info))  # a repeated last one
    lines = out.getvalue().splitlines()
    assert lines[0] == "info: downloading SmolLM2-360M-Instruct (386 MB) from huggingface.co …"
    assert len(lines) == 1 + 11, lines
    assert lines[1] == "Downloading SmolLM2-360M-Instruct: 0 of 386 MB (0 %) at 4 MB/s, about 2 min left"
    assert lines[4] == "Downloading SmolLM2-360M-Instruct: 116 of 386 MB (30 %) at 4 MB/s, about 1 min left"
    assert lines[-1] == "Downloaded SmolLM2-360M-Instruct (386 MB); checking and loading it"


def test_the_terminal_says_what_rounds_measured_where_the_start_quoted_the_formula():
    """Without a probe the node's model line quotes the formula's round time (catalog.judge, the
    real verdict for this machine): after three rounds of 6.2, 9.0 and 7.1 s the terminal prints
    their median once, 7 s and 3600 / 7.1 = 507 an hour. Where the start quoted a measured time,
    nothing is added."""
    import io

    from rich.console import Console

    from sapo_core.catalog import choose_model, load_catalogue
    from sapo_core.commands.live import EventDisplay
    from sapo_core.config import NodeConfig
    from sapo_core.control import protocol as P
    from sapo_core.control import vocabulary as K
    from sapo_core.hardware import detect_hardware

    choice = choose_model(detect_hardware(), load_catalogue(), NodeConfig(), None)

    def shown(model_line):
        out = io.StringIO()
        display = EventDisplay(Console(file=out, width=400, highlight=False), None)
        display(P.Log(level="info", message=f"model: {model_line}"))
        for r, seconds in enumerate([6.2, 9.0, 7.1, 30.0], start=1):
            display(P.RoundDone(round=r, metrics={K.TIME_ROUND: seconds}))
        return [x for x in out.getvalue().splitlines() if x.startswith("measured here")]

    assert "estimate from parameters and cores" in choice.reason  # fits or slow, the formula's either way
    assert shown(choice.reason) == [
        "measured here: a round ~7 s (the median of this run's first 3), ~507 an hour; the round time quoted "
        "at the start was the formula's estimate (`sapo-node hardware --probe` measures this machine for it)"
    ]
    assert shown("fits: needs 1.2 of 9.0 GB RAM; a round ~8 s, ~450 an hour (measured, scaled)") == []
