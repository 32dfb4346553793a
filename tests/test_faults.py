"""Faults a node meets over days (issue 24): a full disk, a data directory that turns read-only,
a damaged run store or newest checkpoint, the clock jumping, the machine sleeping mid-round, the
model file changing under the node. Each gives a clear message and loses nothing a finished
round saved; the next start goes on (or says what to do).

The disk and read-only cases put the run directory on a real tmpfs the test mounts (root in a
container, as CI runs); where mounting is not allowed they are skipped and say so. The node is
real (the tiny test model, in this process)."""

from __future__ import annotations

import logging
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from sapo_core.node import Node, NodeError
from sapo_core.store import RunStore

from helpers import light_config, light_env


def _mount_tmpfs(where: Path) -> None:
    where.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64m", "tmpfs", str(where)], capture_output=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here ({done.stderr.decode().strip()}): needs root in a container")


@pytest.fixture
def mounts():
    """Mount tmpfs file systems of our own (64 MiB each); all unmounted afterwards."""
    made: list[Path] = []

    def mount(where: Path) -> Path:
        _mount_tmpfs(where)
        made.append(where)
        return where

    yield mount
    for where in reversed(made):
        subprocess.run(["umount", "-l", str(where)], capture_output=True)


@pytest.fixture
def small_disk(tmp_path, mounts):
    return mounts(tmp_path / "disk")


def _fill(disk: Path) -> Path:
    """Fill the disk to the last byte; the file to remove to free it."""
    filler = disk / "filler"
    with open(filler, "wb", buffering=0) as f:
        try:
            while True:
                f.write(b"\0" * (1 << 20))
        except OSError:
            pass
        try:  # the last partial MiB
            while True:
                f.write(b"\0" * 4096)
        except OSError:
            pass
    return filler


def _rounds(run: Path) -> list[int]:
    store = RunStore(run / "rounds.sqlite", readonly=True)
    try:
        return [r.round for r in store.rounds()]
    finally:
        store.close()


def _node(run: Path) -> Node:
    node = Node(light_config(run, **{"train.learning_rate": 1e-2}))
    node.setup()
    return node


def test_a_full_disk_stops_the_round_with_what_to_do_and_loses_no_finished_round(small_disk, data_dir):
    run = small_disk / "run"
    node = _node(run)
    node.run_round()
    node.run_round()
    filler = _fill(small_disk)
    with pytest.raises(NodeError) as e:
        node.run_round()
    said = str(e.value)
    assert "round 3" in said and "disk is full" in said and str(run) in said, said
    assert "resumes after round 2" in said, said
    node.close()
    filler.unlink()
    assert _rounds(run) == [1, 2]
    assert not list((run / "checkpoints").glob(".round-*")), "a half-written checkpoint stays behind"
    again = _node(run)
    assert again.next_round == 3
    again.run_round()
    again.close()
    assert _rounds(run) == [1, 2, 3]


def test_a_disk_that_turns_read_only_stops_the_node_with_what_to_do(small_disk, mounts, data_dir):
    run = small_disk / "run"
    # the checkpoints on a file system of their own, which the kernel turns read-only mid-run (as
    # after disk errors); the run store, open for writing, keeps its own
    checkpoints = mounts(run / "checkpoints")
    node = _node(run)
    node.run_round()
    subprocess.run(["mount", "-o", "remount,ro", str(checkpoints)], check=True)
    with pytest.raises(NodeError) as e:
        node.run_round()
    said = str(e.value)
    assert "round 2" in said and "cannot be written" in said and "resumes after round 1" in said, said
    node.close()
    subprocess.run(["mount", "-o", "remount,ro", str(small_disk)], check=True)  # now all of it
    try:
        with pytest.raises(NodeError) as e:  # a start on it says so before any work
            _node(run)
        assert "cannot be written" in str(e.value) and str(run) in str(e.value), str(e.value)
    finally:
        for where in (small_disk, checkpoints):
            subprocess.run(["mount", "-o", "remount,rw", str(where)], check=True)
    again = _node(run)
    assert again.next_round == 2
    again.close()
    assert _rounds(run) == [1]


def test_a_damaged_run_store_is_set_aside_and_training_goes_on_from_the_checkpoint(tmp_path, data_dir, caplog):
    run = tmp_path / "run"
    node = _node(run)
    for _ in range(3):
        node.run_round()
    node.close()
    store = run / "rounds.sqlite"
    for extra in run.glob("rounds.sqlite-*"):  # the WAL files of a clean close
        extra.unlink()
    data = bytearray(store.read_bytes())
    rng = random.Random(0)
    for i in rng.sample(range(len(data)), 200):  # bytes flipped all over, the header among them
        data[i] ^= 0xFF
    data[:16] = b"this is not sql!"
    store.write_bytes(bytes(data))
    again = _node(run)
    assert again.next_round == 4  # the progress is the checkpoint's
    again.run_round()
    again.close()
    aside = list(run.glob("rounds.sqlite.damaged-*"))
    assert len(aside) == 1 and aside[0].read_bytes()[:16] == b"this is not sql!"
    # the round of the checkpoint is restored from it; the rounds before went with the damaged file
    assert _rounds(run) == [3, 4]
    assert any("damaged" in r.message and "set aside" in r.message for r in caplog.records)


def test_a_damaged_newest_checkpoint_falls_back_to_the_one_before(tmp_path, data_dir):
    run = tmp_path / "run"
    node = _node(run)
    for _ in range(3):
        node.run_round()
    node.close()
    newest = run / "checkpoints" / "round-000003" / "trainable.safetensors"
    newest.write_bytes(newest.read_bytes()[:100])  # cut short, as by a dying disk
    again = _node(run)
    assert again.next_round == 3  # round 3 runs again from round 2's checkpoint
    again.run_round()
    again.close()
    assert _rounds(run) == [1, 2, 3]


def test_the_clock_jumping_back_and_forth_never_breaks_a_round(tmp_path, data_dir, monkeypatch):
    run = tmp_path / "run"
    node = _node(run)
    node.run_round()
    real = time.time
    for jump in (-3 * 3600, 26 * 3600, -26 * 3600):  # back, a day ahead (a wake-up), back again
        monkeypatch.setattr(time, "time", lambda j=jump: real() + j)
        m = node.run_round()
        assert m["time/round"] < 600, m["time/round"]  # a round's time is measured, not the jump
    node.close()
    assert _rounds(run) == [1, 2, 3, 4]
    assert os.path.isdir(run / "checkpoints" / "round-000004")


# A stand-in for the app: a NodeClient (heartbeat timeout 6 s) driving a real node process,
# printing each round it hears of and how the node ended.
_DRIVER = r"""
import sys
from sapo_core.config import load_config
from sapo_core.control import protocol as P
from sapo_core.control.client import NodeClient
client = NodeClient(heartbeat_timeout=6.0)
client.start(load_config(sys.argv[1]))
print("worker", client.pid, flush=True)
while True:
    ev = client.next_event(timeout=300)
    if ev is None or isinstance(ev, P.Exited):
        print("exited", getattr(ev, "reason", "no event for 300 s"), flush=True)
        break
    if isinstance(ev, P.RoundDone):
        print("round", ev.round, flush=True)
        if ev.round >= int(sys.argv[2]):
            client.stop(timeout=60)
            print("stopped", flush=True)
            break
"""


@pytest.mark.node_process
def test_the_machine_sleeping_mid_round_is_not_taken_for_a_hung_node(tmp_path, tmp_path_factory):
    """The app and its node both stopped for 20 s mid-round (SIGSTOP to both process groups), as
    in a suspend where the monotonic clock goes on (Windows counts a sleep in it): on waking, the
    app's watchdog must not kill the node for the silence it slept through."""
    from sapo_core.config import save_config

    save_config(light_config(tmp_path / "run", max_new_tokens=8), tmp_path / "node.toml")
    driver = subprocess.Popen(
        [sys.executable, "-c", _DRIVER, str(tmp_path / "node.toml"), "6"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=light_env(tmp_path, tmp_path_factory),
        start_new_session=True,
    )
    lines: list[str] = []
    try:
        worker = 0
        for line in driver.stdout:
            lines.append(line)
            if line.startswith("worker"):
                worker = int(line.split()[1])
            if line.startswith(("round 2", "exited")):
                break
        assert worker and lines[-1].startswith("round 2"), "".join(lines)
        groups = (os.getpgid(driver.pid), os.getpgid(worker))  # the app's, and the node's own session
        for g in groups:
            os.killpg(g, signal.SIGSTOP)  # round 3 is under way
        time.sleep(20)  # > 3 x the heartbeat timeout
        for g in groups:  # the app wakes first: its watchdog looks before the node says anything
            os.killpg(g, signal.SIGCONT)
        out, _ = driver.communicate(timeout=300)
        lines.append(out)
    finally:
        if driver.poll() is None:
            driver.kill()
    text = "".join(lines)
    assert "round 6" in text and "stopped" in text and "exited" not in text, text


@pytest.mark.slow
def test_the_model_file_changing_under_the_node_is_said_and_the_next_start_says_what_to_do(tmp_path, data_dir, caplog):
    from sapo_core.modelfiles import embedded_gguf_path

    model, run = tmp_path / "model.gguf", tmp_path / "run"
    shutil.copyfile(embedded_gguf_path(), model)
    cfg = light_config(run, **{"model.name": "smol-copy", "model.gguf_path": str(model)})
    node = Node(cfg)
    node.setup()
    node.run_round()
    before = model.read_bytes()
    with open(model, "r+b") as f:  # another file of the same name: one weight byte differs
        f.seek(-1, os.SEEK_END)
        last = f.read(1)
        f.seek(-1, os.SEEK_END)
        f.write(bytes([last[0] ^ 1]))
    st = model.stat()
    os.utime(model, ns=(st.st_atime_ns, st.st_mtime_ns + 2_000_000_000))  # a coarse clock may not move
    with caplog.at_level(logging.WARNING, logger="sapo_core.node"):
        node.run_round()  # it goes on with the model it loaded, and says the file changed
    node.close()
    assert "model.gguf changed on disk" in caplog.text
    assert _rounds(run) == [1, 2]
    again = Node(cfg)
    with pytest.raises(NodeError, match="changed since this run's last checkpoint.*Put that file back"):
        again.setup()
    again.close()
    assert _rounds(run) == [1, 2]  # nothing lost
    model.write_bytes(before)  # the file put back: the run goes on where it stopped
    node = Node(cfg)
    node.setup()
    assert node.next_round == 3
    node.run_round()
    node.close()
    assert _rounds(run) == [1, 2, 3]
