"""The wire format (records.py) and the key space (keys.py): round trips, limits, refusals."""

from __future__ import annotations

import random
from collections import Counter

import msgpack
import pytest

from sapo_core.rollouts import Completion, Group, Question, QuestionId
from sapo_core.swarm.keys import PROTOCOL_VERSION, KeySpace
from sapo_core.swarm.publish import fit_record
from sapo_core.swarm.records import (
    FORMAT_VERSION,
    MAX_RECORD_BYTES,
    IndexEntry,
    Record,
    RecordError,
    WireGroup,
    decode_any,
    decode_index,
    decode_record,
    encode_index,
    encode_record,
)


def _group(i: int, rewards: list[float], chars: int = 40) -> Group:
    q = Question(QuestionId("basic_arithmetic", "0123456789abcdef", 7, i), f"What is {i} + 1?", str(i + 1))
    return Group(q, [Completion(text=(f"c{k} " * chars)[:chars], reward=r) for k, r in enumerate(rewards)])


def _record(groups=()) -> Record:
    return Record("swarm-a", 12, "QmPeer", 3, tuple(groups))


def _raw(**over) -> bytes:
    obj = {
        "v": FORMAT_VERSION,
        "p": PROTOCOL_VERSION,
        "k": "rec",
        "s": "swarm-a",
        "w": 12,
        "id": "QmPeer",
        "r": 3,
        "g": [["basic_arithmetic", "0123456789abcdef", 7, 1, "q", "a", ["x", "y"], [True, False]]],
        "rc": [["QmOther", 2, 0]],
    }
    obj.update(over)
    return msgpack.packb({k: v for k, v in obj.items() if v is not None}, use_bin_type=True)


def _v1_record() -> bytes:
    """A record exactly as version 1 wrote it (7-item groups, no finished flags, no receipts)."""
    return msgpack.packb(
        {
            "v": 1,
            "p": 1,
            "k": "rec",
            "s": "swarm-a",
            "w": 12,
            "id": "QmPeer",
            "r": 3,
            "g": [["basic_arithmetic", "0123456789abcdef", 7, 1, "q", "a", ["x", "y"]]],
        },
        use_bin_type=True,
    )


def test_record_round_trip():
    wire = WireGroup(
        QuestionId("bf", "ffff", 1, 2), "question ü", "answer", ("one", "two", "three"), (True, False, True)
    )
    record = Record("swarm-a", 12, "QmPeer", 3, (wire,), (("QmOther", 2, 0), ("QmThird", 9, 63)))
    assert decode_record(encode_record(record), "swarm-a") == record
    assert decode_record(_raw(), "swarm-a").groups[0].finished == (True, False)


def test_index_round_trip_and_decode_any():
    entry = IndexEntry("swarm-a", 12, 5, "QmPeer", 3, 4, 2, 18000)
    payload = encode_index(entry)
    assert len(payload) < 200
    assert decode_index(payload, "swarm-a") == entry
    assert decode_any(payload, "swarm-a") == entry
    small_record = _record()
    assert decode_any(encode_record(small_record), "swarm-a") == small_record


def test_an_index_entry_says_its_model_and_held_out_figure_and_a_bad_one_is_refused():
    entry = IndexEntry("swarm-a", 12, 5, "QmPeer", 3, 4, 2, 18000, "0.1.0", "smollm2-135m-instruct", (40, 0.3125, 384))
    payload = encode_index(entry)
    assert len(payload) < 250
    got = decode_index(payload, "swarm-a")
    assert got.model == "smollm2-135m-instruct" and got.held_out == (40, 0.312, 384)  # thousandths on the wire
    raw = msgpack.unpackb(payload)
    for key, bad in [
        ("m", "<script>"),
        ("m", "x" * 65),
        ("m", 5),
        ("ho", [40, 1001, 384]),  # a solve rate above 1
        ("ho", [40, 312, 0]),  # over no completions
        ("ho", [-1, 312, 384]),
        ("ho", [40, 312.5, 384]),
        ("ho", [40, 312]),
        ("ho", "0.31"),
    ]:
        with pytest.raises(RecordError) as e:
            decode_index(msgpack.packb({**raw, key: bad}), "swarm-a")
        assert e.value.reason == "malformed", (key, bad)
    # both keys are optional: an older node's entry has neither
    older = {k: v for k, v in raw.items() if k not in ("m", "ho")}
    assert decode_index(msgpack.packb(older), "swarm-a") == IndexEntry(
        "swarm-a", 12, 5, "QmPeer", 3, 4, 2, 18000, "0.1.0"
    )


@pytest.mark.parametrize(
    "payload, reason",
    [
        (b"\xc1\xc1\xc1", "malformed"),  # not msgpack
        (msgpack.packb([1, 2, 3]), "malformed"),  # not a map
        ("a string", "malformed"),
        (_raw(v=FORMAT_VERSION - 1), "wrong_version"),  # a v1 record (old and new never half-mix)
        (_v1_record(), "wrong_version"),
        (_raw(p=PROTOCOL_VERSION + 1), "wrong_version"),
        (_raw(s="other-swarm"), "wrong_swarm"),
        (_raw(k="idx"), "malformed"),
        (_raw(w="12"), "malformed"),
        (_raw(r=-1), "malformed"),
        (_raw(id=""), "malformed"),
        (_raw(g=None), "malformed"),
        (_raw(g=[["basic_arithmetic", "d", 7, 1, "q", "a", ["only one"], [True]]]), "malformed"),
        (_raw(g=[["basic_arithmetic", "d", 7, 1, "q", "a", ["x", 5], [True, True]]]), "malformed"),
        (_raw(g=[["basic_arithmetic", "d", True, 1, "q", "a", ["x", "y"], [True, True]]]), "malformed"),
        (_raw(g=[["basic_arithmetic", "d", 7, 1, "q", "a", ["x", "y"]]]), "malformed"),  # v1's 7 items
        (_raw(g=[["basic_arithmetic", "d", 7, 1, "q", "a", ["x", "y"], [True]]]), "malformed"),
        (_raw(g=[["basic_arithmetic", "d", 7, 1, "q", "a", ["x", "y"], [1, 0]]]), "malformed"),
        (_raw(g=[["", "d", 7, 1, "q", "a", ["x", "y"], [True, True]]]), "malformed"),
        (_raw(g=[["b", "d", 7, 1, "q", "a", ["x", "y"], [True, True]]] * 65), "malformed"),
        (_raw(rc=None), "malformed"),
        (_raw(rc=[["QmX", 1, 0]] * 65), "malformed"),
        (_raw(rc=[["QmX", -1, 0]]), "malformed"),
        (_raw(rc=[["QmX", 1, 64]]), "malformed"),
        (_raw(rc=[["QmX", 1]]), "malformed"),
        (_raw(rc=[["", 1, 0]]), "malformed"),
        (_raw(extra=msgpack.ExtType(1, b"x")), "malformed"),
        (_raw() + b"\x00", "malformed"),  # trailing bytes
        (b"\x00" * (MAX_RECORD_BYTES + 1), "oversized"),
    ],
)
def test_bad_records_are_refused_with_their_reason(payload, reason):
    with pytest.raises(RecordError) as err:
        decode_record(payload, "swarm-a")
    assert err.value.reason == reason


def test_random_bytes_only_ever_raise_record_error():
    rng = random.Random(0)
    good = _raw()
    for _ in range(2000):
        blob = bytearray(good)
        for _ in range(rng.randint(1, 6)):
            blob[rng.randrange(len(blob))] = rng.randrange(256)
        try:
            decode_any(bytes(blob[: rng.randint(0, len(blob))]), "swarm-a")
        except RecordError:
            pass


def test_fit_record_keeps_everything_that_fits_signal_first():
    flat, signal = _group(0, [1.0] * 8), _group(1, [0, 1] * 4)
    fitted = fit_record("swarm-a", 1, "QmPeer", 0, [flat, signal])
    assert [g.question_id.index for g in fitted.record.groups] == [1, 0]
    assert fitted.signal_groups == 1 and fitted.dropped_groups == 0
    assert decode_record(fitted.payload, "swarm-a") == fitted.record


def test_fit_record_carries_finished_flags_and_bounded_receipts():
    g = _group(0, [0, 1, 0, 1])
    g.completions[1].finished = False
    receipts = [("QmA", 3, i % 64) for i in range(70)] + [("", 1, 1), ("QmB", -1, 0), ("QmC", 1, 64)]
    fitted = fit_record("swarm-a", 1, "QmPeer", 0, [g], receipts=receipts)
    decoded = decode_record(fitted.payload, "swarm-a")
    assert decoded.groups[0].finished == (True, False, True, True)
    assert len(decoded.receipts) == 64 and all(r[0] == "QmA" for r in decoded.receipts)


def test_fit_record_never_exceeds_the_limit():
    groups = [_group(i, [0, 1] * 4, chars=3000) for i in range(6)]  # ~24 KB each
    fitted = fit_record("swarm-a", 1, "QmPeer", 0, groups, max_bytes=64 * 1024)
    assert len(fitted.payload) <= 64 * 1024
    assert 0 < len(fitted.record.groups) < 6
    assert fitted.dropped_groups == 6 - len(fitted.record.groups)
    # never above the hard limit, whatever is asked
    huge = [_group(i, [0, 1] * 4, chars=9000) for i in range(8)]
    assert len(fit_record("s", 1, "QmPeer", 0, huge, max_bytes=10**9).payload) <= MAX_RECORD_BYTES


def test_fit_record_cuts_a_single_huge_group_to_whole_completions():
    big = _group(0, [0, 1] * 4, chars=12000)  # ~96 KB alone
    fitted = fit_record("swarm-a", 1, "QmPeer", 0, [big], max_bytes=40 * 1024)
    (kept,) = fitted.record.groups
    assert 2 <= len(kept.completions) < 8
    assert all(len(c) == 12000 for c in kept.completions)  # whole texts, never truncated
    assert fitted.dropped_completions == 8 - len(kept.completions)


def test_fit_record_leaves_out_what_peers_would_refuse():
    too_long = _group(0, [0, 1], chars=40 * 1024)
    fitted = fit_record("swarm-a", 1, "QmPeer", 0, [too_long, _group(1, [0, 1])])
    assert [g.question_id.index for g in fitted.record.groups] == [1]
    decode_record(fitted.payload, "swarm-a")


# --- keys -------------------------------------------------------------------------------------


def test_keys_name_every_swarm_wide_setting():
    a = KeySpace("swarm-a", 300.0, 16)
    assert a.record_key(5, "QmX") != KeySpace("swarm-b", 300.0, 16).record_key(5, "QmX")
    assert a.index_key(5, 1) != KeySpace("swarm-a", 120.0, 16).index_key(5, 1)
    assert a.index_key(5, 1) != KeySpace("swarm-a", 300.0, 32).index_key(5, 1)
    assert f"p{PROTOCOL_VERSION}" in a.prefix


def test_windows_and_expiration():
    ks = KeySpace("s", 300.0, 16)
    assert ks.window_at(0) == 0 and ks.window_at(299.9) == 0 and ks.window_at(300) == 1
    assert ks.readable_windows(650) == (2, 1)
    # a value written in window w is still alive when the next window reads it
    assert ks.expiration(599) > ks.window_end(2)
    assert ks.window_is_current(2, 650) and ks.window_is_current(0, 650) and ks.window_is_current(3, 650)
    assert not ks.window_is_current(-1, 650) and not ks.window_is_current(4, 650)


def test_shards_spread_writers_and_move_each_window():
    ks = KeySpace("s", 300.0, 16)
    peers = [f"QmPeer{i}" for i in range(1600)]
    counts = Counter(ks.shard_of(p, 7) for p in peers)
    assert set(counts) == set(range(16))
    assert max(counts.values()) < 2 * 1600 / 16
    moved = sum(ks.shard_of(p, 7) != ks.shard_of(p, 8) for p in peers)
    assert moved > 1600 * 0.8
