"""Hostile peers (docs/swarm.md, 'Hostile peers') against a real victim: real DHT nodes on
loopback, the victim built as `Node` builds its source with every `SwarmConfig` default, the
project's own verification, an honest peer beside it, and attackers holding valid identities of
their own (identities are free).

Each attack class of the issue is reproduced here; the figures each test prints (run with -s)
are the ones the issue asks for.
"""

from __future__ import annotations

import dataclasses
import random
import time
from pathlib import Path

import pytest

from sapo_core.config import SwarmConfig, TaskConfig
from sapo_core.swarm.source import open_swarm
from sapo_core.tasks import TaskSet

from helpers import RecordingHooks, attacker_store, honest_groups, signed_record

pytestmark = pytest.mark.network

SWARM = "attacks"


def _default_config(**over) -> SwarmConfig:
    """Every default, on loopback (what Node opens, apart from the address and the name)."""
    return SwarmConfig(swarm_name=SWARM, host_maddrs=["/ip4/127.0.0.1/tcp/0"], **over)


@pytest.fixture(scope="module")
def verifier() -> TaskSet:
    return TaskSet(TaskConfig(), seed=0)


@pytest.fixture(scope="module")
def cutter():
    """The embedded model's tokenizer and the default max_new_tokens, as `Node` gives its source."""
    from sapo_core import modelfiles, paths
    from sapo_core.config import SamplerConfig
    from sapo_core.policy import load_tokenizer
    from sapo_core.swarm.verify import CompletionCutter

    tokenizer = load_tokenizer(modelfiles.embedded_gguf_path(), paths.converted_models_dir())
    return CompletionCutter.for_tokenizer(tokenizer, SamplerConfig().max_new_tokens)


@pytest.fixture(scope="module")
def world(tmp_path_factory, verifier, cutter):
    d = tmp_path_factory.mktemp("attacks")
    victim_hooks = RecordingHooks()
    victim = open_swarm(_default_config(), verifier, d / "victim", victim_hooks, cutter=cutter)
    joined = _default_config(initial_peers=[victim.join_address])
    honest = open_swarm(joined, verifier, d / "honest", RecordingHooks())
    attacker = open_swarm(joined, verifier, d / "attacker", RecordingHooks())
    yield {
        "victim": victim,
        "honest": honest,
        "attacker": attacker,
        "hooks": victim_hooks,
        "dir": d,
        "joined": joined,
        "cutter": cutter,
    }
    for node in (victim, honest, attacker):
        node.close()


def _now_window(node) -> tuple[float, int]:
    from hivemind.utils import get_dht_time

    now = get_dht_time()
    return now, node.keyspace.window_at(now)


def _store_signed(attacker, targets, key: str, payload: bytes, subkey, expiration: float) -> list:
    """`payload` under `key`, signed by the attacker's own key, with any subkey it likes."""
    from hivemind.dht.routing import DHTID
    from hivemind.dht.validation import DHTRecord
    from hivemind.utils import MSGPackSerializer

    record = DHTRecord(
        DHTID.generate(source=key).to_bytes(),
        MSGPackSerializer.dumps(subkey),
        MSGPackSerializer.dumps(payload),
        expiration,
    )
    import dataclasses

    signature = attacker.dht._hivemind_key.sign(MSGPackSerializer.dumps(dataclasses.astuple(record)))
    return attacker_store(attacker, targets, key, record.value + b"[signature:" + signature + b"]", subkey, expiration)


def _own_tag(node) -> bytes:
    from sapo_core.swarm.validation import owner_tag

    return owner_tag(node.dht._hivemind_key.get_public_key().to_bytes())


# --- the crash: a subkey of another msgpack type ---------------------------------------------


@pytest.mark.parametrize("kind", ["str", "tuple", "list", "map", "padded", "twice", "non_canonical"])
def test_a_signed_record_with_a_hostile_subkey_never_reaches_gather(world, kind):
    """The crash: a validly signed record whose owner subkey deserialises as a str (or a
    tuple...) was stored, and every gather that read it raised TypeError. Now storage nodes
    refuse it (`bad_subkey`), and the gather goes on with the honest peer's groups."""
    from sapo_core.swarm.publish import fit_record
    from sapo_core.swarm.records import IndexEntry, encode_index

    victim, honest, attacker = world["victim"], world["honest"], world["attacker"]
    ks = victim.keyspace
    now, w = _now_window(victim)
    exp = now + 120
    r = 100 + ["str", "tuple", "list", "map", "padded", "twice", "non_canonical"].index(kind)
    tag = _own_tag(attacker)
    subkey = {
        "str": tag.decode("latin-1"),
        "tuple": (tag,),
        "list": [tag],
        "map": {tag: 1},
        "padded": tag + b"x" * 2000,
        "twice": tag + tag,
        "non_canonical": tag,
    }[kind]
    record = fit_record(SWARM, w, attacker.node_id, r, honest_groups(50, r)).payload
    shard = ks.shard_of(attacker.node_id, w)
    index = encode_index(IndexEntry(SWARM, w, shard, attacker.node_id, r, 3, 3, len(record)))
    before = victim.dht.dht_rejections.snapshot().get("bad_subkey", 0)
    if kind == "non_canonical":  # the same bytes as a bin32: signed as sent, re-serialised by readers
        import struct

        raw_subkey = b"\xc6" + struct.pack(">I", len(tag)) + tag
        stored = _store_raw_subkey(
            attacker, [victim, honest], ks.record_key(w, attacker.node_id), record, raw_subkey, exp
        )
    else:
        stored = _store_signed(attacker, [victim, honest], ks.record_key(w, attacker.node_id), record, subkey, exp)
    _store_signed(attacker, [victim, honest], ks.index_key(w, shard), index, tag, exp)
    honest.publish(r, honest_groups(60, r))
    got = victim.gather(r, 8, random.Random(r))  # raised TypeError before the fix
    stats = victim.stats()
    print(
        f"\nhostile subkey {kind}: stored {stored}, gather returned {len(got)} groups, "
        f"sources {sorted({g.source[:8] for g in got})}"
    )
    assert stored == [[False], [False]]
    assert victim.dht.dht_rejections.snapshot().get("bad_subkey", 0) > before
    assert {g.source for g in got} == {honest.node_id}
    assert stats.get("swarm/gather_errors", 0) == 0


def _store_raw_subkey(attacker, targets, key: str, payload: bytes, raw_subkey: bytes, expiration: float) -> list:
    """Like _store_signed, with the serialised subkey given byte for byte (msgpack allows several
    encodings of one value; hivemind signs the bytes sent)."""
    import dataclasses

    from hivemind.dht.routing import DHTID
    from hivemind.dht.validation import DHTRecord
    from hivemind.p2p import PeerID
    from hivemind.proto import dht_pb2
    from hivemind.utils import MSGPackSerializer

    record = DHTRecord(DHTID.generate(source=key).to_bytes(), raw_subkey, MSGPackSerializer.dumps(payload), expiration)
    signature = attacker.dht._hivemind_key.sign(MSGPackSerializer.dumps(dataclasses.astuple(record)))
    value = record.value + b"[signature:" + signature + b"]"

    async def send():
        protocol = attacker.dht._node.protocol
        out = []
        for t in targets:
            stub = protocol.get_stub(PeerID.from_base58(t.node_id))
            request = dht_pb2.StoreRequest(
                keys=[record.key],
                subkeys=[raw_subkey],
                values=[value],
                expiration_time=[expiration],
                in_cache=[False],
                peer=protocol.node_info,
            )
            response = await stub.rpc_store(request, timeout=10)
            out.append(list(response.store_ok))
        return out

    return attacker.dht._call(send(), timeout=30)


def test_values_a_broken_storage_node_could_return_never_raise_in_the_source(world):
    """Values reach the source only through our validators; should one still carry a subkey or a
    value of another type (a node of an older version stored it), the source drops it."""
    from sapo_core.swarm.publish import fit_record
    from sapo_core.swarm.records import IndexEntry

    victim, attacker = world["victim"], world["attacker"]
    now, w = _now_window(victim)
    payload = fit_record(SWARM, w, attacker.node_id, 1, honest_groups(51, 1)).payload
    tag = _own_tag(attacker)
    entry = IndexEntry(SWARM, w, 0, attacker.node_id, 1, 3, 3, len(payload))
    hostile = [
        {tag.decode("latin-1"): (payload, now)},
        {(tag,): (payload, now)},
        {tag: ("text", now)},
        {tag: (payload, float("nan"))},
        {tag: (payload, float("inf"))},
        {tag: None},
        {tag: (payload,)},
        {None: (payload, now)},
        "junk",
        None,
        [tag, payload],
        {tag: (payload, now, 1)},
    ]
    for values in hostile:
        assert victim._verify_peer_record_guarded(entry, values) == [], values
    assert victim._verify_peer_record_guarded(entry, {tag: (payload, now)})  # the well-typed one passes


def test_records_announced_without_signal_cost_no_strike_and_promised_ones_do(world):
    """Most rounds of a small model have no group with signal; its record still carries receipts.
    Such a record, announced as holding no signal, is read without a strike (before: half a
    strike each, and sharing nodes of sapo-experiment ignored each other); one whose entry
    promised signal and that holds none is still `no_signal`, a light strike."""
    from sapo_core.rollouts import Completion, Group
    from sapo_core.swarm.publish import fit_record
    from sapo_core.swarm.records import IndexEntry

    victim, honest = world["victim"], world["honest"]
    now, w = _now_window(victim)
    tasks = TaskSet(TaskConfig(), seed=77)
    flat = [
        Group(q, [Completion(t) for t in ("Answer: -98765", "The answer is -98765")], round=5)
        for q in tasks.sample_questions(5, 2)
    ]
    fitted = fit_record(SWARM, w, honest.node_id, 5, flat)
    assert fitted.signal_groups == 0
    values = {_own_tag(honest): (fitted.payload, now)}
    rep = victim.reputation
    before = (rep._strikes.get(honest.node_id, 0.0), rep.is_trusted(honest.node_id))
    for _ in range(8):  # 8 half strikes would have put it on ignore (3 strikes)
        entry = IndexEntry(SWARM, w, 0, honest.node_id, 5, len(flat), 0, len(fitted.payload))
        assert victim._verify_peer_record_guarded(entry, values) == []
    assert (rep._strikes.get(honest.node_id, 0.0), rep.is_trusted(honest.node_id)) == before
    assert not rep.is_ignored(honest.node_id)
    assert victim._figures["records_without_signal"] >= 8 and rep.rejections[honest.node_id]["zero_advantage"] >= 16
    attacker = world["attacker"]
    lying = fit_record(SWARM, w, attacker.node_id, 5, flat)
    promised = IndexEntry(SWARM, w, 0, attacker.node_id, 5, len(flat), 2, len(lying.payload))
    no_signal = victim._figures["rejected/no_signal"]
    victim._verify_peer_record_guarded(promised, {_own_tag(attacker): (lying.payload, now)})
    assert victim._figures["rejected/no_signal"] == no_signal + 1 and rep.is_suspect(attacker.node_id)


# --- fuzz: signed-but-hostile values through storage, gather and verify ----------------------

_ODD_VALUES = [
    None,
    True,
    False,
    0,
    -1,
    2**63 - 1,
    -(2**63),
    2**64 - 1,
    1.5,
    float("nan"),
    float("inf"),
    float("-inf"),
    "",
    "x",
    "ü" * 5000,
    b"",
    b"\x00" * 100,
    [],
    {},
    [[]],
    {"a": [1, {"b": None}]},
    [None] * 64,
    "9" * 30000,
]


def _valid_record_obj(peer: str, window: int, round: int, question) -> dict:
    from sapo_core.swarm.keys import PROTOCOL_VERSION
    from sapo_core.swarm.records import FORMAT_VERSION

    q = question
    group = [
        q.id.dataset,
        q.id.config_digest,
        q.id.seed,
        q.id.index,
        q.text,
        q.answer,
        [f"Answer: {q.answer}", "Answer: -1"],
        [True, False],
    ]
    return {
        "v": FORMAT_VERSION,
        "p": PROTOCOL_VERSION,
        "k": "rec",
        "s": SWARM,
        "w": window,
        "id": peer,
        "r": round,
        "g": [group],
        "rc": [[peer, 1, 0]],
    }


def hostile_record_payloads(peer: str, window: int, round: int, question) -> list[bytes]:
    """Every field of a valid v2 record swapped for every odd value, every group item likewise,
    completions of every size extreme, NaN/inf wherever a number goes, receipts of every shape."""
    import msgpack

    def pack(obj):
        return msgpack.packb(obj, use_bin_type=True)

    base = _valid_record_obj(peer, window, round, question)
    out = [pack(base)]
    for key in list(base) + ["extra"]:
        for v in _ODD_VALUES:
            out.append(pack({**base, key: v}))
    for pos in range(8):
        for v in _ODD_VALUES:
            g = list(base["g"][0])
            g[pos] = v
            out.append(pack({**base, "g": [g]}))
    g = base["g"][0]
    answer = g[5]
    extremes = [
        [f"Answer: {answer}"] * 64,  # duplicates
        ["", ""],
        ["\x00", "\udfff".encode("utf-8", "surrogatepass").decode("utf-8", "replace")],
        ["Answer" + " " * 32000, f"Answer: {answer}"],
        ["1" * 32760, f"Answer: {answer}"],
        ["<answer>" * 4000, f"Answer: {answer}"],
        [f"\\boxed{{{'{' * 10000}", f"Answer: {answer}"],
        [f"Answer: {answer}" + " x" * 16000, "Answer: -1"],
    ]
    for comps in extremes:
        out.append(pack({**base, "g": [g[:6] + [comps, [True] * len(comps)]]}))
    out.append(pack({**base, "g": [g] * 64}))
    out.append(pack({**base, "g": [g] * 65}))
    for rc in (
        [[peer, float("nan"), 0]],
        [[peer, 1, float("inf")]],
        [[None, 1, 0]],
        [[peer, 1, 0]] * 65,
        [[peer, 2**64 - 1, 0]],
        [peer],
        [[peer, 1, 0, 9]],
    ):
        out.append(pack({**base, "rc": rc}))
    return out


def test_fuzz_hostile_values_through_storage_validators_decode_verify_and_the_source(world, verifier):
    """Nothing raises anywhere; no unexpected exception is even caught (verify_errors 0)."""
    from hivemind.dht.validation import CompositeValidator

    from sapo_core.swarm.records import IndexEntry, RecordError, decode_any
    from sapo_core.swarm.validation import OwnedSignatureValidator, ReasonCounter, SwarmSchemaValidator
    from sapo_core.swarm.verify import VerifyLimits, verify_record

    victim, attacker = world["victim"], world["attacker"]
    ks = victim.keyspace
    now, w = _now_window(victim)
    question = verifier.sample_questions(1, 1)[0]
    payloads = hostile_record_payloads(attacker.node_id, w, 7, question)
    tag = _own_tag(attacker)
    counts = ReasonCounter()
    chain = CompositeValidator(
        [OwnedSignatureValidator(victim.dht._hivemind_key, counts), SwarmSchemaValidator(ks, counts)]
    )
    import dataclasses

    from hivemind.dht.routing import DHTID
    from hivemind.dht.validation import DHTRecord
    from hivemind.utils import MSGPackSerializer

    key = ks.record_key(w, attacker.node_id)
    decoded = stored = 0
    started = time.perf_counter()
    for payload in payloads:
        for expiration in (now + 60, float("nan"), float("inf")):
            record = DHTRecord(
                DHTID.generate(source=key).to_bytes(),
                MSGPackSerializer.dumps(tag),
                MSGPackSerializer.dumps(payload),
                expiration,
            )
            sig = attacker.dht._hivemind_key.sign(MSGPackSerializer.dumps(dataclasses.astuple(record)))
            ok = chain.validate(dataclasses.replace(record, value=record.value + b"[signature:" + sig + b"]"))
            assert ok in (True, False)
            stored += ok
            assert not (ok and expiration != now + 60)
        try:
            rec = decode_any(payload, SWARM)
        except RecordError:
            continue
        decoded += 1
        verify_record(rec, verifier, attacker.node_id, VerifyLimits(cpu_seconds=2.0))
        entry = IndexEntry(SWARM, w, ks.shard_of(attacker.node_id, w), attacker.node_id, 7, 1, 1, len(payload))
        victim._verify_peer_record_guarded(entry, {tag: (payload, now + 60)}, VerifyLimits(cpu_seconds=2.0))
    took = time.perf_counter() - started
    print(
        f"\nfuzz: {len(payloads)} hostile records x 3 expirations through the validator chain, "
        f"{stored} storable, {decoded} decoded and verified, {took:.1f} s"
    )
    assert victim.stats().get("swarm/verify_errors", 0) == 0
    assert stored >= 1 and decoded >= 1  # the valid base record and the extremes that are well formed


def test_fuzz_hostile_values_over_the_network_never_raise_out_of_gather(world, verifier):
    """A sample of the same hostile records, and subkeys of every msgpack type, sent to the victim
    and its honest neighbour by a real attacker; gathers go on returning the honest groups."""
    from sapo_core.swarm.records import IndexEntry, encode_index

    victim, honest, attacker = world["victim"], world["honest"], world["attacker"]
    ks = victim.keyspace
    now, w = _now_window(victim)
    exp = now + 120
    question = verifier.sample_questions(2, 1)[0]
    tag = _own_tag(attacker)
    payloads = hostile_record_payloads(attacker.node_id, w, 300, question)
    rng = random.Random(5)
    sample = [payloads[0]] + rng.sample(payloads[1:], 24)
    subkeys = [tag, tag.decode("latin-1"), (tag,), [tag], {tag: tag}, 5, None, 1.5, float("nan"), True, b"", tag * 3]
    shard = ks.shard_of(attacker.node_id, w)
    index = encode_index(IndexEntry(SWARM, w, shard, attacker.node_id, 300, 1, 1, 100))
    raised = []
    for i, payload in enumerate(sample):
        subkey = subkeys[i % len(subkeys)]
        try:
            _store_signed(attacker, [victim, honest], ks.record_key(w, attacker.node_id), payload, subkey, exp)
        except Exception as e:  # hivemind may refuse to even send some (e.g. an unhashable subkey)
            raised.append(type(e).__name__)
        _store_signed(attacker, [victim, honest], ks.index_key(w, shard), index, tag, exp)
    for r in range(300, 303):
        honest.publish(r, honest_groups(70 + r, r))  # a new round each time: a group is used once
        got = victim.gather(r, 8, random.Random(r))
        assert honest.node_id in {g.source for g in got}, victim.stats()
        assert victim.stats().get("swarm/gather_errors", 0) == 0 and victim.stats().get("swarm/verify_errors", 0) == 0
    print(
        f"\nfuzz over the network: {len(sample)} hostile records stored by a real attacker "
        f"({len(raised)} not even sendable), 3 gathers, no exception"
    )


# --- poison with a right answer ---------------------------------------------------------------


@pytest.fixture
def fresh_attacker(world, verifier, tmp_path):
    """A new identity (free for an attacker): the victim has no history with it."""
    node = open_swarm(world["joined"], verifier, tmp_path / "fresh-attacker", RecordingHooks())
    yield node
    node.close()


def _groups_of(question_texts, questions, round: int) -> list:
    from sapo_core.rollouts import Completion, Group

    return [
        Group(q, [Completion(t, finished=True) for t in texts], round=round)
        for q, texts in zip(questions, question_texts)
    ]


def test_poisoned_completions_are_cut_collapsed_and_one_peer_cannot_fill_the_gather(world, verifier, fresh_attacker):
    """Garbage preambles are scored on what is trained (the cut leaves the garbage alone: reward
    0, never a positive advantage); 64 copies of one completion are one; a peer publishing 60
    valid groups supplies at most ceil(J/2) of them while the honest peer has groups left
    (before that quota it supplied 18 of 20).
    (Injected links pass verification -- the answer is right -- and are the node's likelihood
    floor's to drop: test_node_trains_on_no_poison below.)"""
    victim, honest, attacker = world["victim"], world["honest"], fresh_attacker
    cutter = world["cutter"]
    r = 400
    qs = verifier.sample_questions(r, 60)
    rng = random.Random(3)
    garbage = ["".join(rng.choice("abcdefghij#@%&*{}<>~ ") for _ in range(6000)) for _ in range(4)]
    poisoned = [[f"{garbage[k]}\nAnswer: {q.answer}" for k in range(4)] + ["Answer: -77777"] for q in qs[:3]]
    dupes = [[f"Answer: {q.answer}"] * 63 + ["Answer: -77777"] for q in qs[3:6]]
    valid = [[f"Answer: {q.answer}", f"The answer is {q.answer}", "Answer: -77777"] for q in qs[6:60]]
    attacker.publish(r, _groups_of(poisoned + dupes + valid, qs, r))
    honest.publish(r, honest_groups(80, r, n=12))
    got = victim.gather(r, 20, random.Random(r))
    stats = victim.stats()
    by_peer = {p: sum(g.source == p for g in got) for p in (attacker.node_id, honest.node_id)}
    trained_garbage_positive = 0
    copies = 0
    for g in got:
        mean = sum(g.rewards) / len(g.rewards)
        texts = [c.text for c in g.completions]
        copies += len(texts) - len(set(texts))
        for c in g.completions:
            assert c.token_ids == cutter.encode(c.text)[: cutter.max_tokens]  # scored = trained
            if "#" in c.text and c.reward > mean:
                trained_garbage_positive += 1
    print(
        f"\npoison: J=20 from a 60-group attacker and a 12-group honest peer: {by_peer[attacker.node_id]} "
        f"attacker / {by_peer[honest.node_id]} honest; garbage completions with positive advantage "
        f"{trained_garbage_positive}; duplicate copies returned {copies} "
        f"(collapsed {stats.get('swarm/duplicates_collapsed', 0):.0f}, cut {stats.get('swarm/completions_cut', 0):.0f})"
    )
    assert by_peer[attacker.node_id] <= 10 and by_peer[honest.node_id] >= 10
    assert trained_garbage_positive == 0 and copies == 0
    assert stats["swarm/completions_cut"] >= 12 and stats["swarm/duplicates_collapsed"] >= 3 * 62


# --- CPU ------------------------------------------------------------------------------------


def _bf_questions(n: int, level: int = 1):
    from sapo_core.rollouts import QuestionId
    from sapo_core.tasks import KNOWN_CONFIGS, regenerate

    digest = next(d for d, (ds, lv) in KNOWN_CONFIGS.items() if ds == "bf" and lv == level)
    return [regenerate(QuestionId("bf", digest, 7, i)) for i in range(n)]


@pytest.mark.parametrize("attack", ["spaces", "digits", "bf_copies", "bf_distinct"])
def test_cpu_attacks_cost_a_bounded_gather(world, verifier, attack, fresh_attacker):
    """Before the CPU bounds, answer + 20,000 spaces took 12.7 s to verify, 64 copies of a slow bf question
    22.6 s, both after the gather's deadline and without a strike. Now: a gather stays under
    gather_timeout + 2 s whatever the record holds, and a record over its CPU budget is junk."""
    victim, honest, attacker = world["victim"], world["honest"], fresh_attacker
    r = 500 + ["spaces", "digits", "bf_copies", "bf_distinct"].index(attack)
    if attack in ("spaces", "digits"):
        qs = verifier.sample_questions(r, 6)
        pad = " " * 20000 if attack == "spaces" else "1" * 20000
        texts = [[f"Answer {pad}: {q.answer}", f"Answer: {q.answer}{pad}", f"{pad}/ {q.answer}"] for q in qs]
    else:
        qs = _bf_questions(1) * 64 if attack == "bf_copies" else _bf_questions(64, level=1)
        texts = [[f"Answer: {q.answer}", "Answer: x"] for q in qs]
    attacker.publish(r, _groups_of(texts, qs, r))
    honest.publish(r, honest_groups(90 + r, r))
    strikes_before = victim.reputation._strikes.get(attacker.node_id, 0.0)
    cfg = victim.cfg
    if attack == "bf_distinct":
        # 64 distinct bf questions cost ~1.0-1.1 s of CPU to regenerate on CI's 2-core machine: at
        # the default 1 s budget whether the record goes over depended on the machine; a quarter of
        # it keeps the attack ~4x over budget, while an honest record costs milliseconds
        victim.cfg = dataclasses.replace(cfg, verify_cpu_seconds=0.25)
    started = time.perf_counter()
    try:
        got = victim.gather(r, 8, random.Random(r))
    finally:
        victim.cfg = cfg
    took = time.perf_counter() - started
    stats = victim.stats()
    print(
        f"\ncpu attack {attack}: gather {took:.2f} s (timeout {victim.cfg.gather_timeout:g} s), verify cpu "
        f"{stats.get('swarm/verify_cpu_s', 0):.2f} s, "
        f"cpu_budget rejections {stats.get('swarm/rejected/cpu_budget', 0):.0f}, "
        f"attacker strikes {strikes_before:g} -> {victim.reputation._strikes.get(attacker.node_id, 0.0):g}"
        f"{' (ignored)' if victim.reputation.is_ignored(attacker.node_id) else ''}"
    )
    assert took < victim.cfg.gather_timeout + 2
    assert got  # the gather still delivers (earlier tests' peers may fill the slots beside the honest one)
    if attack == "bf_distinct":
        assert stats.get("swarm/rejected/cpu_budget", 0) > 0


# --- starvation: a 24-identity flood ----------------------------------------------------------


def _sybil(ks, attacker, targets, verifier, kind: str, window: float, exp: float, r: int) -> str:
    """One fresh identity of `kind` (junk, zero, ghost, liar, old_round) with its index entry and,
    except for ghosts, a signed record; returns its peer id."""
    from cryptography.hazmat.primitives.asymmetric import rsa

    from sapo_core.swarm.identity import NodeIdentity
    from sapo_core.swarm.publish import fit_record
    from sapo_core.swarm.records import IndexEntry, encode_index

    fake = NodeIdentity.from_key(Path("-"), rsa.generate_private_key(public_exponent=65537, key_size=2048))
    key = fake.hivemind_key()
    qs = verifier.sample_questions(r + hash(fake.peer_id) % 1000, 4)
    if kind == "junk":  # a wrong answer claimed right
        from sapo_core.rollouts import Completion, Group, Question

        groups = [
            Group(Question(q.id, q.text, "-55555"), [Completion("Answer: -55555"), Completion("Answer: 1")]) for q in qs
        ]
    else:  # no signal at all (no number: partial credit cannot tell them apart)
        groups = _groups_of([["", "..."] for _ in qs], qs, r)
    record_round = r - 5 if kind == "old_round" else r
    payload = fit_record(SWARM, window, fake.peer_id, record_round, groups).payload
    shard = ks.shard_of(fake.peer_id, window)
    claimed = 64 if kind == "liar" else 4
    index = encode_index(IndexEntry(SWARM, window, shard, fake.peer_id, r, 4, min(claimed, 64), len(payload)))
    items = [(ks.index_key(window, shard), index)]
    if kind != "ghost":
        items.append((ks.record_key(window, fake.peer_id), payload))
    for k, v in items:
        value, subkey = signed_record(k, v, key, key, exp)
        assert attacker_store(attacker, targets, k, value, subkey, exp) == [[True]] * len(targets)
    return fake.peer_id


def test_a_24_identity_flood_does_not_starve_the_honest_peer(world, verifier, cutter, tmp_path):
    """Before flood resistance, 8 junk, 8 zero-advantage and 8 ghost identities left the
    honest peer's groups reaching a victim in 3 of 10 rounds. Here a fresh victim (no history
    with anyone) joins during the flood (plus an index liar and a record older than its entry);
    the honest peer publishes every round."""
    victim0, honest, attacker = world["victim"], world["honest"], world["attacker"]
    ks = victim0.keyspace
    now, w = _now_window(victim0)
    exp = now + 2 * ks.window_seconds
    targets = [victim0, honest]
    kinds = ["junk"] * 8 + ["zero"] * 8 + ["ghost"] * 8 + ["liar", "old_round"]
    sybils = {_sybil(ks, attacker, targets, verifier, k, w, exp, 600): k for k in kinds}
    from sapo_core.swarm.verify import VerifyLimits

    victim = open_swarm(world["joined"], verifier, tmp_path / "fresh-victim", RecordingHooks(), cutter=cutter)
    # which peers' verified groups reached the pool the J groups are drawn from: in this module,
    # records other tests left (valid groups from other live peers) also compete for the 4 slots
    # under the per-peer quota, so "used" can miss the honest peer without any starvation
    verified = victim._verify_peer_record_guarded
    reached: set[str] = set()

    def spy(entry, values, limits=VerifyLimits()):
        groups = verified(entry, values, limits)
        reached.update(g.source for g in groups)
        return groups

    victim._verify_peer_record_guarded = spy
    rounds, honest_rounds, used_rounds, ghost_fetches, gather_s = 10, 0, 0, 0, []
    try:
        for i in range(rounds):
            r = 600 + i
            honest.publish(r, honest_groups(100 + r, r))
            reached.clear()
            started = time.perf_counter()
            got = victim.gather(r, 4, random.Random(r))
            gather_s.append(time.perf_counter() - started)
            stats = victim.stats()
            ghost_fetches += stats.get("swarm/records_missing", 0)
            honest_rounds += honest.node_id in reached
            used_rounds += honest.node_id in {g.source for g in got}
            assert all(g.source not in sybils for g in got), [
                (sybils[g.source], g.rewards) for g in got if g.source in sybils
            ]
        ignored = [sybils[p] for p in victim.reputation.ignored() if p in sybils]
        struck = {
            k: sum(1 for p, kk in sybils.items() if kk == k and victim.reputation.is_suspect(p)) for k in set(kinds)
        }
        print(
            f"\nflood of {len(sybils)} identities: honest groups reached the victim in {honest_rounds}/{rounds} "
            f"rounds, used in {used_rounds}/{rounds}; "
            f"ghost fetches {ghost_fetches:.0f} of {rounds * victim.cfg.records_per_gather} slots; struck by kind "
            f"{dict(sorted(struck.items()))}; ignored {len(ignored)}; gather max {max(gather_s):.2f} s"
        )
        assert honest_rounds >= 0.9 * rounds
        assert struck["liar"] + struck["old_round"] + struck["ghost"] + struck["zero"] + struck["junk"] >= 6
    finally:
        victim.close()


# --- the node: poisoned completions trained on --------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("take, judge", [("paper", "policy"), ("mixed", "either")])
def test_node_trains_on_no_poison(world, verifier, tmp_path, monkeypatch, take, judge):
    """A real node (the embedded model) joins the victim's swarm; an attacker publishes right
    answers with injected links and garbage preambles with the answer, an honest peer plain
    right and wrong answers. Over two rounds (~4 min on an idle 2-core machine) the node's update
    sees honest peer text and not one poisoned completion (the cut, the duplicates collapse and the
    likelihood floor). Also under swarm.take = mixed with either judge (our policy or the base
    model): a poisoned right answer is no guide, and a group left without a likely right answer
    is not adopted."""
    from sapo_core.config import NodeConfig
    from sapo_core.node import Node

    monkeypatch.setenv("SAPO_DATA_DIR", str(tmp_path / "data"))
    honest, attacker = world["honest"], world["attacker"]
    cfg = NodeConfig().replace(
        **{
            "run_dir": str(tmp_path / "run"),
            "round.local_groups": 1,
            "round.external_groups": 4,
            "sampler.group_size": 4,
            "round.auto_scale": False,
            "train.steps_per_round": 1,
            "swarm.swarm_name": SWARM,
            "swarm.host_maddrs": ["/ip4/127.0.0.1/tcp/0"],
            "swarm.initial_peers": [world["victim"].join_address],
            "swarm.identity_path": str(tmp_path / "id.key"),
            "swarm.take": take,
            "swarm.likelihood_judge": judge,
        }
    )
    node = Node(cfg)
    node.setup()
    trained: list[str] = []
    real_update = node.trainer.update

    def recording_update(seqs, hooks):  # the real update runs; we only read what it is given
        trained.extend(node.policy.decode(s.completion_ids) for s in seqs if s.sample_logprobs is None)
        return real_update(seqs, hooks)

    node.trainer.update = recording_update
    rng = random.Random(9)
    links = ["See https://free-answers.example.com/q?id={n} for more.", "Win a prize at http://bit.ly/{n}Xq9 !"]
    try:
        metrics = []
        for i in range(2):
            r = 700 + i
            qs = verifier.sample_questions(r, 4)
            poisoned = [
                [
                    f"{rng.choice(links).format(n=rng.randrange(10**6))}\nAnswer: {q.answer}",
                    f"The answer is {q.answer}. {rng.choice(links).format(n=rng.randrange(10**6))}",
                    "Answer: -31337",
                ]
                for q in qs[:2]
            ]
            poisoned += [
                [
                    "".join(rng.choice("abcdefghij#@%&*{}<>~ ") for _ in range(6000)) + f"\nAnswer: {q.answer}",
                    "Answer: -31337",
                ]
                for q in qs[2:]
            ]
            attacker.publish(node.next_round, _groups_of(poisoned, qs, node.next_round))
            honest.publish(node.next_round, honest_groups(200 + i, node.next_round, n=3))
            metrics.append(node.run_round())
    finally:
        node.close()
    poisoned_trained = [t for t in trained if "http" in t or "bit.ly" in t or "#" in t or "{" in t]
    print(
        f"\nnode: {len(trained)} peer completions trained over 2 rounds, poisoned {len(poisoned_trained)}; "
        f"unlikely dropped {sum(m.get('swarm/unlikely', 0) for m in metrics):.0f}; "
        f"external groups {[m['groups/external'] for m in metrics]}"
    )
    assert poisoned_trained == []
    if take == "paper":
        assert trained  # the honest peer's groups were trained on
    else:  # their questions were adopted: as ours where we had spread, with a guide where we failed
        assert sum(m.get("swarm/adopt_offered", 0) for m in metrics) > 0
