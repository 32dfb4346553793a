"""The swarm over real hivemind DHTs on loopback: publish/gather between nodes, forgeries sent
straight to storage nodes, tampered and flooding peers, joining with retries, two processes.

Every node here is a real one (own identity, p2pd daemon, DHT thread, validators, verifier);
only the groups are made up (the right answer in some completions) instead of sampled by a model.
"""

from __future__ import annotations

import dataclasses
import multiprocessing
import random
import socket
import time
from pathlib import Path

import pytest

from sapo_core.config import SwarmConfig, TaskConfig
from sapo_core.hooks import NullHooks
from sapo_core.rollouts import Completion, Group, Question, QuestionId
from sapo_core.swarm.source import NoSwarm, open_swarm
from sapo_core.tasks import TaskSet

from helpers import RecordingHooks, attacker_store, honest_groups, signed_record

pytestmark = pytest.mark.network


def _config(**over) -> SwarmConfig:
    base = dict(
        swarm_name="test-swarm",
        host_maddrs=["/ip4/127.0.0.1/tcp/0"],
        window_seconds=60.0,
        records_per_gather=6,
        gather_timeout=20.0,
        publish_timeout=20.0,
    )
    base.update(over)
    return SwarmConfig(**base)


@pytest.fixture(scope="module")
def verifier() -> TaskSet:
    return TaskSet(TaskConfig(), seed=0)


@pytest.fixture(scope="module")
def swarm(tmp_path_factory, verifier):
    """Three nodes: a hosts, b and c join through a's address."""
    d = tmp_path_factory.mktemp("swarm")
    hooks = [RecordingHooks() for _ in range(3)]
    a = open_swarm(_config(), verifier, d / "a", hooks[0])
    joined = _config(initial_peers=[a.join_address])
    b = open_swarm(joined, verifier, d / "b", hooks[1])
    c = open_swarm(joined, verifier, d / "c", hooks[2])
    yield {"nodes": [a, b, c], "hooks": hooks, "dir": d, "joined": joined}
    for node in (a, b, c):
        node.close()


def test_host_prints_the_address_others_join_with(swarm):
    a = swarm["nodes"][0]
    assert a.join_address.endswith(f"/p2p/{a.node_id}")
    assert "--initial-peers" in swarm["hooks"][0].text() and a.join_address in swarm["hooks"][0].text()
    assert "joined swarm" in swarm["hooks"][1].text()


def test_three_nodes_exchange_verified_groups(swarm):
    nodes = swarm["nodes"]
    for i, node in enumerate(nodes):
        node.publish(1, honest_groups(seed=100 + i, round=1))
    ids = {n.node_id for n in nodes}
    for node in nodes:
        got = node.gather(1, 6, random.Random(0))
        stats = node.stats()
        assert len(got) == 6
        assert {g.source for g in got} == ids - {node.node_id}  # never our own records back
        for g in got:
            assert g.has_signal()
            assert all(c.token_ids is None for c in g.completions)
            assert g.rewards == node.tasks.score(g.question, [c.text for c in g.completions])  # ours, not 9.0
        assert stats["swarm/published"] == 3 and stats["swarm/peers"] == 2
        assert stats["swarm/records"] == 2 and stats["swarm/received"] == 6 and stats["swarm/accepted"] == 6
        assert stats["swarm/used"] == 6 and stats["swarm/rejected"] == 0
        assert stats["swarm/dht_peers"] >= 2 and stats["swarm/gather_s"] > 0 and stats["swarm/bytes_in"] > 0


def test_want_zero_and_no_swarm_gather_nothing(swarm):
    assert swarm["nodes"][0].gather(2, 0, random.Random(0)) == []
    alone = NoSwarm()
    alone.publish(0, honest_groups(1, 0))
    assert alone.gather(0, 4, random.Random(0)) == [] and alone.stats() == {}


def test_forgeries_sent_to_storage_nodes_are_refused_and_counted(swarm, verifier):
    from hivemind.utils import get_dht_time

    from sapo_core.swarm.keys import KeySpace
    from sapo_core.swarm.publish import fit_record
    from sapo_core.swarm.records import Record, encode_record

    a, b, c = swarm["nodes"]
    mallory = open_swarm(swarm["joined"], verifier, swarm["dir"] / "mallory", RecordingHooks())
    try:
        ks: KeySpace = a.keyspace
        now = get_dht_time()
        w = ks.window_at(now)
        exp = now + 60
        mkey = mallory.dht._hivemind_key
        bkey = b.dht._hivemind_key
        good = fit_record(ks.swarm_name, w, b.node_id, 5, honest_groups(7, 5)).payload
        mine = fit_record(ks.swarm_name, w, mallory.node_id, 5, honest_groups(7, 5)).payload
        cases = {
            # b's key and subkey, signed by mallory: overwriting another node's record
            "bad_signature": signed_record(ks.record_key(w, b.node_id), good, bkey, mkey, exp),
            # mallory's own subkey under b's key, claiming to be b
            "wrong_owner": signed_record(ks.record_key(w, b.node_id), good, mkey, mkey, exp),
            # mallory's own valid record replayed under b's key
            "wrong_key": signed_record(ks.record_key(w, b.node_id), mine, mkey, mkey, exp),
            "malformed": signed_record(ks.record_key(w, mallory.node_id), b"\x93junk", mkey, mkey, exp),
            "wrong_swarm": signed_record(
                ks.record_key(w, mallory.node_id),
                encode_record(Record("other", w, mallory.node_id, 5, ())),
                mkey,
                mkey,
                exp,
            ),
            "oversized": signed_record(ks.record_key(w, mallory.node_id), b"\x00" * (260 * 1024), mkey, mkey, exp),
            "expiration": signed_record(ks.record_key(w, mallory.node_id), mine, mkey, mkey, now + 10**6),
        }
        cases["unsigned"] = (b"\xc4\x03abc", b"\xc4\x05plain")
        before = [n.dht.dht_rejections.snapshot() for n in (a, b, c)]
        for reason, (value, subkey) in cases.items():
            key = ks.record_key(
                w, b.node_id if reason in ("bad_signature", "wrong_owner", "wrong_key") else mallory.node_id
            )
            expiration = now + 10**6 if reason == "expiration" else exp  # the one it was signed with
            results = attacker_store(mallory, [a, b, c], key, value, subkey, expiration)
            assert results == [[False]] * 3, reason
        for node, old in zip((a, b, c), before):
            new = node.dht.dht_rejections.snapshot()
            for reason in cases:
                assert new.get(reason, 0) - old.get(reason, 0) >= 1, (reason, new)
        # b's real record is untouched: the others still get b's groups, verified
        b.publish(6, honest_groups(8, 6))
        got = a.gather(6, 10, random.Random(1))
        assert any(g.source == b.node_id for g in got)
        assert a.stats().get("swarm/rejected", 0) == 0
    finally:
        mallory.close()


def _tampered_groups(tasks: TaskSet, round: int) -> list[Group]:
    """One of each kind of bad group a hostile peer can sign and publish, and one honest one."""
    good, q2, q3, q4, q5, q6 = honest_groups(9, round, 6)

    def clone(group: Group, **question_changes) -> Group:
        q = group.question
        q = Question(
            question_changes.get("id", q.id),
            question_changes.get("text", q.text),
            question_changes.get("answer", q.answer),
        )
        return Group(q, [Completion(c.text) for c in group.completions])

    return [
        good,
        clone(q2, answer="-98765"),  # claims its wrong completions are right
        clone(q3, text=q3.question.text + " Hint: the answer is -98765."),
        clone(q4, id=QuestionId("not_a_task", "abcdef", 1, 1)),
        clone(q5, id=dataclasses.replace(q5.question.id, config_digest="0" * 16)),
        Group(
            q6.question,
            [Completion(f"{m} {q6.question.answer}") for m in ("Answer:", "The answer is", "answer =", "Answer =")],
        ),  # all right
    ]


def test_tampered_groups_are_refused_on_receipt_and_the_peer_ignored(swarm, verifier):
    a = swarm["nodes"][0]
    mallory = open_swarm(swarm["joined"], verifier, swarm["dir"] / "mallory2", RecordingHooks())
    hooks = RecordingHooks()
    a.hooks = hooks
    try:
        for round in range(10, 13):
            mallory.publish(round, _tampered_groups(verifier, round))
            got = a.gather(round, 20, random.Random(round))
            stats = a.stats()
            from_mallory = [g for g in got if g.source == mallory.node_id]
            assert len(from_mallory) == 1 and from_mallory[0].question.id.index >= 0
            for reason in ("answer_mismatch", "text_mismatch", "unknown_task", "unknown_config", "zero_advantage"):
                assert stats[f"swarm/rejected/{reason}"] == 1, (reason, stats)
        assert stats["swarm/ignored_peers"] == 1
        assert "ignoring peer" in hooks.text() and mallory.node_name in hooks.text()
        assert a.reputation.rejections[mallory.node_id]["answer_mismatch"] == 3
        mallory.publish(13, _tampered_groups(verifier, 13))
        got = a.gather(13, 20, random.Random(13))
        assert not any(g.source == mallory.node_id for g in got)
        assert a.stats().get("swarm/rejected", 0) == 0  # not even fetched any more
    finally:
        a.hooks = NullHooks()
        mallory.close()


def test_a_flood_of_signed_junk_costs_a_bounded_gather(swarm, verifier):
    """Twenty fresh identities (the cheap Sybil attack) each sign a schema-valid record full of
    wrong answers and an index entry claiming signal; a gather fetches at most
    records_per_gather records, refuses and counts every junk group, and returns only truth."""
    from cryptography.hazmat.primitives.asymmetric import rsa
    from hivemind.utils import get_dht_time

    from sapo_core.swarm.identity import NodeIdentity
    from sapo_core.swarm.publish import fit_record
    from sapo_core.swarm.records import IndexEntry, encode_index

    a, b, c = swarm["nodes"]
    ks = a.keyspace
    mallory = open_swarm(swarm["joined"], verifier, swarm["dir"] / "mallory3", RecordingHooks())
    try:
        now = get_dht_time()
        w, exp = ks.window_at(now), now + 60
        for _i in range(20):
            fake = NodeIdentity.from_key(Path("-"), rsa.generate_private_key(public_exponent=65537, key_size=2048))
            key = fake.hivemind_key()
            groups = _tampered_groups(verifier, 20)[1:3]
            payload = fit_record(ks.swarm_name, w, fake.peer_id, 20, groups).payload
            shard = ks.shard_of(fake.peer_id, w)
            index = encode_index(IndexEntry(ks.swarm_name, w, shard, fake.peer_id, 20, 2, 2, len(payload)))
            for k, v in ((ks.record_key(w, fake.peer_id), payload), (ks.index_key(w, shard), index)):
                value, subkey = signed_record(k, v, key, key, exp)
                assert attacker_store(mallory, [a, b, c], k, value, subkey, exp) == [[True]] * 3
        c.publish(20, honest_groups(11, 20))
        started = time.perf_counter()
        got = b.gather(20, 8, random.Random(2))
        took = time.perf_counter() - started
        stats = b.stats()
        assert stats["swarm/peers"] >= 21
        assert stats["swarm/records"] <= b.cfg.records_per_gather
        assert all(g.source in (a.node_id, c.node_id) for g in got)
        # c gave b good groups before: trusted peers keep their slots whatever the flood
        assert c.node_id in {g.source for g in got}
        junk_records = stats["swarm/records"] - sum(1 for p in {g.source for g in got})
        assert stats.get("swarm/rejected/answer_mismatch", 0) + stats.get("swarm/rejected/text_mismatch", 0) >= 2 * max(
            0, junk_records - 2
        )
        assert took < b.cfg.gather_timeout + 5
    finally:
        mallory.close()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_no_peer_answering_trains_alone_then_joins_when_the_peer_appears(tmp_path, verifier):
    from sapo_core.swarm.identity import load_or_create_identity

    port = _free_port()
    host_id = load_or_create_identity(tmp_path / "host" / "node.key")
    address = f"/ip4/127.0.0.1/tcp/{port}/p2p/{host_id.peer_id}"
    hooks = RecordingHooks()
    joiner = open_swarm(
        _config(
            swarm_name="late", initial_peers=[address], join_timeout=1.0, rejoin_min_seconds=0.5, rejoin_max_seconds=2.0
        ),
        verifier,
        tmp_path / "joiner",
        hooks,
    )
    host = None
    try:
        assert "no peer answered" in hooks.text() and address in hooks.text()
        joiner.publish(0, honest_groups(1, 0))  # alone: nothing raises, the round goes on
        assert joiner.gather(0, 4, random.Random(0)) == []
        host = open_swarm(
            _config(swarm_name="late", host_maddrs=[f"/ip4/127.0.0.1/tcp/{port}"]),
            verifier,
            tmp_path / "host",
            RecordingHooks(),
        )
        assert host.node_id == host_id.peer_id  # the identity file fixed the peer id
        deadline = time.monotonic() + 30
        while "joined swarm" not in hooks.text() and time.monotonic() < deadline:
            time.sleep(0.2)
        assert joiner.dht.num_peers() > 0, hooks.text()
        assert "joined swarm" in hooks.text()  # said once a peer is there, however it got there
        host.publish(1, honest_groups(2, 1))
        assert {g.source for g in joiner.gather(1, 4, random.Random(1))} == {host.node_id}
    finally:
        joiner.close()
        if host is not None:
            host.close()


def test_restart_keeps_the_peer_id(tmp_path, verifier):
    first = open_swarm(_config(), verifier, tmp_path)
    peer_id, address = first.node_id, first.join_address
    first.close()
    again = open_swarm(_config(), verifier, tmp_path)
    try:
        assert again.node_id == peer_id and again.join_address.endswith(f"/p2p/{peer_id}")
        assert address.endswith(f"/p2p/{peer_id}")
    finally:
        again.close()


def _publish_from_child(address: str, directory: str, ready, done) -> None:
    from sapo_core.tasks import TaskSet as ChildTasks

    node = open_swarm(
        _config(swarm_name="two-processes", initial_peers=[address]), ChildTasks(TaskConfig(), seed=0), Path(directory)
    )
    try:
        node.publish(30, honest_groups(31, 30))
        ready.put(node.node_id)
        done.wait(120)
    finally:
        node.close()


def test_groups_cross_process_boundaries(tmp_path, verifier):
    host = open_swarm(_config(swarm_name="two-processes"), verifier, tmp_path / "host")
    ctx = multiprocessing.get_context("spawn")
    ready, done = ctx.Queue(), ctx.Event()
    child = ctx.Process(target=_publish_from_child, args=(host.join_address, str(tmp_path / "child"), ready, done))
    child.start()
    try:
        child_id = ready.get(timeout=180)
        got = host.gather(30, 10, random.Random(3))
        assert {g.source for g in got} == {child_id}, host.stats()
    finally:
        done.set()
        child.join(60)
        host.close()
    assert child.exitcode == 0


def test_a_dead_dht_costs_the_round_its_sharing_not_the_round(tmp_path, verifier):
    hooks = RecordingHooks()
    node = open_swarm(_config(swarm_name="dies"), verifier, tmp_path, hooks)
    node.dht.close()  # p2pd and the DHT thread gone under the round loop's feet
    node.publish(1, honest_groups(1, 1))
    assert node.gather(1, 4, random.Random(0)) == []
    stats = node.stats()
    assert stats["swarm/dht_errors"] >= 2 and stats["swarm/publish_failed"] == 2
    assert "publishing round 1 failed" in hooks.text()
    node.close()


def test_a_round_longer_than_a_window_stays_readable(tmp_path, verifier):
    """A slow node's record is re-published into each new window while its next round runs."""
    cfg = _config(swarm_name="slow-rounds", window_seconds=5.0)
    a = open_swarm(cfg, verifier, tmp_path / "a")
    b = open_swarm(dataclasses.replace(cfg, initial_peers=[a.join_address]), verifier, tmp_path / "b")
    try:
        ks = a.keyspace
        a.publish(1, honest_groups(3, 1))
        published_in = ks.window_at(time.time())
        deadline = time.monotonic() + 30
        while ks.window_at(time.time()) < published_in + 2 and time.monotonic() < deadline:
            time.sleep(0.5)
        time.sleep(cfg.window_seconds / 4 + 1)  # one re-publishing tick into this window
        assert ks.window_at(time.time()) >= published_in + 2  # the original window is out of reach
        got = b.gather(1, 4, random.Random(0))
        assert {g.source for g in got} == {a.node_id}, b.stats()
    finally:
        a.close()
        b.close()
