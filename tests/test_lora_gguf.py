"""GGUF export of the policy: names, shapes and Q/K row order, checked against transformers.

Fast: a small real Llama (peft LoRA) with the embedded model's vocabulary size, and the
embedded GGUF read as the metadata template (its tensors are never loaded). Whether
llama.cpp accepts these files and samples the same model is in test_sampler_llamacpp.py.
"""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np
import pytest
from peft import LoraConfig, get_peft_model
from transformers import LlamaConfig, LlamaForCausalLM
from transformers.modeling_gguf_pytorch_utils import LlamaTensorProcessor

from sapo_core.modelfiles import embedded_gguf_path
from sapo_core.sampler import lora_gguf
from sapo_core.sampler.lora_gguf import ExportError

from helpers import ATTENTION_AND_DOWN, tiny_llama

EMBEDDED_VOCAB = 49152


def small_model(lora: bool = True, seed: int = 0, vocab: int = EMBEDDED_VOCAB, use_rslora: bool = False):
    modules = ATTENTION_AND_DOWN if lora else ()
    return tiny_llama(seed, vocab, modules, use_rslora=use_rslora, max_position_embeddings=512)


def test_permutation_is_the_inverse_of_what_transformers_undoes_on_load():
    w = np.arange(12 * 5, dtype=np.float32).reshape(12, 5)  # 3 heads of 4 rows
    proc = LlamaTensorProcessor(config={"num_attention_heads": 3, "num_key_value_heads": 3})
    back = proc._reverse_permute_weights(lora_gguf.permute_qk_rows(w, 3), 3, 3)
    np.testing.assert_array_equal(back, w)
    # rotate-half pairs (0, 2), (1, 3) of each head become neighbours (0, 1), (2, 3)
    assert lora_gguf.permute_qk_rows(np.arange(4.0)[:, None], 1)[:, 0].tolist() == [0, 2, 1, 3]


def test_adapter_tensors_names_shapes_and_alpha():
    model = small_model()
    tensors, alpha = lora_gguf.lora_tensors(model, "llama")
    assert alpha == pytest.approx(8.0)  # peft's alpha / r is what llama.cpp computes from it
    assert set(tensors) == {
        f"blk.{i}.{m}.weight.lora_{ab}"
        for i in range(2)
        for ab in "ab"
        for m in ("attn_q", "attn_k", "attn_v", "attn_output", "ffn_down")
    }
    assert tensors["blk.0.attn_q.weight.lora_a"].shape == (4, 32)  # (r, in)
    assert tensors["blk.0.attn_k.weight.lora_b"].shape == (16, 4)  # (out, r): 2 kv heads x 8
    assert tensors["blk.1.ffn_down.weight.lora_a"].shape == (4, 64)
    layer = model.base_model.model.model.layers[0]
    b_k = layer.self_attn.k_proj.lora_B["default"].weight.detach().numpy()
    b_v = layer.self_attn.v_proj.lora_B["default"].weight.detach().numpy()
    a_q = layer.self_attn.q_proj.lora_A["default"].weight.detach().numpy()
    np.testing.assert_array_equal(tensors["blk.0.attn_k.weight.lora_b"], lora_gguf.permute_qk_rows(b_k, 2))
    np.testing.assert_array_equal(tensors["blk.0.attn_v.weight.lora_b"], b_v)  # V keeps HF order
    np.testing.assert_array_equal(tensors["blk.0.attn_q.weight.lora_a"], a_q)  # A is never permuted
    unpermuted, _ = lora_gguf.lora_tensors(model, "llama", permute_qk=False)
    np.testing.assert_array_equal(unpermuted["blk.0.attn_k.weight.lora_b"], b_k)
    qwen, _ = lora_gguf.lora_tensors(model, "qwen2")  # qwen2 GGUFs keep HF order
    np.testing.assert_array_equal(qwen["blk.0.attn_k.weight.lora_b"], b_k)


def test_merged_delta_in_gguf_order_equals_permuted_hf_delta():
    model = small_model()
    tensors, alpha = lora_gguf.lora_tensors(model, "llama")
    q = model.base_model.model.model.layers[1].self_attn.q_proj
    hf_delta = (q.lora_B["default"].weight @ q.lora_A["default"].weight).detach().numpy() * q.scaling["default"]
    gguf_delta = tensors["blk.1.attn_q.weight.lora_b"] @ tensors["blk.1.attn_q.weight.lora_a"] * alpha / 4
    np.testing.assert_allclose(gguf_delta, lora_gguf.permute_qk_rows(hf_delta, 4), rtol=1e-5, atol=1e-6)


def test_adapter_file_round_trip(tmp_path):
    model = small_model()
    path = tmp_path / "a.gguf"
    lora_gguf.export_lora_adapter(model, "llama", path)
    reader = gguf.GGUFReader(path)
    assert reader.fields["general.architecture"].contents() == "llama"
    assert reader.fields["general.type"].contents() == "adapter"
    assert reader.fields["adapter.type"].contents() == "lora"
    assert reader.fields["adapter.lora.alpha"].contents() == pytest.approx(8.0)
    expected, _ = lora_gguf.lora_tensors(model, "llama")
    got = {t.name: t for t in reader.tensors}
    assert set(got) == set(expected)
    for name, arr in expected.items():
        t = got[name]
        assert t.tensor_type == gguf.GGMLQuantizationType.F32
        assert list(t.shape) == list(reversed(arr.shape))  # ggml lists the fastest dimension first
        np.testing.assert_array_equal(np.asarray(t.data).reshape(arr.shape), arr)
    assert list(tmp_path.iterdir()) == [path]  # no temp file left behind


def test_zero_adapter_is_recognised_and_rslora_scaling_kept():
    fresh = get_peft_model(
        LlamaForCausalLM(
            LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=4)
        ),
        LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj"]),
    )
    assert lora_gguf.lora_is_zero(fresh)
    assert not lora_gguf.lora_is_zero(small_model())
    _, alpha = lora_gguf.lora_tensors(small_model(use_rslora=True), "llama")
    assert alpha == pytest.approx(8 / 4**0.5 * 4)  # rsLoRA scales by alpha / sqrt(r); llama.cpp by alpha / r


def test_a_model_without_lora_has_no_adapter():
    with pytest.raises(ExportError, match="no LoRA"):
        lora_gguf.lora_tensors(small_model(lora=False), "llama")


def tensor_data(path: Path, meta: lora_gguf.GGUFMetadata, name: str) -> np.ndarray:
    shape, ttype, offset = meta.tensors[name]
    assert ttype == int(gguf.GGMLQuantizationType.F32)
    return np.memmap(path, dtype="<f4", mode="r", offset=offset, shape=shape)


def test_full_export_carries_weights_hparams_and_the_template_tokenizer(tmp_path):
    model = small_model()
    path = tmp_path / "full.gguf"
    lora_gguf.export_full_gguf(model, embedded_gguf_path(), path)
    meta = lora_gguf.read_gguf_metadata(path)
    assert meta.get("llama.block_count") == 2
    assert meta.get("llama.embedding_length") == 32
    assert meta.get("llama.attention.head_count_kv") == 2
    assert meta.get("llama.rope.dimension_count") == 8
    assert meta.get("general.file_type") == int(gguf.LlamaFileType.ALL_F32)
    template = lora_gguf.read_gguf_metadata(embedded_gguf_path())
    for key in (
        "tokenizer.ggml.tokens",
        "tokenizer.ggml.merges",
        "tokenizer.ggml.token_type",
        "tokenizer.chat_template",
        "tokenizer.ggml.eos_token_id",
    ):
        assert meta.fields[key] == template.fields[key], key
    assert "output.weight" not in meta.tensors  # tied: llama.cpp reuses token_embd
    assert len(meta.tensors) == 2 + 2 * 9 and not any("lora" in n for n in meta.tensors)
    layer = model.base_model.model.model.layers[0]
    base_q = layer.self_attn.q_proj.base_layer.weight.detach().numpy()
    np.testing.assert_array_equal(tensor_data(path, meta, "blk.0.attn_q.weight"), lora_gguf.permute_qk_rows(base_q, 4))
    base_v = layer.self_attn.v_proj.base_layer.weight.detach().numpy()
    np.testing.assert_array_equal(tensor_data(path, meta, "blk.0.attn_v.weight"), base_v)
    emb = model.base_model.model.model.embed_tokens.weight.detach().numpy()
    np.testing.assert_array_equal(tensor_data(path, meta, "token_embd.weight"), emb)


def test_metadata_reader_agrees_with_the_gguf_package(tmp_path):
    path = tmp_path / "m.gguf"
    w = gguf.GGUFWriter(path, "llama")
    w.add_string("s", "héllo")
    w.add_array("tokens", ["a", "bb", "", "ü"])
    w.add_array("ids", [3, -1, 7])
    w.add_float32("f", 0.5)
    w.add_bool("b", True)
    w.add_uint64("u", 2**40)
    w.add_tensor("t", np.arange(6, dtype=np.float32).reshape(2, 3))
    w.add_tensor("v", np.ones(5, dtype=np.float32))
    w.write_header_to_file(), w.write_kv_data_to_file(), w.write_tensors_to_file(), w.close()
    ours = lora_gguf.read_gguf_metadata(path)
    theirs = gguf.GGUFReader(path)
    for key, field in theirs.fields.items():
        if key.startswith("GGUF."):
            continue
        assert ours.get(key) == pytest.approx(field.contents()) if key == "f" else ours.get(key) == field.contents()
        assert ours.fields[key][1] == int(field.types[0])
    for t in theirs.tensors:
        assert ours.tensors[t.name][:2] == (tuple(reversed([int(d) for d in t.shape])), int(t.tensor_type))
        assert ours.tensors[t.name][2] == t.data_offset
    np.testing.assert_array_equal(tensor_data(path, ours, "t"), np.arange(6).reshape(2, 3))


@pytest.mark.slow
def test_hparams_from_the_embedded_models_config_equal_its_gguf():
    """Slow: transformers parses the embedded model's whole GGUF header to build its config."""
    from transformers import AutoConfig

    path = embedded_gguf_path()
    config = AutoConfig.from_pretrained(path.parent, gguf_file=path.name)
    meta = lora_gguf.read_gguf_metadata(path)
    assert meta.get("general.file_type") == 3  # Q4_1
    for key, value, _ in lora_gguf._hparams(config, "llama"):
        assert meta.get(key) == pytest.approx(value), key


def test_full_export_refuses_unknown_architectures(tmp_path):
    model = small_model(lora=False)
    model.config.model_type = "gpt2"
    with pytest.raises(ExportError, match="gpt2"):
        lora_gguf.export_full_gguf(model, embedded_gguf_path(), tmp_path / "x.gguf")
