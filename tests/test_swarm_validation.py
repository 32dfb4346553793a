"""The DHT's validator chain on records built exactly as hivemind stores them (no network here;
tests/test_swarm.py sends the same forgeries through real DHTs)."""

from __future__ import annotations

import dataclasses
import random

import pytest
from hivemind.dht.routing import DHTID
from hivemind.dht.validation import CompositeValidator, DHTRecord
from hivemind.utils import MSGPackSerializer

from sapo_core.rollouts import QuestionId
from sapo_core.swarm.identity import load_or_create_identity
from sapo_core.swarm.keys import KeySpace
from sapo_core.swarm.records import (
    IndexEntry,
    Record,
    WireGroup,
    encode_index,
    encode_record,
)
from sapo_core.swarm.validation import (
    OwnedSignatureValidator,
    ReasonCounter,
    SwarmSchemaValidator,
    owner_peer_id,
    owner_tag,
)

KS = KeySpace("swarm-a", 300.0, 16)
NOW = 1_000_000.0
WINDOW = KS.window_at(NOW)


@pytest.fixture(scope="module")
def keys(tmp_path_factory):
    d = tmp_path_factory.mktemp("ids")
    ids = {name: load_or_create_identity(d / f"{name}.key") for name in ("alice", "mallory", "reader")}
    return {name: (i, i.hivemind_key()) for name, i in ids.items()}


def _chain(reader_key) -> tuple[CompositeValidator, ReasonCounter]:
    counts = ReasonCounter()
    return CompositeValidator(
        [OwnedSignatureValidator(reader_key, counts), SwarmSchemaValidator(KS, counts, clock=lambda: NOW)]
    ), counts


def _record_payload(peer: str, window: int = WINDOW, swarm: str = "swarm-a") -> bytes:
    g = WireGroup(QuestionId("basic_arithmetic", "abcd", 1, 2), "q", "a", ("x", "y"), (True, True))
    return encode_record(Record(swarm, window, peer, 0, (g,)))


def _dht_record(key: str, payload, owner_key, signer_key=None, expiration: float = NOW + 600) -> DHTRecord:
    """What hivemind's store_many builds and signs (node.py), optionally signed by someone else."""
    subkey = owner_tag(owner_key.get_public_key().to_bytes()) if owner_key is not None else b"plain"
    record = DHTRecord(
        DHTID.generate(source=key).to_bytes(),
        MSGPackSerializer.dumps(subkey),
        MSGPackSerializer.dumps(payload),
        expiration,
    )
    signer = signer_key or owner_key
    if signer is None:
        return record
    signature = signer.sign(MSGPackSerializer.dumps(dataclasses.astuple(record)))
    return dataclasses.replace(record, value=record.value + b"[signature:" + signature + b"]")


def _check(keys, record) -> tuple[bool, dict]:
    chain, counts = _chain(keys["reader"][1])
    return chain.validate(record), counts.snapshot()


def test_owner_signed_record_and_index_pass(keys):
    alice, akey = keys["alice"]
    rec = _dht_record(KS.record_key(WINDOW, alice.peer_id), _record_payload(alice.peer_id), akey)
    assert _check(keys, rec) == (True, {})
    shard = KS.shard_of(alice.peer_id, WINDOW)
    entry = encode_index(IndexEntry("swarm-a", WINDOW, shard, alice.peer_id, 0, 1, 1, 100))
    assert _check(keys, _dht_record(KS.index_key(WINDOW, shard), entry, akey)) == (True, {})
    assert owner_peer_id(rec.subkey) == alice.peer_id


@pytest.mark.parametrize(
    "case, reason",
    [
        ("unsigned", "unsigned"),
        ("signed_by_another_key", "bad_signature"),
        ("tampered_after_signing", "bad_signature"),
        ("subkey_owned_by_someone_else", "wrong_owner"),
        ("replayed_under_another_key", "wrong_key"),
        ("index_in_wrong_shard", "wrong_key"),
        ("old_window", "stale"),
        ("immortal", "expiration"),
        ("other_swarm", "wrong_swarm"),
        ("not_msgpack", "malformed"),
        ("not_bytes", "malformed"),
        ("oversized", "oversized"),
    ],
)
def test_forged_and_broken_records_are_refused_and_counted(keys, case, reason):
    alice, akey = keys["alice"]
    mallory, mkey = keys["mallory"]
    key = KS.record_key(WINDOW, alice.peer_id)
    payload = _record_payload(alice.peer_id)
    if case == "unsigned":
        record = _dht_record(key, payload, None)
    elif case == "signed_by_another_key":  # mallory writes alice's subkey
        record = _dht_record(key, payload, akey, signer_key=mkey)
    elif case == "tampered_after_signing":
        record = _dht_record(key, payload, akey)
        record = dataclasses.replace(record, value=record.value.replace(b"\xa1a", b"\xa1b", 1))
    elif case == "subkey_owned_by_someone_else":  # mallory's own subkey, in alice's name
        record = _dht_record(key, payload, mkey)
    elif case == "replayed_under_another_key":  # mallory's valid record under alice's key
        record = _dht_record(key, _record_payload(mallory.peer_id), mkey)
    elif case == "index_in_wrong_shard":
        shard = (KS.shard_of(mallory.peer_id, WINDOW) + 1) % KS.shards
        entry = encode_index(IndexEntry("swarm-a", WINDOW, shard, mallory.peer_id, 0, 1, 1, 100))
        record = _dht_record(KS.index_key(WINDOW, shard), entry, mkey)
    elif case == "old_window":
        record = _dht_record(
            KS.record_key(WINDOW - 5, mallory.peer_id), _record_payload(mallory.peer_id, WINDOW - 5), mkey
        )
    elif case == "immortal":
        record = _dht_record(
            KS.record_key(WINDOW, mallory.peer_id), _record_payload(mallory.peer_id), mkey, expiration=NOW + 10**7
        )
    elif case == "other_swarm":
        record = _dht_record(
            KS.record_key(WINDOW, mallory.peer_id), _record_payload(mallory.peer_id, swarm="swarm-b"), mkey
        )
    elif case == "not_msgpack":
        record = _dht_record(KS.record_key(WINDOW, mallory.peer_id), b"\xc1junk", mkey)
    elif case == "not_bytes":
        record = _dht_record(KS.record_key(WINDOW, mallory.peer_id), {"a": 1}, mkey)
    else:
        record = _dht_record(KS.record_key(WINDOW, mallory.peer_id), b"\x00" * (300 * 1024), mkey)
    ok, counts = _check(keys, record)
    assert not ok
    assert counts == {reason: 1}


def test_junk_never_raises(keys):
    chain, counts = _chain(keys["reader"][1])
    alice, akey = keys["alice"]
    good = _dht_record(KS.record_key(WINDOW, alice.peer_id), _record_payload(alice.peer_id), akey)
    rng = random.Random(1)
    for _ in range(300):
        fields = {}
        for name in ("key", "subkey", "value"):
            blob = bytearray(getattr(good, name))
            for _ in range(rng.randint(0, 4)):
                blob[rng.randrange(len(blob))] = rng.randrange(256)
            fields[name] = bytes(blob)
        assert chain.validate(dataclasses.replace(good, **fields)) in (True, False)
    assert sum(counts.snapshot().values()) > 250


def _signed_with_subkey(key: str, payload, signer_key, subkey_obj, expiration: float = NOW + 600) -> DHTRecord:
    """A record its owner signed properly, but with any subkey value (a hostile peer's choice)."""
    record = DHTRecord(
        DHTID.generate(source=key).to_bytes(),
        MSGPackSerializer.dumps(subkey_obj),
        MSGPackSerializer.dumps(payload),
        expiration,
    )
    signature = signer_key.sign(MSGPackSerializer.dumps(dataclasses.astuple(record)))
    return dataclasses.replace(record, value=record.value + b"[signature:" + signature + b"]")


@pytest.mark.parametrize("case", ["str", "tuple", "list", "map", "padded", "twice", "huge"])
def test_an_owner_signed_subkey_of_another_type_or_size_is_refused(keys, case):
    """Subkeys deserialising as str/tuple crashed readers (docs/swarm.md, 'Hostile peers');
    padded ones let one owner store unlimited, unbounded subkeys under one key. One canonical
    owner tag per owner only."""
    mallory, mkey = keys["mallory"]
    tag = owner_tag(mkey.get_public_key().to_bytes())
    subkey = {
        "str": tag.decode("latin-1"),
        "tuple": (tag,),
        "list": [tag],
        "map": {tag: 0},
        "padded": tag + b" ",
        "twice": tag + tag,
        "huge": tag + b"x" * 1_500_000,
    }[case]
    record = _signed_with_subkey(KS.record_key(WINDOW, mallory.peer_id), _record_payload(mallory.peer_id), mkey, subkey)
    ok, counts = _check(keys, record)
    assert not ok and counts == {"bad_subkey": 1}
    assert owner_peer_id(MSGPackSerializer.loads(record.subkey)) is None or case in ("padded", "twice")


@pytest.mark.parametrize("expiration", [float("nan"), float("inf"), float("-inf")])
def test_a_non_finite_expiration_is_refused_and_counted(keys, expiration):
    mallory, mkey = keys["mallory"]
    record = _dht_record(
        KS.record_key(WINDOW, mallory.peer_id), _record_payload(mallory.peer_id), mkey, expiration=expiration
    )
    ok, counts = _check(keys, record)
    assert not ok and counts == {"bad_expiration": 1}
    schema_counts = ReasonCounter()
    assert not SwarmSchemaValidator(KS, schema_counts, clock=lambda: NOW).validate(record)
    assert schema_counts.snapshot() == {"bad_expiration": 1}


@pytest.mark.parametrize("subkey", ["text", ("t",), 5, None, b"", b"x" * 5000, [b"[owner:a]"]])
def test_owner_peer_id_of_anything_is_none(subkey):
    assert owner_peer_id(subkey) is None
