"""Corrected sharing (F-TIS): peers' sampling log-probs on the wire, checked on receipt, and the
truncated importance weights and KL filter of the update, against values computed by hand."""

from __future__ import annotations

import base64
import dataclasses
import math
import struct
from collections import Counter
from types import SimpleNamespace

import msgpack
import pytest
import torch
from hivemind.dht.routing import DHTID
from hivemind.dht.validation import DHTRecord

import tests.legacy_format2_reader as legacy
from sapo_core.batch import BatchRules, training_batch
from sapo_core.config import ConfigError, TaskConfig, TrainConfig
from sapo_core.hooks import NullHooks
from sapo_core.rollouts import Completion, Group
from sapo_core.swarm import validation
from sapo_core.swarm.keys import KeySpace
from sapo_core.swarm.publish import fit_record
from sapo_core.swarm.records import (
    LOGPROB_BOUND,
    Record,
    RecordError,
    WireGroup,
    decode_logprobs,
    decode_record,
    encode_logprobs,
    encode_record,
)
from sapo_core.swarm.validation import ReasonCounter, SwarmSchemaValidator
from sapo_core.swarm.verify import JUNK_REASONS, CompletionCutter, VerifyLimits, verify_record
from sapo_core.tasks import TaskSet
from sapo_core.trainer import Trainer, TrainSequence, tis_weights

from helpers import small_policy

PEER = "QmPeer"
NAN = float("nan")


@pytest.fixture(scope="module")
def tasks() -> TaskSet:
    return TaskSet(TaskConfig(), seed=5)


@pytest.fixture(scope="module")
def question(tasks):
    return tasks.sample_questions(0, 1)[0]


def _wire(question, completions, logprobs=None) -> WireGroup:
    n = len(completions)
    return WireGroup(question.id, question.text, question.answer, tuple(completions), (True,) * n, logprobs)


def _record(*groups) -> Record:
    return Record("s", 1, PEER, 7, tuple(groups))


def _word_cutter(max_tokens: int = 8) -> CompletionCutter:
    """One token per space-separated word: counts are easy to reason about."""
    words: dict[str, int] = {}

    def encode(text):
        return [words.setdefault(w, len(words)) for w in text.split(" ")] if text else []

    def decode(ids):
        inverse = {v: k for k, v in words.items()}
        return " ".join(inverse[i] for i in ids)

    return CompletionCutter(encode, decode, max_tokens=max_tokens, max_chars_per_token=16)


# --- the wire -----------------------------------------------------------------------------------


def test_logprobs_round_trip_to_a_thousandth_of_a_nat_and_clamp_to_what_is_plausible():
    sent = [-0.0004, -1.2345, -7.0, -39.9994, -55.0, 0.3, NAN, float("-inf")]
    got = decode_logprobs(encode_logprobs(sent))
    assert got[:4] == pytest.approx([0.0, -1.2345, -7.0, -39.999], abs=6e-4)
    assert got[4:] == (-LOGPROB_BOUND, 0.0, -LOGPROB_BOUND, -LOGPROB_BOUND)  # clamped, never refused
    assert len(encode_logprobs([-1.0] * 64)) == 172  # 2 bytes a token in base64: ~2.7 characters


def test_a_record_carries_logprobs_per_completion_and_an_older_reader_still_reads_it(question):
    with_lps = _wire(question, ["Answer: 7", "Answer: 8 no"], ((-0.5, -1.25), (-2.0, -0.125, -3.5)))
    without = _wire(question, ["a", "b"])
    payload = encode_record(_record(with_lps, without))
    new = decode_record(payload, "s")
    assert new.groups[0].logprobs == ((-0.5, -1.25), (-2.0, -0.125, -3.5))
    assert new.groups[1].logprobs is None
    # a node released before the field decodes the same record, and simply does not see it
    old = legacy.decode_record(payload, "s")
    assert [g.completions for g in old.groups] == [g.completions for g in new.groups]
    assert old.peer_id == PEER and old.round == 7 and old.receipts == ()
    # a record without log-probs is byte for byte what older nodes send, and reads as before
    plain = encode_record(_record(without))
    assert "lp" not in msgpack.unpackb(plain)
    assert decode_record(plain, "s").groups[0].logprobs is None


def test_an_older_nodes_validator_stores_a_new_record_so_no_replica_is_lost(question, monkeypatch):
    """The DHT schema validator an installed node runs, with its frozen reader in place of ours."""
    ks = KeySpace("s", 60.0, 4)
    window = ks.window_at(1_000_000.0)
    lps = ((-0.5, -1.25), (-2.0, -0.125))
    payload = encode_record(Record("s", window, PEER, 7, (_wire(question, ["Answer: 7", "x y"], lps),)))
    owner = validation.owner_tag(b"ssh-rsa AAAA")
    record = DHTRecord(
        key=DHTID.generate(source=ks.record_key(window, PEER)).to_bytes(),
        subkey=msgpack.packb(owner, use_bin_type=True),
        value=msgpack.packb(payload, use_bin_type=True),
        expiration_time=1_000_000.0 + 60.0,
    )
    monkeypatch.setattr(validation, "owner_peer_id", lambda subkey: PEER)
    counts = ReasonCounter()
    ours = SwarmSchemaValidator(ks, counts, clock=lambda: 1_000_000.0)
    assert ours.validate(record), counts.snapshot()
    for name in ("decode_any", "Record", "IndexEntry", "RecordError"):
        monkeypatch.setattr(validation, name, getattr(legacy, name))
    assert ours.validate(record), counts.snapshot()  # the older reader accepts it too
    assert counts.snapshot() == {}


@pytest.mark.parametrize(
    "lp, why",
    [
        ([[-0.5, -1.0], None], "floats, not the wire's strings"),
        ([["!!!!", "AAAA"]], "not base64"),
        ([["AAA=", "AAAA"]], "odd byte count"),
        ([["AAAA"]], "one entry for two completions"),
        ([None, None], "two entries for one group"),
        ("AAAA", "not a list"),
    ],
)
def test_malformed_logprobs_make_the_record_malformed(question, lp, why):
    obj = msgpack.unpackb(encode_record(_record(_wire(question, ["a", "b"]))))
    obj["lp"] = lp
    with pytest.raises(RecordError) as e:
        decode_record(msgpack.packb(obj, use_bin_type=True), "s")
    assert e.value.reason == "malformed", why


def test_fit_record_publishes_the_samplers_logprobs_and_cuts_them_with_their_completions(question):
    def completion(i, n):
        return Completion(f"word{i} " * n, list(range(n)), [-0.25 * (k + 1) for k in range(n)], True, float(i % 2))

    g = Group(question, [completion(i, 3) for i in range(4)])  # rewards 0, 1, 0, 1: signal
    fitted = fit_record("s", 1, PEER, 0, [g])
    (wire,) = decode_record(fitted.payload, "s").groups
    assert wire.logprobs == ((-0.25, -0.5, -0.75),) * 4
    # a sampler without log-probs, with unknown (NaN) ones, or a count that does not match: text only
    for lps in (None, [-0.5, NAN, -0.5], [-0.5]):
        g.completions[1].sample_logprobs = lps
        assert decode_record(fit_record("s", 1, PEER, 0, [g]).payload, "s").groups[0].logprobs is None
    # a group too large for the limit keeps whole completions, each with its own log-probs
    big = Group(question, [completion(i, 2000) for i in range(8)])
    cut = fit_record("s", 1, PEER, 0, [big], max_bytes=40 * 1024)
    (kept,) = decode_record(cut.payload, "s").groups
    assert 2 <= len(kept.completions) < 8 and len(kept.logprobs) == len(kept.completions)
    assert all(len(x) == 2000 for x in kept.logprobs)


# --- on receipt ---------------------------------------------------------------------------------


def test_logprobs_that_line_up_with_our_tokens_ride_on_the_completion(tasks, question):
    right = f"Answer: {question.answer}"
    words = "one two three four five six seven eight nine ten"
    texts = [right, "Answer: -12345", words, "a b c d e f g h i j k"]
    lps = ((-0.1, -0.2), (-1.0, -2.0, -3.0), tuple(-0.01 * k for k in range(1, 11)), (-0.5,) * 5)
    verdict = verify_record(_record(_wire(question, texts, lps)), tasks, PEER, VerifyLimits(cutter=_word_cutter(8)))
    assert not verdict.rejected
    (group,) = verdict.accepted
    ok, other_tokenizer, cut, cut_other = group.completions
    assert ok.sample_logprobs == [-0.1, -0.2] and not ok.logprobs_spread
    # 3 log-probs for our 2 tokens (another tokenizer): the text's total -6, spread over ours
    assert other_tokenizer.sample_logprobs == [-3.0, -3.0] and other_tokenizer.logprobs_spread
    assert cut.sample_logprobs == pytest.approx([-0.01 * k for k in range(1, 9)])  # cut with the text
    assert cut_other.sample_logprobs is None  # cut, and not lined up: no total to spread, uncorrected
    assert verdict.unaligned == 2 and verdict.cut == 2


@pytest.mark.parametrize(
    "bad",
    [
        (-0.5, -LOGPROB_BOUND - 0.001),  # beyond the bound: no honest sampler sends it
        (-0.5,) * 40,  # more log-probs than the text has bytes
    ],
)
def test_implausible_logprobs_refuse_the_group_as_junk(tasks, question, bad):
    right = f"Answer: {question.answer}"
    wire = _wire(question, [right, "Answer: -12345"], (bad, (-0.5, -0.5)))
    verdict = verify_record(_record(wire), tasks, PEER, VerifyLimits(cutter=_word_cutter()))
    assert verdict.accepted == [] and verdict.rejected == Counter({"bad_logprobs": 1})
    assert "bad_logprobs" in JUNK_REASONS and verdict.junk  # a strike against the peer


def test_values_beyond_the_bound_reach_verification_from_the_wire(tasks, question):
    """The encoding holds up to 65.535 nats: a lie is decodable, then refused per group."""
    lie = base64.b64encode(struct.pack("<2H", 100, 50_000)).decode()
    obj = msgpack.unpackb(encode_record(_record(_wire(question, [f"Answer: {question.answer}", "Answer: 1"]))))
    obj["lp"] = [[lie, encode_logprobs([-0.5, -0.5])]]
    record = decode_record(msgpack.packb(obj, use_bin_type=True), "s")
    assert record.groups[0].logprobs[0] == (-0.1, -50.0)
    assert verify_record(record, tasks, PEER).rejected == Counter({"bad_logprobs": 1})


def test_a_peers_logprobs_travel_to_the_update_marked_as_a_peers(question):
    tok = SimpleNamespace(eos_token_id=99)
    policy = SimpleNamespace(tokenizer=tok, encode_completion=lambda text: [1] * len(text.split()))
    peer = Group(
        question,
        [
            Completion("a b", [3, 4], [-0.5, -1.5], True, 1.0),
            Completion("c", [5], None, False, 0.0),
            Completion("d", [6], [-2.0], False, 0.0, logprobs_spread=True),
        ],
        source=PEER,
    )
    batch = training_batch(policy, lambda q: [7, 8], [], [], [peer], BatchRules(64, True, 0))
    first, second, third = batch.sequences
    assert first.peer and second.peer and third.peer and third.spread and not first.spread
    assert first.completion_ids == [3, 4, 99] and first.sample_logprobs[:2] == [-0.5, -1.5]
    assert math.isnan(first.sample_logprobs[2])  # the stop token's was not sent
    assert second.sample_logprobs is None


# --- the weights ------------------------------------------------------------------------------


def test_tis_weights_and_the_kl_filter_by_hand():
    old = torch.tensor([-1.0, -2.0, -0.5, -3.0, -1.0, -1.0])
    behaviour = torch.tensor([NAN, -1.5, -0.5, -1.0, NAN, -10.0])
    peer = torch.tensor([False, True, True, True, True, True])
    seq = torch.tensor([0, 1, 1, 2, 2, 3])
    adv = torch.tensor([1.0, 0.5, -1.0, 0.2])
    w, stats = tis_weights(old, behaviour, peer, seq, adv, cap=2.0, kl_max=0.5)
    # token 0: ours, 1. Tokens 1, 2 (advantage > 0): exp(-2 + 1.5) = 0.6065, exp(0) = 1.
    # Sequence 2 (advantage < 0): token 3 r = exp(-2) = 0.1353, k3 = r - 1 - log r = 1.1353 > 0.5:
    # the whole completion is left out, token 4 (no log-prob sent) with it.
    # Token 5: r = exp(9), truncated to C = 2 (advantage > 0: kept however far it is).
    assert w.tolist() == pytest.approx([1.0, math.exp(-0.5), 1.0, 0.0, 0.0, 2.0], abs=1e-6)
    assert stats["peer_tokens"] == 5 and stats["corrected_tokens"] == 4 and stats["truncated_tokens"] == 1
    assert stats["dropped_sequences"] == 1 and stats["kl_sequences"] == 3
    k3 = [math.exp(-0.5) - 1 + 0.5, 0.0]
    kl = [sum(k3) / 2, math.exp(-2) - 1 + 2, math.exp(9) - 1 - 9]
    assert stats["kl_sum"] == pytest.approx(sum(kl), rel=1e-5)
    assert stats["weight_sum"] == pytest.approx(math.exp(-0.5) + 1 + 2, abs=1e-6)


def test_spread_logprobs_weigh_every_token_by_the_texts_geometric_mean_ratio():
    """Another tokenizer: the peer's total -3 over our two tokens (-1.5 each). Per token the
    log-ratios would be +0.5 and -1.5; spread, both take their mean -0.5: the whole text's
    exp((sum ours - sum peer) / 2). The stop token (no log-prob) stays out of the mean."""
    old = torch.tensor([-1.0, -3.0, -0.2, -1.0, -3.0])
    behaviour = torch.tensor([-1.5, -1.5, NAN, -1.5, -1.5])
    peer = torch.ones(5, dtype=torch.bool)
    seq = torch.tensor([0, 0, 0, 1, 1])
    spread = torch.tensor([True, True, True, False, False])
    w, stats = tis_weights(old, behaviour, peer, seq, torch.tensor([1.0, 1.0]), 2.0, 0.5, spread)
    assert w.tolist() == pytest.approx([math.exp(-0.5), math.exp(-0.5), 1.0, math.exp(0.5), math.exp(-1.5)], abs=1e-6)
    k3 = math.exp(-0.5) - 1 + 0.5
    assert stats["kl_sum"] == pytest.approx(k3 + (math.exp(0.5) - 1 - 0.5 + math.exp(-1.5) - 1 + 1.5) / 2, rel=1e-5)


def _peer_update(correction: str, advantage: float, claimed: float | None) -> tuple[dict, dict]:
    """One step on one peer completion whose sender claims `claimed` for every token."""
    pol = small_policy()
    cfg = TrainConfig(
        precision="fp32", steps_per_round=1, max_grad_norm=0.0, learning_rate=1e-9, peer_correction=correction
    )
    ids = [11, 12, 13, 14]
    lps = None if claimed is None else [claimed] * len(ids)
    out = Trainer(pol, cfg).update([TrainSequence([5, 6, 7], ids, advantage, lps, peer=True)], NullHooks())
    return out, {n: p.grad.clone() for n, p in pol.model.named_parameters() if p.requires_grad}


def test_a_lying_peer_moves_a_tokens_weight_to_at_most_the_cap():
    """Claiming every token was nearly impossible for it (-40 nats) makes each ratio huge: the
    weight stops at C = 2, so the lie buys at most twice the plain update, never more."""
    _, plain = _peer_update("none", 1.0, None)
    out, lied = _peer_update("tis", 1.0, -LOGPROB_BOUND)
    for n in plain:
        assert torch.allclose(lied[n], 2.0 * plain[n], atol=1e-7, rtol=1e-4), n
    assert out["train/peer_weight_mean"] == 2.0 and out["train/peer_truncated_frac"] == 1.0
    # the same lie on a completion with negative advantage: far from our policy, left out
    out, dropped = _peer_update("tis", -1.0, -LOGPROB_BOUND)
    assert out["train/peer_dropped"] == 1.0 and out["loss/policy"] == 0.0
    assert all(float(g.abs().max()) == 0.0 for g in dropped.values())


def test_without_logprobs_or_without_correction_a_peer_trains_as_before():
    _, plain = _peer_update("none", 1.0, None)
    out, unsent = _peer_update("tis", 1.0, None)  # an older peer: no log-probs
    _, ignored = _peer_update("none", 1.0, -3.0)  # correction off: log-probs unused
    for n in plain:
        assert torch.equal(unsent[n], plain[n]) and torch.equal(ignored[n], plain[n]), n
    assert out["train/peer_uncorrected"] == 1.0  # one peer completion without any log-prob sent
    assert "sampler/logprob_drift" not in out  # a peer's log-probs never count as our sampler's drift


def test_the_correction_settings_are_checked():
    for bad in ({"peer_correction": "is"}, {"peer_ratio_cap": 0.5}, {"peer_kl_max": 0.0}):
        with pytest.raises(ConfigError):
            TrainConfig(**bad)
    assert dataclasses.replace(TrainConfig(), peer_correction="tis").peer_ratio_cap == 2.0


# --- versions announced in index entries -------------------------------------------------------


def test_index_entries_announce_the_app_version_and_older_readers_ignore_it():
    from sapo_core.swarm.records import IndexEntry, decode_index, encode_index

    entry = IndexEntry("s", 5, 3, PEER, 9, 2, 1, 4000, "0.2.0")
    payload = encode_index(entry)
    assert decode_index(payload, "s") == entry
    old = legacy.decode_index(payload, "s")  # an installed node: it decodes, and has no field for it
    assert (old.peer_id, old.round, old.record_bytes) == (PEER, 9, 4000)
    assert decode_index(encode_index(dataclasses.replace(entry, app_version="")), "s").app_version == ""
    obj = msgpack.unpackb(payload)
    for bad in ("x" * 33, "1.0; rm", 7):
        obj["av"] = bad
        with pytest.raises(RecordError, match="app version"):
            decode_index(msgpack.packb(obj, use_bin_type=True), "s")


@pytest.mark.parametrize(
    "theirs, ours, newer",
    [
        ("0.2.0", "0.1.0", True),
        ("0.10.0", "0.9.3", True),
        ("0.1.0", "0.1.0", False),
        ("0.1.1+local", "0.1.0", True),
        ("0.1.0-rc1", "0.1.0", False),
        ("1.0.0", "0.1.0", True),
        ("banana", "0.1.0", False),
        ("", "0.1.0", False),
    ],
)
def test_which_versions_are_newer(theirs, ours, newer):
    from sapo_core.swarm.versions import newer_version

    assert newer_version(theirs, ours) is newer


def test_a_newer_version_is_said_once_each():
    from sapo_core.swarm.versions import version_notice

    seen: set[str] = set()
    said = version_notice("0.2.0", "0.1.0", seen)
    assert said and "SAPO Swarm 0.2.0, this node 0.1.0: update" in said
    assert version_notice("0.2.0", "0.1.0", seen) is None  # once
    assert version_notice("0.0.9", "0.1.0", seen) is None  # older: nothing to say
    assert version_notice("0.3.0", "0.1.0", seen) is not None
