"""The transformers sampler's merged copy: the LoRA folded into plain weights decodes what the
wrapped policy decodes, follows every update (version), the base model inside `base_weights`,
and a swap of the policy's model; on the CPU it is off unless asked for."""

import pytest
import torch

from sapo_core.hooks import NullHooks
from sapo_core.sampler.base import SamplingParams

from helpers import tiny_random_policy


@pytest.fixture()
def policy():
    p = tiny_random_policy(seed=3)
    _perturb(p, 0)
    return p


def _perturb(policy, seed: int) -> None:
    """What an update does: move every LoRA matrix (B starts at zero, so the LoRA would add
    nothing) and bump the version."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in policy.model.parameters():
            if p.requires_grad:
                p.add_(torch.randn(p.shape, generator=g) * 0.05)
    policy.version += 1


def _logits(model, ids: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return model(input_ids=ids).logits


IDS = torch.tensor([[1, 17, 230, 45, 9, 1200, 77]])


def test_the_merged_copy_gives_the_wrapped_policys_logits_and_follows_updates(policy):
    from sapo_core.sampler.transformers import TransformersSampler

    sampler = TransformersSampler(policy, merge=True)
    merged = sampler.decoding_model()
    assert merged is not policy.model
    assert not any(p.requires_grad for p in merged.parameters())
    assert not any("lora" in n for n, _ in merged.named_parameters())
    wrapped = _logits(policy.model, IDS)
    with policy.model.disable_adapter():
        assert (wrapped - _logits(policy.model, IDS)).abs().max() > 1e-3  # the LoRA is not nothing
    torch.testing.assert_close(_logits(merged, IDS), wrapped, atol=1e-4, rtol=1e-4)

    _perturb(policy, 1)  # an update: the copy is refreshed in place, not rebuilt
    assert sampler.decoding_model() is merged
    torch.testing.assert_close(_logits(merged, IDS), _logits(policy.model, IDS), atol=1e-4, rtol=1e-4)
    # the base weights under the LoRA are untouched by folding it in, however many times
    base_q = policy.model.get_base_model().model.layers[0].self_attn.q_proj.base_layer.weight.clone()
    for s in range(3):
        _perturb(policy, 10 + s)
        sampler.decoding_model()
    assert torch.equal(policy.model.get_base_model().model.layers[0].self_attn.q_proj.base_layer.weight, base_q)


def test_inside_base_weights_it_decodes_the_base_model_and_after_it_the_policy(policy):
    from sapo_core.evalbase import base_weights
    from sapo_core.sampler.transformers import TransformersSampler

    sampler = TransformersSampler(policy, merge=True)
    trained = _logits(sampler.decoding_model(), IDS).clone()
    with base_weights(policy, sampler):
        base = _logits(sampler.decoding_model(), IDS)
        torch.testing.assert_close(base, _logits(policy.model, IDS), atol=1e-4, rtol=1e-4)
    assert (base - trained).abs().max() > 1e-3
    torch.testing.assert_close(_logits(sampler.decoding_model(), IDS), trained, atol=1e-4, rtol=1e-4)


def test_a_new_model_behind_the_policy_gets_a_new_copy(policy):
    import copy

    from sapo_core.sampler.transformers import TransformersSampler

    sampler = TransformersSampler(policy, merge=True)
    first = sampler.decoding_model()
    policy.model = copy.deepcopy(policy.model)  # the same version, another model object
    _perturb(policy, 5)
    policy.version -= 1
    second = sampler.decoding_model()
    assert second is not first
    torch.testing.assert_close(_logits(second, IDS), _logits(policy.model, IDS), atol=1e-4, rtol=1e-4)


def test_on_the_cpu_it_decodes_the_policy_itself_unless_asked(policy):
    from sapo_core.sampler.transformers import TransformersSampler

    assert TransformersSampler(policy).decoding_model() is policy.model


def test_sampling_from_the_merged_copy_draws_what_the_wrapped_policy_draws(policy):
    from sapo_core.sampler.transformers import TransformersSampler

    prompts = [[1, 17, 230, 45], [1, 9, 1200, 77, 5]]
    params = SamplingParams(n=3, max_new_tokens=6, temperature=1.0)
    wrapped = TransformersSampler(policy).sample(prompts, [0, 1], params, NullHooks())
    merged = TransformersSampler(policy, merge=True).sample(prompts, [0, 1], params, NullHooks())
    for gw, gm in zip(wrapped, merged):
        for a, b in zip(gw, gm):
            # the same generator state and logits within float rounding: the same draws
            assert a.token_ids == b.token_ids
            assert a.logprobs == pytest.approx(b.logprobs, abs=1e-3)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA GPU here")
def test_on_a_gpu_it_decodes_the_merged_copy_and_draws_the_same(policy):
    from sapo_core.sampler.transformers import TransformersSampler

    policy.model.to("cuda")
    sampler = TransformersSampler(policy)
    assert sampler.merge and sampler.decoding_model() is not policy.model
    prompts = [[1, 17, 230, 45]]
    params = SamplingParams(n=4, max_new_tokens=6, temperature=1.0)
    merged = sampler.sample(prompts, [0], params, NullHooks())
    wrapped = TransformersSampler(policy, merge=False).sample(prompts, [0], params, NullHooks())
    assert [s.token_ids for s in merged[0]] == [s.token_ids for s in wrapped[0]]
