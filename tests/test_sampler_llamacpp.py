"""The llama.cpp sampler: real llama.cpp in a real child process, checked against transformers.

Fast tests use a small real Llama (2 layers, width 32) with the embedded model's vocabulary,
exported to GGUF with the embedded model's tokenizer metadata and sampled unquantized, so
llama.cpp (float32 weights, float16 KV cache) and transformers agree to ~0.003 nats/token.
Slow tests use the embedded SmolLM2-135M (Q4_1, converted to F16 for llama.cpp).
"""

from __future__ import annotations

import math
import os
import signal
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from sapo_core.config import SamplerConfig
from sapo_core.hooks import Interrupted, NullHooks
from sapo_core.modelfiles import embedded_gguf_path
from sapo_core.policy import Policy
from sapo_core.sampler import lora_gguf
from sapo_core.sampler.base import SamplerError, SamplingParams
from sapo_core.sampler.guard import describe_exit
from sapo_core.sampler.llamacpp import LlamaCppSampler, llamacpp_available, logprob_drift, trainer_logprobs

from helpers import ATTENTION_AND_DOWN, tiny_llama

AS_IS = SamplerConfig(quantization="as-is", threads=1)


def small_policy(lora: bool = True, seed: int = 0) -> Policy:
    """Weights drawn wide (init range 0.3) so the next-token distributions are peaked, like a real model's."""
    modules = ATTENTION_AND_DOWN if lora else ()
    model = tiny_llama(seed, 49152, modules, init_lora_weights=True, max_position_embeddings=512, initializer_range=0.3)
    model.eval()
    return Policy(
        model=model,
        tokenizer=SimpleNamespace(bos_token_id=1),
        model_id="small",
        gguf_path=None,
        lora=lora,
        lora_rank=4 if lora else 0,
        lora_alpha=8.0 if lora else 0.0,
        eos_ids=(2,),
    )


PROMPTS = [[1, 520, 9531, 198, 2683, 359, 253], [1, 4093, 198, 1780, 314, 216, 34, 31, 216, 35]]


def drift(sampler: LlamaCppSampler, policy: Policy, params: SamplingParams, seeds=(5, 6)) -> float:
    groups = sampler.sample(PROMPTS, list(seeds), params, NullHooks())
    ours, theirs = [], []
    for prompt, group in zip(PROMPTS, groups):
        ours += [s.logprobs for s in group]
        theirs += trainer_logprobs(policy, prompt, [s.token_ids for s in group], params.temperature)
    return logprob_drift(ours, theirs)


def randomise_lora_b(policy: Policy, std: float, seed: int = 1) -> None:
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for n, p in policy.model.named_parameters():
            if "lora_B" in n:
                p.copy_(torch.randn(p.shape, generator=g) * std)
    policy.version += 1


@pytest.fixture(scope="module")
def small(tmp_path_factory):
    policy = small_policy()
    sampler = LlamaCppSampler.create(
        policy, AS_IS, tmp_path_factory.mktemp("cache"), template_gguf=embedded_gguf_path()
    )
    yield policy, sampler
    sampler.close()


def test_available_here():
    ok, why = llamacpp_available()
    assert ok and "llama-cpp-python" in why


def test_drift_helper_by_hand():
    assert logprob_drift([[-1.0, -2.0], [-0.5]], [[-1.5, -2.0], [-0.25]]) == pytest.approx(0.75 / 3)
    assert logprob_drift([[-1.0, float("nan")]], [[-1.25, -3.0]]) == pytest.approx(0.25)
    assert math.isnan(logprob_drift([[]], [[]]))
    with pytest.raises(ValueError):
        logprob_drift([[-1.0]], [[-1.0, -2.0]])


def test_reproducible_by_seed_and_distinct_across_seeds(small):
    _, sampler = small
    params = SamplingParams(n=4, max_new_tokens=12)
    a = sampler.sample(PROMPTS, [3, 4], params, NullHooks())
    b = sampler.sample(PROMPTS, [3, 4], params, NullHooks())
    c = sampler.sample(PROMPTS, [30, 40], params, NullHooks())
    toks = lambda groups: [[s.token_ids for s in g] for g in groups]  # noqa: E731
    assert toks(a) == toks(b)
    assert [[s.logprobs for s in g] for g in a] == [[s.logprobs for s in g] for g in b]
    assert toks(a) != toks(c)
    assert len({tuple(s.token_ids) for s in a[0]}) > 1  # the G sequences of a prompt have their own seeds
    assert all(len(s.logprobs) == len(s.token_ids) and all(lp <= 0 for lp in s.logprobs) for g in a for s in g)


def test_max_tokens_and_stop_tokens(small):
    _, sampler = small
    free = sampler.sample(PROMPTS, [8, 9], SamplingParams(n=4, max_new_tokens=10, stop_token_ids=(49151,)), NullHooks())
    assert all(len(s.token_ids) == 10 and not s.finished for g in free for s in g if 49151 not in s.token_ids)
    stop = free[0][0].token_ids[0]  # the first token of sequence 0: drawn from the prompt's logits alone
    cut = sampler.sample(PROMPTS, [8, 9], SamplingParams(n=4, max_new_tokens=10, stop_token_ids=(stop,)), NullHooks())
    assert cut[0][0].token_ids == [] and cut[0][0].finished
    for g in cut:
        for s in g:
            assert stop not in s.token_ids  # the stop token is never part of a completion
            assert s.finished or len(s.token_ids) == 10


def test_logprobs_agree_with_transformers_and_follow_a_hot_swapped_adapter(small):
    policy, sampler = small
    params = SamplingParams(n=3, max_new_tokens=16, temperature=0.8)
    assert sampler.status()["adapter_path"] is None  # peft's B = 0: no adapter needed
    base = drift(sampler, policy, params)
    assert base < 0.01
    randomise_lora_b(policy, std=0.3)
    sampler.sync_policy(policy)
    status = sampler.status()
    assert status["adapter_path"].endswith(f"adapter-v{policy.version}.gguf")
    assert drift(sampler, policy, params) < 0.01
    with torch.no_grad(), policy.model.disable_adapter():  # the update changed the model
        groups = sampler.sample(PROMPTS, [5, 6], params, NullHooks())
        off = logprob_drift(
            [s.logprobs for s in groups[0]], trainer_logprobs(policy, PROMPTS[0], [s.token_ids for s in groups[0]], 0.8)
        )
    assert off > 0.05
    # a wrong export (Q/K rows left in HF order) loads without complaint and is caught by the drift
    wrong = Path(status["adapter_path"]).with_name("wrong.gguf")
    lora_gguf.export_lora_adapter(policy.model, "llama", wrong, permute_qk=False)
    sampler.worker.call("adapter", path=str(wrong))
    assert drift(sampler, policy, params) > 0.2
    sampler.synced_version = None  # make the next sync re-export the right adapter
    sampler.sync_policy(policy)
    assert drift(sampler, policy, params) < 0.01
    version = policy.version
    sampler.sync_policy(policy)  # same version: nothing exported
    assert sampler.status()["adapter_path"].endswith(f"adapter-v{version}.gguf")


def test_many_sequences_get_a_cache_each_and_still_agree(small):
    policy, sampler = small
    prompts = PROMPTS  # a group of 40 sequences: above the shared-cache limit on its own
    params = SamplingParams(n=40, max_new_tokens=6, stop_token_ids=(49151,))
    groups = sampler.sample(prompts, list(range(2)), params, NullHooks())
    assert sampler.status()["kv_unified"] is False
    assert [len(g) for g in groups] == [40] * 2 and all(len(s.token_ids) == 6 for g in groups for s in g)
    ours = [s.logprobs for g in groups for s in g]
    theirs = [lp for p, g in zip(prompts, groups) for lp in trainer_logprobs(policy, p, [s.token_ids for s in g])]
    assert logprob_drift(ours, theirs) < 0.01  # each sequence got its prompt's cells copied, not lost
    sampler.sample(PROMPTS, [1, 2], SamplingParams(n=2, max_new_tokens=4), NullHooks())
    assert sampler.status()["kv_unified"] is True


def test_many_prompts_are_sampled_in_calls_that_share_one_cache(small):
    """6 prompts x 8 = 48 sequences (an evaluation's shape) go in calls of at most 32: the
    context keeps one shared cache instead of growing one per sequence for the process's life."""
    policy, sampler = small
    groups = sampler.sample(PROMPTS * 3, list(range(6)), SamplingParams(n=8, max_new_tokens=6), NullHooks())
    assert [len(g) for g in groups] == [8] * 6
    assert sampler.status()["kv_unified"] is True


def test_shared_prefix_picks_the_longest_and_leaves_the_last_token():
    from sapo_core.sampler.llamacpp_engine import shared_prefix

    assert shared_prefix([], [1, 2, 3]) == (-1, 0)
    assert shared_prefix([[1, 2, 9], [1, 2, 3, 4], [7]], [1, 2, 3, 5]) == (1, 3)
    assert shared_prefix([[1, 2, 3]], [1, 2, 3]) == (0, 2)  # the same prompt: its last token is decoded again
    assert shared_prefix([[1, 2, 3, 4, 5]], [1, 2]) == (0, 1)
    assert shared_prefix([[5, 6]], [1, 2]) == (-1, 0)


def test_prompts_sharing_a_template_take_its_cells_and_still_agree(small):
    """The part prompts share (chat template, one-shot example) is decoded once and copied."""
    policy, sampler = small
    head = [1, 520, 9531, 198, 2683, 359, 253, 4093, 198, 1780, 314]
    prompts = [head + [216, 34], head + [31, 216, 35, 198], head[:6] + [88, 99]]
    params = SamplingParams(n=3, max_new_tokens=8, temperature=0.8)
    before = sampler.stats["shared_prompt_tokens"]
    groups = sampler.sample(prompts, [3, 4, 5], params, NullHooks())
    assert sampler.stats["shared_prompt_tokens"] - before == len(head) + 6
    ours = [s.logprobs for g in groups for s in g]
    theirs = [lp for p, g in zip(prompts, groups) for lp in trainer_logprobs(policy, p, [s.token_ids for s in g], 0.8)]
    assert logprob_drift(ours, theirs) < 0.01  # copied cells are the right ones at the right positions


def test_threads_setting_reaches_the_context(small):
    _, sampler = small
    sampler.set_threads(1)
    assert sampler.status()["ctx_threads"] == 1
    sampler.set_threads(2)
    assert sampler.status()["ctx_threads"] == 2
    sampler.set_threads(1)


def test_interrupted_round_leaves_the_sampler_usable(small):
    _, sampler = small
    params = SamplingParams(n=2, max_new_tokens=8, stop_token_ids=(49151,))

    class StopAtThird(NullHooks):
        calls = 0

        def checkpoint(self) -> None:
            self.calls += 1
            if self.calls == 3:
                raise Interrupted()

    with pytest.raises(Interrupted):
        sampler.sample(PROMPTS, [1, 2], params, StopAtThird())
    again = sampler.sample(PROMPTS, [1, 2], params, NullHooks())
    assert all(len(s.token_ids) == 8 for g in again for s in g)


def test_a_bad_request_fails_cleanly_and_the_worker_lives_on(small):
    _, sampler = small
    with pytest.raises(SamplerError, match="vocabulary"):
        sampler.sample([[1, 10**6]], [0], SamplingParams(n=2, max_new_tokens=4), NullHooks())
    assert sampler.worker.alive
    assert len(sampler.sample([[1, 2, 3]], [0], SamplingParams(n=2, max_new_tokens=4), NullHooks())[0]) == 2


@pytest.mark.skipif(sys.platform == "win32", reason="POSIX signals")
def test_native_crash_in_the_child_is_a_sampler_error(tmp_path):
    policy = small_policy(seed=3)
    sampler = LlamaCppSampler.create(policy, AS_IS, tmp_path, template_gguf=embedded_gguf_path())

    class SegfaultAtThird(NullHooks):
        calls = 0

        def checkpoint(self) -> None:
            self.calls += 1
            if self.calls == 3:
                os.kill(sampler.worker_pid, signal.SIGSEGV)

    try:
        with pytest.raises(SamplerError, match="SIGSEGV"):
            sampler.sample(
                PROMPTS, [1, 2], SamplingParams(n=2, max_new_tokens=20, stop_token_ids=(49151,)), SegfaultAtThird()
            )
        assert not sampler.worker.alive
        with pytest.raises(SamplerError, match="died"):  # stays failed; the node falls back
            sampler.set_threads(1)
    finally:
        sampler.close()
    assert describe_exit(-11) == "signal SIGSEGV" and describe_exit(3) == "exit code 3"


@pytest.mark.skipif(sys.platform == "win32", reason="POSIX signals")
def test_the_node_s_sampler_falls_back_to_transformers_after_a_native_crash(tmp_path):
    """ResilientSampler (what the node samples with): a real llama.cpp child killed by SIGSEGV
    mid-round costs the round nothing; the same call is answered by transformers from then on."""
    from sapo_core.sampler.resilient import ResilientSampler

    policy = small_policy(seed=5)
    policy.tokenizer.pad_token_id = 0  # transformers pads the prompts
    inner = LlamaCppSampler.create(policy, AS_IS, tmp_path, template_gguf=embedded_gguf_path())
    sampler = ResilientSampler(AS_IS, policy, tmp_path, inner, "llama.cpp")

    class SegfaultAtSecond(NullHooks):
        calls = 0

        def checkpoint(self) -> None:
            self.calls += 1
            if self.calls == 2 and inner.worker.alive:
                os.kill(inner.worker_pid, signal.SIGSEGV)

    params = SamplingParams(n=2, max_new_tokens=8, stop_token_ids=(49151,))
    try:
        assert sampler.name == "llamacpp"
        groups = sampler.sample(PROMPTS, [1, 2], params, SegfaultAtSecond())
        assert sampler.name == "transformers" and "fallback" in sampler.reason and "SIGSEGV" in sampler.reason
        assert [len(g) for g in groups] == [2, 2] and not inner.worker.alive
        assert not sampler.check_drift(1.0)  # transformers samples from the trainer's own model: no drift
    finally:
        sampler.close()


def test_full_fine_tuning_exports_and_reloads_the_weights(tmp_path):
    policy = small_policy(lora=False, seed=4)
    sampler = LlamaCppSampler.create(policy, AS_IS, tmp_path, template_gguf=embedded_gguf_path())
    try:
        params = SamplingParams(n=2, max_new_tokens=12)
        assert drift(sampler, policy, params) < 0.01
        with torch.no_grad():
            for p in policy.model.parameters():
                p.add_(torch.randn_like(p) * 0.05)
        policy.version += 1
        first = sampler.status()["model_path"]
        sampler.sync_policy(policy)
        assert sampler.status()["model_path"] != first
        assert not Path(first).exists()  # the previous export is cleaned up
        assert drift(sampler, policy, params) < 0.01
    finally:
        sampler.close()
    assert not any(tmp_path.glob("llamacpp/session-*"))


def test_sessions_of_dead_processes_are_removed(tmp_path):
    orphan = tmp_path / "llamacpp" / "session-999999999-0"  # above any real pid limit
    orphan.mkdir(parents=True)
    (orphan / "adapter-v3.gguf").write_bytes(b"x")
    sampler = LlamaCppSampler.create(small_policy(seed=6), AS_IS, tmp_path, template_gguf=embedded_gguf_path())
    try:
        assert not orphan.exists()
        assert Path(sampler.info["model_path"]).parent.exists()
    finally:
        sampler.close()


def test_converted_copies_are_made_once_per_source_and_reused(tmp_path):
    policy = small_policy(seed=5)
    source = tmp_path / "small.f32.gguf"  # stands for a catalogue GGUF: the policy's own file
    lora_gguf.export_full_gguf(policy.model, embedded_gguf_path(), source)
    policy.gguf_path = source
    params = SamplingParams(n=2, max_new_tokens=12)
    drifts = {}
    for kind in ("f16", "q8_0"):
        sampler = LlamaCppSampler.create(policy, SamplerConfig(quantization=kind, threads=1), tmp_path / "cache")
        try:
            made = Path(sampler.info["model_path"])
            assert made.name.startswith("small.f32-") and made.name.endswith(f".{kind}.gguf")
            assert lora_gguf.read_gguf_metadata(made).get("general.file_type") == {"f16": 1, "q8_0": 7}[kind]
            drifts[kind] = drift(sampler, policy, params)
            made_at = made.stat().st_mtime_ns
        finally:
            sampler.close()
        again = LlamaCppSampler.create(policy, SamplerConfig(quantization=kind, threads=1), tmp_path / "cache")
        try:
            assert Path(again.info["model_path"]) == made
            assert made.stat().st_mtime_ns == made_at  # reused, not converted again
        finally:
            again.close()
    assert drifts["f16"] < 0.01
    assert drifts["q8_0"] < 0.2  # 8-bit weights and activations: the price of half the memory
    assert sorted(p.name.split(".")[-2] for p in (tmp_path / "cache" / "llamacpp").glob("*.gguf")) == ["f16", "q8_0"]


# --- the embedded model -----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def embedded(tmp_path_factory):
    from sapo_core.config import ModelConfig
    from sapo_core.policy import load_policy

    cache = tmp_path_factory.mktemp("embedded-cache")
    policy = load_policy(ModelConfig(name="smollm2-135m"), embedded_gguf_path(), cache)
    # f16: the trainer's weights, so the drift is llama.cpp's arithmetic alone (q8_0 adds ~0.06 nats
    # here: 8-bit weights and activations; `sapo-bench generation --quantization` compares them)
    sampler = LlamaCppSampler.create(policy, SamplerConfig(quantization="f16", threads=2), cache)
    yield policy, sampler
    sampler.close()


def question_prompts(policy: Policy) -> list[list[int]]:
    questions = ["What is 17 + 25?", "Simplify the fraction 12/18.", "What day comes 3 days after Monday?"]
    return [policy.encode_prompt([{"role": "user", "content": q}]) for q in questions]


def embedded_drift(policy: Policy, sampler: LlamaCppSampler, params: SamplingParams) -> float:
    prompts = question_prompts(policy)
    groups = sampler.sample(prompts, [11, 12, 13], params, NullHooks())
    ours, theirs = [], []
    for prompt, group in zip(prompts, groups):
        ours += [s.logprobs for s in group]
        theirs += trainer_logprobs(policy, prompt, [s.token_ids for s in group], params.temperature)
    return logprob_drift(ours, theirs)


@pytest.mark.slow
def test_embedded_model_agrees_with_transformers_before_and_after_a_hot_swap(embedded):
    policy, sampler = embedded
    params = SamplingParams(n=4, max_new_tokens=32)
    assert sampler.info["model_path"].endswith(".f16.gguf")
    assert embedded_drift(policy, sampler, params) <= 0.05
    randomise_lora_b(policy, std=0.05)
    sampler.sync_policy(policy)
    right = embedded_drift(policy, sampler, params)
    assert right <= 0.05
    wrong = Path(sampler.status()["adapter_path"]).with_name("wrong.gguf")
    lora_gguf.export_lora_adapter(policy.model, "llama", wrong, permute_qk=False)
    sampler.worker.call("adapter", path=str(wrong))
    assert embedded_drift(policy, sampler, params) > 3 * right
    sampler.synced_version = None
    sampler.sync_policy(policy)


@pytest.mark.slow
def test_embedded_model_stops_at_eos(embedded):
    policy, sampler = embedded
    groups = sampler.sample(question_prompts(policy), [1, 2, 3], SamplingParams(n=4, max_new_tokens=96), NullHooks())
    finished = [s for g in groups for s in g if s.finished]
    assert finished  # a chat model ends most short answers on its own
    assert all(len(s.token_ids) < 96 and not set(s.token_ids) & set(policy.eos_ids) for s in finished)


@pytest.mark.slow
def test_two_rounds_the_second_samples_from_the_updated_adapter(embedded):
    from sapo_core.config import TrainConfig
    from sapo_core.trainer import Trainer, TrainSequence

    policy, sampler = embedded
    params = SamplingParams(n=4, max_new_tokens=24)
    prompts = question_prompts(policy)[:2]
    trainer = Trainer(policy, TrainConfig(learning_rate=2e-3, steps_per_round=1, micro_batch_size=4))
    for round_ in range(2):
        sampler.sync_policy(policy)
        assert sampler.synced_version == policy.version
        groups = sampler.sample(prompts, [100 + round_, 200 + round_], params, NullHooks())
        seqs = [
            TrainSequence(p, s.token_ids, 1.0 if j % 2 else -1.0, s.logprobs)
            for p, g in zip(prompts, groups)
            for j, s in enumerate(g)
            if s.token_ids
        ]
        version = policy.version
        out = trainer.update(seqs, NullHooks())
        assert out["sampler/logprob_drift"] <= 0.05  # the trainer's first forward saw what we sampled
        assert policy.version > version
    sampler.sync_policy(policy)
    assert sampler.status()["adapter_path"].endswith(f"adapter-v{policy.version}.gguf")
    assert embedded_drift(policy, sampler, params) <= 0.05


def test_drift_past_the_limit_on_the_f16_export_is_said_once(tmp_path, caplog):
    """Nothing to switch to on the F16 export: the first time is a warning, later rounds debug
    lines (a bf16 update passes the limit on a third of its rounds)."""
    import logging

    from sapo_core.sampler.resilient import DRIFT_LIMIT, ResilientSampler

    policy = small_policy(seed=6)
    f16 = SamplerConfig(quantization="f16", threads=1)
    inner = LlamaCppSampler.create(policy, f16, tmp_path, template_gguf=embedded_gguf_path())
    sampler = ResilientSampler(f16, policy, tmp_path, inner, "llama.cpp")
    try:
        with caplog.at_level(logging.DEBUG, logger="sapo_core.sampler.resilient"):
            for _ in range(3):
                assert not sampler.check_drift(DRIFT_LIMIT * 2)
        levels = [r.levelno for r in caplog.records if "even on the F16 export" in r.getMessage()]
        assert levels == [logging.WARNING, logging.DEBUG, logging.DEBUG]
        assert sampler.inner is inner
    finally:
        sampler.close()
