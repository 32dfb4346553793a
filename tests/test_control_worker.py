"""A real node process driven through the control protocol: pause now and resume, pause after the
round, snooze, throttle and threads, stop mid-round, kill -9 mid-round, and restarts that continue
from the last completed round. The light test model (tiny-random: a 2-layer random Llama with the
embedded tokenizer, the transformers sampler, real training) keeps rounds short; no swarm."""

from __future__ import annotations

import contextlib
import os
import signal
import time
from pathlib import Path

import pytest

from sapo_core.config import NodeConfig
from sapo_core.control import protocol as P
from sapo_core.control.client import NodeClient
from sapo_core.store import STORE_NAME, RunStore

from helpers import light_config

pytestmark = pytest.mark.node_process

START = 300  # seconds a node may take to come up on a loaded 2-core machine
ROUND = 120


def tiny(run_dir: Path, **changes) -> NodeConfig:
    return light_config(
        run_dir,
        max_new_tokens=24,
        **{"train.kl_beta": 0.01, "train.steps_per_round": 1, "sampler.threads": 1, **changes},
    )


def stored_rounds(run_dir: Path) -> list[int]:
    store = RunStore(run_dir / STORE_NAME, readonly=True)
    try:
        return [row.round for row in store.rounds()]
    finally:
        store.close()


def in_round(client: NodeClient, timeout: float = ROUND) -> P.Progress:
    """Wait until the node is inside a round's sampling or training."""
    ev = client.wait_for(lambda e: isinstance(e, P.Progress) and e.phase in ("sample", "update"), timeout)
    assert isinstance(ev, P.Progress)
    return ev


def test_pause_now_holds_mid_round_and_resume_continues_the_same_round(env, tmp_path):
    client = NodeClient(env=env)
    client.start(tiny(tmp_path / "run"))
    try:
        info = client.wait_for(lambda e: isinstance(e, P.NodeInfo), START)
        assert (info.model_id, info.sampler, info.next_round, info.peer_id) == ("tiny-random", "transformers", 1, "")
        client.wait_for(lambda e: isinstance(e, P.RoundDone), ROUND)

        # pause now, inside a round
        at = in_round(client)
        asked = time.monotonic()
        client.pause()
        paused = client.wait_state(P.PAUSED, timeout=30)
        print(f"\npause latency {time.monotonic() - asked:.3f} s (round {paused.round}, during {at.phase})")
        assert paused.reason == "paused by you"
        client.request_status()
        status = client.wait_for(lambda e: isinstance(e, P.Status), 30)
        assert status.state == P.PAUSED and status.paused_by_user
        # held: for a while only heartbeats arrive, and they say paused
        quiet_until, beats = time.monotonic() + 2.5, []
        while (left := quiet_until - time.monotonic()) > 0:
            ev = client.next_event(left)
            assert not isinstance(ev, (P.Progress, P.RoundDone)), ev
            if isinstance(ev, P.Heartbeat):
                beats.append(ev)
        assert beats and all(b.state == P.PAUSED for b in beats)

        client.resume()
        assert client.wait_state(P.RUNNING, timeout=30).reason == "resumed (was: paused by you)"
        done = client.wait_for(lambda e: isinstance(e, P.RoundDone), ROUND)
        assert done.round == paused.round  # the same round went on; it was not restarted

        # pause after this round: the round ends, then the node holds
        in_round(client)
        client.pause(after_round=True)
        assert client.wait_state(P.PAUSING, timeout=30).reason == "pausing after this round"
        finished = client.wait_for(lambda e: isinstance(e, P.RoundDone), ROUND)
        held = client.wait_state(P.PAUSED, timeout=30)
        assert held.reason == f"paused by you after round {finished.round}"
        client.resume()
        client.wait_state(P.RUNNING, timeout=30)

        # snooze: holds, then goes on by itself
        client.snooze(1.0)
        snoozed = client.wait_state(P.SNOOZED, timeout=30)
        assert snoozed.reason.startswith("snoozed until") and snoozed.until
        assert client.wait_state(P.RUNNING, timeout=30).reason.startswith("resumed (was: snoozed")

        # throttle and threads: applied at once, shown in the status, and rounds go on
        client.set_throttle(0.3)
        client.set_threads(1)
        client.wait_for(lambda e: isinstance(e, P.Log) and e.message == "threads set to 1", ROUND)
        client.request_status()
        status = client.wait_for(lambda e: isinstance(e, P.Status), 30)
        assert (status.throttle, status.threads) == (0.3, 1)
        beat = client.wait_for(lambda e: isinstance(e, P.Heartbeat), 30)
        assert beat.throttle == 0.3
        client.wait_for(lambda e: isinstance(e, P.RoundDone), ROUND)

        # a command the node cannot take is refused, and the node goes on
        client.set_throttle(3.0)
        refused = client.wait_for(lambda e: isinstance(e, P.Error), 30)
        assert refused.kind == P.COMMAND and not refused.fatal and "control.throttle" in refused.message
    finally:
        assert client.stop(timeout=60) == P.EXIT_OK
    assert client.exited.clean and client.crash is None
    rounds = stored_rounds(tmp_path / "run")
    assert rounds == list(range(1, len(rounds) + 1))


def test_stop_mid_round_keeps_completed_rounds_and_the_next_start_continues(env, tmp_path):
    run = tmp_path / "run"
    client = NodeClient(env=env)
    client.start(tiny(run))
    client.wait_for(lambda e: isinstance(e, P.RoundDone), START)
    at = in_round(client)
    assert client.stop(timeout=60) == P.EXIT_OK
    stopped = client.exited
    assert stopped.clean and stopped.reason == "stopped by you"
    events = []
    while (ev := client.next_event(0)) is not None:
        events.append(ev)
    assert any(isinstance(e, P.Log) and "stopped during round" in e.message for e in events) or any(
        isinstance(e, P.RoundDone) and e.round == at.round for e in events
    )  # or it had just finished
    kept = stored_rounds(run)
    assert kept == list(range(1, len(kept) + 1))

    again = NodeClient(env=env)
    again.start(tiny(run), rounds=1)
    info = again.wait_for(lambda e: isinstance(e, P.NodeInfo), START)
    assert info.next_round == kept[-1] + 1
    done = again.wait_for(lambda e: isinstance(e, P.RoundDone), ROUND)
    assert done.round == kept[-1] + 1
    again.wait_state(P.STOPPED, timeout=60)
    assert again.stop(timeout=30) == P.EXIT_OK
    assert stored_rounds(run) == kept + [kept[-1] + 1]


def test_kill_9_mid_round_loses_only_that_round(env, tmp_path):
    run = tmp_path / "run"
    client = NodeClient(env=env)
    client.start(tiny(run))
    client.wait_for(lambda e: isinstance(e, P.RoundDone) and e.round == 2, START + ROUND)
    at = in_round(client)
    os.kill(client.pid, signal.SIGKILL)
    crashed = client.wait_state(P.CRASHED, timeout=30)
    assert "SIGKILL" in crashed.reason
    exited = client.wait_for(lambda e: isinstance(e, P.Exited), 30)
    assert not exited.clean and exited.signal == "SIGKILL"
    assert client.crash is not None and client.crash.signal == "SIGKILL"
    kept = stored_rounds(run)
    assert kept == list(range(1, at.round)) or kept == list(range(1, at.round + 1))  # killed as it saved

    again = NodeClient(env=env)
    again.start(tiny(run), rounds=1)
    info = again.wait_for(lambda e: isinstance(e, P.NodeInfo), START)
    assert info.next_round == kept[-1] + 1  # training continues from the next round
    again.wait_for(lambda e: isinstance(e, P.RoundDone) and e.round == kept[-1] + 1, ROUND)
    again.wait_state(P.STOPPED, timeout=60)
    assert again.stop(timeout=30) == P.EXIT_OK
    assert stored_rounds(run) == kept + [kept[-1] + 1]


@pytest.mark.network
def test_the_swarm_answers_while_the_node_is_paused_or_throttled(env, tmp_path):
    """The DHT runs in its own thread of the node process: peers can join through a paused node."""
    from sapo_core.config import SwarmConfig, TaskConfig
    from sapo_core.hooks import NullHooks
    from sapo_core.swarm.source import open_swarm
    from sapo_core.tasks import TaskSet

    swarm = {
        "swarm.enabled": True,
        "swarm.swarm_name": "control-test",
        "round.external_groups": 1,
        "swarm.host_maddrs": ["/ip4/127.0.0.1/tcp/0"],
        "swarm.identity_path": str(tmp_path / "node.key"),
        "swarm.publish_timeout": 3.0,
        "swarm.gather_timeout": 3.0,
    }
    client = NodeClient(env=env)
    client.start(tiny(tmp_path / "run", **swarm))
    joiners = []
    try:
        info = client.wait_for(lambda e: isinstance(e, P.NodeInfo), START)
        assert info.peer_id and info.join_address.endswith(info.peer_id)
        client.pause()
        client.wait_state(P.PAUSED, timeout=60)
        client.set_throttle(0.05)
        for held in ("paused", "throttled"):
            if held == "throttled":
                client.resume()
                client.wait_state(P.RUNNING, timeout=60)
            cfg = SwarmConfig(
                swarm_name="control-test",
                initial_peers=[info.join_address],
                host_maddrs=["/ip4/127.0.0.1/tcp/0"],
                join_timeout=5.0,
                identity_path=str(tmp_path / f"joiner-{held}.key"),
            )
            joiner = open_swarm(cfg, TaskSet(TaskConfig(), seed=0), tmp_path / held, NullHooks())
            joiners.append(joiner)
            deadline = time.monotonic() + 30
            while joiner.dht.num_peers() == 0 and time.monotonic() < deadline:
                time.sleep(0.2)
            assert joiner.dht.num_peers() > 0, f"no answer from the {held} node"
    finally:
        for j in joiners:
            j.close()
        assert client.stop(timeout=60) == P.EXIT_OK


@pytest.mark.slow
def test_a_pause_suspends_the_llamacpp_sampler_at_once_and_resume_lets_it_go_on(env, tmp_path):
    """The embedded model with the llama.cpp sampler, which decodes in a child process: a pause
    during sampling suspends that child (and only it); resume continues the same round."""
    import psutil

    cfg = tiny(
        tmp_path / "run",
        **{
            "model.name": "smollm2-135m-instruct",
            "sampler.backend": "llamacpp",
            "sampler.max_new_tokens": 48,
            "sampler.group_size": 4,
            "sampler.threads": 0,
        },
    )
    client = NodeClient(env=env)
    client.start(cfg)
    try:
        info = client.wait_for(lambda e: isinstance(e, P.NodeInfo), 900)
        assert info.sampler == "llamacpp"
        at = client.wait_for(lambda e: isinstance(e, P.Progress) and e.phase == "sample", 600)
        client.pause()
        paused = client.wait_state(P.PAUSED, timeout=60)
        assert paused.reason == "paused by you"
        node = psutil.Process(client.pid)
        engines = [p for p in node.children() if "sapo_core.sampler." in " ".join(p.cmdline())]
        deadline = time.monotonic() + 10  # the stop signal is delivered asynchronously
        while not all(p.status() == psutil.STATUS_STOPPED for p in engines) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert engines and all(p.status() == psutil.STATUS_STOPPED for p in engines)
        others = [p for p in node.children(recursive=True) if p not in engines]
        assert all(p.status() != psutil.STATUS_STOPPED for p in others)
        client.resume()
        client.wait_state(P.RUNNING, timeout=60)
        done = client.wait_for(lambda e: isinstance(e, P.RoundDone), 900)  # the engine went on
        assert done.round == at.round
    finally:
        assert client.stop(timeout=120) == P.EXIT_OK


# 24 MiB: three of the hub client's 10 MiB reads
DOWNLOAD_PAYLOAD = b"GGUF" + bytes(range(256)) * (24 * 2**20 // 256)


@contextlib.contextmanager
def _node_downloading(env, tmp_path, entry, trickle_seconds: float):
    """A node started on catalogue `entry`, which a loopback hub (tests/fakehub.py) serves at its
    repo, commit and file name, as DOWNLOAD_PAYLOAD over `trickle_seconds`."""
    from sapo_core.modelfiles import _PROXY_VARS

    from fakehub import FakeHub

    with FakeHub(
        DOWNLOAD_PAYLOAD,
        repo=entry.repo,
        revision=entry.revision,
        filename=entry.filename,
        trickle_seconds=trickle_seconds,
    ) as hub:
        node_env = {k: v for k, v in env.items() if k not in _PROXY_VARS}
        node_env.update(HF_ENDPOINT=hub.url, HF_HUB_OFFLINE="0", HF_HUB_DISABLE_PROGRESS_BARS="1")
        client = NodeClient(env=node_env)
        client.start(tiny(tmp_path / "run", **{"model.name": entry.id}))
        yield client


@pytest.mark.slow
def test_first_start_reports_the_model_download_then_falls_back_and_starts(env, tmp_path):
    """A catalogue model not downloaded yet, from a loopback hub (tests/fakehub.py) at the
    catalogue's repo, commit and file name: the node says where it downloads from, sends
    Progress(phase="download") with growing byte counts of the served file, still "starting"
    (round 0, never "running"), no more than about four a second. The served file is a small
    stand-in (not the catalogue's size): verification refuses it, deletes it, says so, and the
    node starts with the embedded model, as a failed download does today."""
    from sapo_core.catalog import load_catalogue

    entry, embedded = load_catalogue().get("smollm2-360m-instruct"), load_catalogue().embedded
    payload = DOWNLOAD_PAYLOAD
    with _node_downloading(env, tmp_path, entry, trickle_seconds=2.0) as client:
        try:
            seen: list[P.Message] = []
            client.wait_for(lambda e: seen.append(e) or isinstance(e, P.NodeInfo), 900)
        finally:
            assert client.stop(timeout=120) == P.EXIT_OK
    logs = [e.message for e in seen if isinstance(e, P.Log)]
    size = f"{entry.size_bytes / 1e6:.0f} MB"
    assert f"downloading {entry.title} ({size}) from 127.0.0.1 …" in logs
    steps = [e for e in seen if isinstance(e, P.Progress) and e.phase == "download"]
    counting = [e for e in steps if not e.info.get("failed")]
    assert len({e.done for e in counting}) >= 3, counting  # it moved while we watched
    assert [e.done for e in counting] == sorted(e.done for e in counting)
    assert counting[-1].done == len(payload) and all(e.total == len(payload) and e.round == 0 for e in counting)
    assert counting[0].info["model"] == entry.title and counting[0].info["size_bytes"] == entry.size_bytes
    assert len(counting) <= 2.0 * 4 + 3  # rate-limited: ~4 a second over the 2 s transfer, plus first and last
    # refused: the failure reaches the status line and the log, and the fallback says why
    assert "bytes; the catalogue's" in steps[-1].info["failed"]
    assert any(m.startswith(f"download of {entry.title} failed after") for m in logs)
    assert any(m.startswith("model: ") and f"instead of {entry.title}" in m for m in logs)
    assert not any(m.startswith("downloaded and verified") for m in logs)
    # still starting while it downloaded: no round ran, no "running" before the model was up
    before_info = seen[:-1]
    assert not any(isinstance(e, P.State) and e.state == P.RUNNING for e in before_info)
    assert seen[-1].model_id == embedded.id
    cache = Path(env["SAPO_CACHE_DIR"]) / "hub"
    assert list(cache.glob("models--*/blobs/*")) == []  # nothing half-right left to be found next time


def test_a_stop_during_the_model_download_ends_it_cleanly(env, tmp_path):
    """Stop asked while the model downloads: the node leaves at the download's next read (it does
    not wait it out, nor get terminated), says it stopped, and keeps no partial file."""
    from sapo_core.catalog import load_catalogue

    entry = load_catalogue().get("smollm2-360m-instruct")
    payload = DOWNLOAD_PAYLOAD
    with _node_downloading(env, tmp_path, entry, trickle_seconds=12.0) as client:
        try:
            client.wait_for(lambda e: isinstance(e, P.Progress) and e.phase == "download", START)
        finally:
            # the transfer has 12 s to go; the next 10 MiB read (~5 s) sees the stop
            assert client.stop(timeout=60) == P.EXIT_OK
    assert client.exited is not None and client.exited.clean
    later = list(iter(lambda: client.next_event(0), None))
    assert not any(isinstance(e, P.Progress) and e.done >= len(payload) for e in later)  # not waited out
    assert not any(isinstance(e, P.Log) and ("failed" in e.message or e.message.startswith("model:")) for e in later)
    cache = Path(env["SAPO_CACHE_DIR"]) / "hub"
    assert list(cache.glob("models--*/blobs/*")) == []
