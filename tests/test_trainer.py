"""The GRPO update against a naive reference on a small real Llama model with LoRA.

The model is a real transformers LlamaForCausalLM with a peft adapter, only small; the
tokenizer is reduced to the one attribute the trainer reads (pad_token_id).
"""

import dataclasses

import pytest
import torch
from transformers.modeling_layers import GradientCheckpointingLayer

from sapo_core.bench.training import update_gradient
from sapo_core.config import ConfigError, TrainConfig
from sapo_core.hooks import NullHooks
from sapo_core.precision import cpu_bf16_feature, resolve_precision
from sapo_core.trainer import Trainer, TrainSequence

from helpers import sequences, small_policy


def naive_loss(policy, seqs, temperature=1.0, per_sequence=False):
    """Token-level mean of -A * ratio at ratio 1 (first step), full logits, one sequence at a time;
    with `per_sequence` each completion's token mean, averaged over the completions."""
    total = sum(len(s.completion_ids) for s in seqs)
    loss = 0.0
    for s in seqs:
        ids = torch.tensor([s.prompt_ids + s.completion_ids])
        logits = policy.model(input_ids=ids).logits[0].float() / temperature
        lp = torch.log_softmax(logits, -1)
        p = len(s.prompt_ids)
        tok_lp = lp[p - 1 : -1].gather(1, torch.tensor(s.completion_ids)[:, None]).squeeze(1)
        ratio = torch.exp(tok_lp - tok_lp.detach())
        if per_sequence:
            loss = loss + (-(ratio * s.advantage)).mean() / len(seqs)
        else:
            loss = loss + (-(ratio * s.advantage)).sum() / total
    return loss


def grads(policy):
    return {n: p.grad.clone() for n, p in policy.model.named_parameters() if p.requires_grad}


@pytest.mark.parametrize("pack", [True, False])
@pytest.mark.parametrize("micro", [1, 2, 8])
def test_first_step_matches_naive_loss_and_gradient(micro, pack):
    seqs = sequences()
    ref = small_policy()
    ref.model.train()
    expected = naive_loss(ref, seqs, temperature=0.8)
    expected.backward()
    ref_grads = grads(ref)

    pol = small_policy()
    tr = Trainer(
        pol,
        TrainConfig(
            precision="fp32",
            steps_per_round=1,
            micro_batch_size=micro,
            max_grad_norm=0.0,
            learning_rate=1e-9,
            logit_chunk=16,
            pack_prompts=pack,
        ),
        temperature=0.8,
    )
    out = tr.update(seqs, NullHooks())
    assert out["loss/policy"] == pytest.approx(expected.item(), rel=1e-4, abs=1e-6)
    got = grads(pol)
    for n in ref_grads:
        assert torch.allclose(got[n], ref_grads[n], atol=1e-5, rtol=1e-4), n
    assert out["train/clip_low_frac"] == 0 and out["train/clip_high_frac"] == 0  # ratio is 1 on step 1
    assert out["train/ratio_mean"] == pytest.approx(1.0)


@pytest.mark.parametrize(
    "layout", [dict(pack_prompts=False, micro_batch_size=2), dict(micro_batch_size=8), dict(prompt_grad=False)]
)
def test_the_sequence_mean_matches_the_naive_loss_and_gradient(layout):
    """train.loss_mean = sequence: each completion's tokens averaged, then the completions, in
    every layout of the micro-batches, against the naive loss written out sequence by sequence."""
    seqs = [TrainSequence([7], s.completion_ids, s.advantage) for s in sequences()]  # no prefix to leave out
    ref = small_policy()
    ref.model.train()
    expected = naive_loss(ref, seqs, per_sequence=True)
    expected.backward()
    ref_grads = grads(ref)
    assert expected.item() != pytest.approx(naive_loss(small_policy(), seqs).item(), abs=1e-4)  # they differ here
    pol = small_policy()
    cfg = TrainConfig(precision="fp32", steps_per_round=1, max_grad_norm=0.0, learning_rate=1e-9, loss_mean="sequence")
    trainer = Trainer(pol, dataclasses.replace(cfg, **layout))
    out = trainer.update(seqs, NullHooks())
    assert out["loss/policy"] == pytest.approx(expected.item(), rel=1e-4, abs=1e-6)
    got = grads(pol)
    for n in ref_grads:
        assert torch.allclose(got[n], ref_grads[n], atol=1e-5, rtol=1e-4), n


def test_sequence_mean_weights_hand_computed():
    """Completions of 1, 2 and 3 tokens (6 in all) in one micro-batch and 2 more in another: 4
    completions, 8 tokens; a token of a completion of n tokens weighs 8 / (4 n)."""
    from sapo_core.trainer import sequence_mean_weights

    w = sequence_mean_weights(torch.tensor([0, 1, 1, 2, 2, 2]), 3, total=8, sequences=4)
    assert w.tolist() == pytest.approx([2.0, 1.0, 1.0, 2 / 3, 2 / 3, 2 / 3])
    rest = sequence_mean_weights(torch.tensor([0, 0]), 1, total=8, sequences=4)
    assert rest.tolist() == pytest.approx([1.0, 1.0])
    # each completion's weights sum to total / sequences: every completion weighs the same
    assert float(w[:1].sum()) == float(w[1:3].sum()) == pytest.approx(float(w[3:].sum())) == float(rest.sum())


def test_an_unknown_loss_mean_is_refused_by_name():
    with pytest.raises(ConfigError, match="train.loss_mean"):
        TrainConfig(loss_mean="batch")


def test_later_steps_are_off_policy_and_can_clip():
    pol = small_policy()
    tr = Trainer(pol, TrainConfig(steps_per_round=3, learning_rate=0.05, max_grad_norm=0.0), temperature=1.0)
    out = tr.update(sequences(), NullHooks())
    assert out["train/steps"] == 3 and pol.version == 3
    assert out["train/ratio_mean"] != pytest.approx(1.0, abs=1e-6)
    assert 0 < out["train/clip_low_frac"] + out["train/clip_high_frac"] <= 1


def test_update_moves_probability_towards_positive_advantage():
    pol = small_policy()
    s_good = TrainSequence([5, 6, 7], [8, 9], 1.0)
    s_bad = TrainSequence([5, 6, 7], [10, 11], -1.0)

    def lp(seq):
        with torch.no_grad():
            logits = pol.model(input_ids=torch.tensor([seq.prompt_ids + seq.completion_ids])).logits[0]
            lps = torch.log_softmax(logits, -1)
            return sum(lps[2 + i, t].item() for i, t in enumerate(seq.completion_ids))

    before = lp(s_good), lp(s_bad)
    Trainer(pol, TrainConfig(steps_per_round=2, learning_rate=1e-2)).update([s_good, s_bad], NullHooks())
    after = lp(s_good), lp(s_bad)
    assert after[0] > before[0] and after[1] < before[1]


def test_drift_is_the_gap_to_the_sampler_logprobs():
    pol = small_policy()
    s = TrainSequence([5, 6, 7], [8, 9, 10], 1.0)
    with torch.no_grad():
        logits = pol.model(input_ids=torch.tensor([s.prompt_ids + s.completion_ids])).logits[0]
        true = [torch.log_softmax(logits, -1)[2 + i, t].item() for i, t in enumerate(s.completion_ids)]
    s.sample_logprobs = [x + 0.1 for x in true]
    out = Trainer(pol, TrainConfig(steps_per_round=1, precision="fp32")).update(
        [s, TrainSequence([5], [6], -1.0)], NullHooks()
    )
    assert out["sampler/logprob_drift"] == pytest.approx(0.1, abs=1e-4)  # the peer-like sequence has none


def test_kl_uses_the_base_model_without_adapter():
    pol = small_policy()
    out = Trainer(pol, TrainConfig(steps_per_round=2, kl_beta=0.1, learning_rate=0.05)).update(sequences(), NullHooks())
    # init_lora_weights=False: the adapter already differs from the base, so KL > 0
    assert out["loss/kl"] > 0


def test_empty_batch_does_nothing():
    pol = small_policy()
    out = Trainer(pol, TrainConfig()).update([TrainSequence([1, 2], [], 1.0)], NullHooks())
    assert out == {"train/steps": 0.0} and pol.version == 0


def test_packing_trains_each_prompt_once_per_row():
    seqs = sequences()
    unpacked = sum(len(s.prompt_ids) + len(s.completion_ids) for s in seqs)
    out = Trainer(small_policy(), TrainConfig(steps_per_round=1, micro_batch_size=8, precision="fp32")).update(
        seqs, NullHooks()
    )
    once = sum(len(p) for p in {tuple(s.prompt_ids) for s in seqs}) + sum(len(s.completion_ids) for s in seqs)
    assert out["train/tokens"] == once < unpacked


def test_packed_logprobs_equal_the_unpacked_ones_with_checkpointing_and_drift():
    """Gradient checkpointing on, sampler log-probs given: the drift sees the same numbers either way."""
    seqs = sequences()
    for s in seqs:
        s.sample_logprobs = [-1.0] * len(s.completion_ids)
    figures = []
    for pack in (True, False):
        tr = Trainer(
            small_policy(),
            TrainConfig(
                steps_per_round=1, micro_batch_size=2, gradient_checkpointing=True, pack_prompts=pack, precision="fp32"
            ),
        )
        figures.append(tr.update(seqs, NullHooks()))
    packed, plain = figures
    assert packed["sampler/logprob_drift"] == pytest.approx(plain["sampler/logprob_drift"], rel=1e-5)
    assert packed["loss/policy"] == pytest.approx(plain["loss/policy"], rel=1e-5, abs=1e-7)
    assert packed["train/grad_norm"] == pytest.approx(plain["train/grad_norm"], rel=1e-4)


def _grads_after_one_step(cfg: TrainConfig) -> tuple[dict, torch.Tensor]:
    pol = small_policy()
    pol.model.train()
    out = Trainer(pol, cfg).update(sequences(), NullHooks())
    return out, grads(pol)


@pytest.mark.parametrize("share", [0.0, 0.5, 1.0])
def test_checkpointing_a_share_of_the_layers_leaves_the_gradient_as_it_was(share):
    """Which layers recompute their activations changes memory and time, never the numbers."""
    base = dict(steps_per_round=1, micro_batch_size=2, precision="fp32", max_grad_norm=0.0)
    want, want_grads = _grads_after_one_step(TrainConfig(gradient_checkpointing=False, **base))
    pol = small_policy()
    tr = Trainer(pol, TrainConfig(gradient_checkpointing=True, checkpoint_share=share, **base))
    flags = [m.gradient_checkpointing for m in pol.model.modules() if isinstance(m, GradientCheckpointingLayer)]
    assert len(flags) == 2 and sum(flags) == round(share * 2)
    got = tr.update(sequences(), NullHooks())
    assert got["loss/policy"] == pytest.approx(want["loss/policy"], rel=1e-5, abs=1e-7)
    for n, g in grads(pol).items():
        assert torch.allclose(g, want_grads[n], atol=1e-6, rtol=1e-5), n


def test_an_even_share_of_layers_is_checkpointed():
    from sapo_core.trainer import checkpoint_share_of_layers

    class Layer(GradientCheckpointingLayer):
        gradient_checkpointing = True

    model = torch.nn.Sequential(*[Layer() for _ in range(30)])
    assert checkpoint_share_of_layers(model, 0.5) == 15
    assert [m.gradient_checkpointing for m in model] == [k % 2 == 1 for k in range(30)]
    for m in model:
        m.gradient_checkpointing = True
    assert checkpoint_share_of_layers(model, 0.25) == 8
    on = [k for k, m in enumerate(model) if m.gradient_checkpointing]
    assert len(on) == 8 and max(b - a for a, b in zip(on, on[1:])) <= 4  # spread, not bunched


@pytest.mark.skipif(resolve_precision("auto").autocast is None, reason="this CPU has no native bf16")
def test_bf16_autocast_keeps_log_probs_and_the_update_close_to_fp32():
    """Where the CPU has native bf16 the default trains under autocast: the LoRA weights and their
    gradients stay fp32, the log-probs move less than the sampler may drift (0.05 nats/token)."""
    base = dict(steps_per_round=1, micro_batch_size=2, max_grad_norm=0.0)
    fp32, fp32_grads = _grads_after_one_step(TrainConfig(precision="fp32", **base))
    pol = small_policy()
    tr = Trainer(pol, TrainConfig(**base))
    assert tr.precision.name == "bf16"
    seqs = sequences()
    lp_bf16 = tr.completion_logprobs(seqs)
    lp_fp32 = Trainer(small_policy(), TrainConfig(precision="fp32", **base)).completion_logprobs(seqs)
    gaps = [abs(a - b) for x, y in zip(lp_bf16, lp_fp32) for a, b in zip(x, y)]
    assert 0 < sum(gaps) / len(gaps) < 0.05
    bf16 = tr.update(seqs, NullHooks())
    assert bf16["loss/policy"] == pytest.approx(fp32["loss/policy"], rel=0.05, abs=1e-3)
    for n, g in grads(pol).items():
        assert g.dtype == torch.float32
        cos = torch.nn.functional.cosine_similarity(g.flatten(), fp32_grads[n].flatten(), dim=0)
        assert cos > 0.95, n


def test_precision_setting():
    assert resolve_precision("fp32").autocast is None
    assert resolve_precision("bf16").autocast is torch.bfloat16
    auto = resolve_precision("auto", "cpu")
    assert (auto.autocast is torch.bfloat16) == (cpu_bf16_feature() is not None)
    assert resolve_precision("auto", "mps").autocast is None
    with pytest.raises(ConfigError, match="train.precision"):
        TrainConfig(precision="fp16")
    with pytest.raises(ConfigError, match="train.checkpoint_share"):
        TrainConfig(checkpoint_share=1.5)


def test_the_bf16_detection_can_be_told(monkeypatch):
    monkeypatch.setenv("SAPO_CPU_BF16", "0")
    assert cpu_bf16_feature() is None
    assert resolve_precision("auto", "cpu").why == "fp32: no native bf16 on this cpu"
    monkeypatch.setenv("SAPO_CPU_BF16", "1")
    assert resolve_precision("auto", "cpu").autocast is torch.bfloat16


def test_the_update_runs_where_train_device_says():
    from sapo_core.hardware import DeviceUnavailable, training_device

    if torch.cuda.is_available():
        assert training_device("auto", {}).value == "cuda"
    else:
        assert training_device("auto", {}).value == "cpu"
        said = training_device("auto", {"SAPO_DEVICE": "cuda"})
        assert said.value == "cpu" and "torch sees no CUDA GPU" in said.reason
        with pytest.raises(DeviceUnavailable, match="set train.device = cpu"):
            training_device("cuda", {})
    assert training_device("cpu", {"SAPO_DEVICE": "cuda"}).value == "cpu"  # the setting wins
    assert training_device("auto", {"SAPO_DEVICE": "mps"}).value == "cpu"  # MPS: not tried, the CPU
    with pytest.raises(ConfigError):
        TrainConfig(device="tpu")


def test_micro_batches_follow_the_models_device():
    from sapo_core.microbatch import make_packed_micro_batches

    (mb,) = make_packed_micro_batches(sequences()[:2], 4, torch.float32)
    assert mb.to(torch.device("cpu")) is mb
    moved = mb.to(torch.device("meta"))  # every tensor goes; counts stay
    assert {t.device.type for t in vars(moved).values() if isinstance(t, torch.Tensor)} == {"meta"}
    assert moved.n_tokens == mb.n_tokens


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA GPU here: runs where there is one")
def test_the_update_on_cuda_matches_the_cpu():
    seqs = sequences()
    cfg = TrainConfig(precision="fp32", steps_per_round=2, learning_rate=1e-3)
    cpu, gpu = small_policy(), small_policy()
    gpu.model.to("cuda")
    a = Trainer(cpu, cfg).update(seqs, NullHooks())
    b = Trainer(gpu, cfg).update(seqs, NullHooks())
    assert b["loss/policy"] == pytest.approx(a["loss/policy"], rel=1e-3, abs=1e-5)
    for (n, x), y in zip(cpu.trainable_state_dict().items(), gpu.trainable_state_dict().values()):
        assert torch.allclose(x, y, atol=1e-4), n


# --- the prompt without gradient (train.prompt_grad = false) ----------------------------------------


def _per_sequence_logprobs(trainer, seqs):
    """Each sequence's completion log-probs through the trainer's own micro-batches and forward."""
    from sapo_core.microbatch import make_packed_micro_batches, make_prefix_micro_batches

    tagged = [TrainSequence(s.prompt_ids, s.completion_ids, float(i)) for i, s in enumerate(seqs)]
    if trainer.cfg.prompt_grad:
        mbs = make_packed_micro_batches(tagged, 4, torch.float32)
    else:
        mbs = make_prefix_micro_batches(tagged, torch.float32)
    out = [[] for _ in seqs]
    body, head = trainer.policy.body(), trainer.policy.head_weight()
    with torch.no_grad():
        for mb in mbs:
            for i, lp in zip(mb.advantages[mb.seq_of_token].long().tolist(), trainer._token_logprobs(mb, body, head)):
                out[i].append(float(lp))
    return out


def test_a_prompt_without_gradient_gives_the_same_log_probs_and_loss():
    """The prefix's keys and values, cached without gradient, give each completion token the
    log-prob the packed rows give (and the naive one-sequence-at-a-time forward): the ratios and the
    loss are the same; only the gradient leaves out the path through the prompt."""
    seqs = sequences()
    policy = small_policy()
    exact = _per_sequence_logprobs(Trainer(policy, TrainConfig(precision="fp32")), seqs)
    cached = _per_sequence_logprobs(Trainer(policy, TrainConfig(precision="fp32", prompt_grad=False)), seqs)
    assert [len(x) for x in cached] == [len(s.completion_ids) for s in seqs]
    for a, b in zip(exact, cached):
        assert b == pytest.approx(a, abs=1e-5)
    cfg = TrainConfig(precision="fp32", steps_per_round=1, prompt_grad=False)
    figures = Trainer(policy, cfg).update(seqs, NullHooks())
    assert figures["loss/policy"] == pytest.approx(float(naive_loss(small_policy(), seqs)), abs=1e-5)
    prompts = {tuple(s.prompt_ids) for s in seqs}
    completions = sum(len(s.completion_ids) for s in seqs)
    assert figures["train/tokens"] == sum(len(p) - 1 for p in prompts) + completions  # each prompt once
    from sapo_core.microbatch import make_prefix_micro_batches

    mbs = make_prefix_micro_batches(seqs, torch.float32)
    assert sum(mb.input_ids.numel() for mb in mbs) == completions  # packed: no row padded to the longest


def _gradient(policy, seqs, prompt_grad: bool) -> torch.Tensor:
    """The flat first-step gradient (the benchmark's own measurement: the weights put back after)."""
    trainer = Trainer(policy, TrainConfig(precision="fp32", steps_per_round=1, prompt_grad=prompt_grad))
    return update_gradient(trainer, seqs)[0]


def test_the_gradient_leaves_out_only_the_prompts_keys_and_values():
    """With a one-token prompt there is no prefix: the gradient is exactly the full one. With longer
    prompts it differs (the path through the prompt's keys and values is gone) but still points the
    same way."""
    one = [TrainSequence([7], s.completion_ids, s.advantage) for s in sequences()]
    assert torch.allclose(_gradient(small_policy(), one, True), _gradient(small_policy(), one, False), atol=1e-6)
    seqs = sequences()
    full = _gradient(small_policy(), seqs, True)
    part = _gradient(small_policy(), seqs, False)
    assert not torch.allclose(full, part, atol=1e-6)
    assert float(torch.nn.functional.cosine_similarity(full, part, dim=0)) > 0.5


def test_a_guides_tokens_carry_the_shaped_objective():
    """A guide sequence's tokens are trained with -A p/(p + gamma), unclipped: the loss the update
    reports is the token mean of that for the guide and of -A * ratio (1 at the first step) for ours."""
    import math

    seqs = sequences()[:3]
    seqs[1] = TrainSequence(seqs[1].prompt_ids, seqs[1].completion_ids, 1.2, guide=True, peer=True)
    policy = small_policy()
    cfg = TrainConfig(precision="fp32", steps_per_round=1, guide_gamma=0.1)
    with torch.no_grad():
        lps = _per_sequence_logprobs(Trainer(policy, cfg), seqs)
    tokens = sum(len(s.completion_ids) for s in seqs)
    expected = 0.0
    for s, lp in zip(seqs, lps):
        for x in lp:
            expected += -s.advantage * (math.exp(x) / (math.exp(x) + 0.1) if s.guide else 1.0)
    figures = Trainer(policy, cfg).update(seqs, NullHooks())
    assert figures["loss/policy"] == pytest.approx(expected / tokens, abs=1e-5)
    assert figures["train/guide_tokens"] == len(seqs[1].completion_ids)
