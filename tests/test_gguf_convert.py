"""Converting the GGUF for training reads it once (policy.gguf_read_once), and converts it to the
same bytes as transformers reading it three times."""

from __future__ import annotations

import hashlib

import gguf
import pytest
import torch

from sapo_core import modelfiles
from sapo_core.policy import _load_base, gguf_read_once, load_base


def _tiny_gguf(path):
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_block_count(2)
    w.add_tensor("token_embd.weight", torch.zeros(4, 8).numpy())
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def test_one_reader_per_file_and_one_name_map_per_architecture_inside_the_block(tmp_path):
    a, b = _tiny_gguf(tmp_path / "a.gguf"), _tiny_gguf(tmp_path / "b.gguf")
    real_reader, real_map = gguf.GGUFReader, gguf.get_tensor_name_map
    with gguf_read_once():
        first = gguf.GGUFReader(a)
        assert gguf.GGUFReader(str(a)) is first  # the same file, however named
        assert gguf.GGUFReader(b) is not first
        assert first.fields["general.architecture"].contents() == "llama"
        m = gguf.get_tensor_name_map(gguf.MODEL_ARCH.LLAMA, 2)
        assert gguf.get_tensor_name_map(gguf.MODEL_ARCH.LLAMA, 2) is m
        assert gguf.get_tensor_name_map(gguf.MODEL_ARCH.LLAMA, 3) is not m
    assert (gguf.GGUFReader, gguf.get_tensor_name_map) == (real_reader, real_map)
    with pytest.raises(RuntimeError), gguf_read_once():
        raise RuntimeError("a conversion that fails")
    assert (gguf.GGUFReader, gguf.get_tensor_name_map) == (real_reader, real_map)  # put back all the same
    assert gguf.GGUFReader(a) is not gguf.GGUFReader(a)


def _digests(root):
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


@pytest.mark.slow
def test_reading_the_embedded_gguf_once_converts_it_to_the_same_bytes(tmp_path):
    gguf_path = modelfiles.embedded_gguf_path()
    once, thrice = tmp_path / "once", tmp_path / "thrice"
    load_base(gguf_path, once)
    _load_base(gguf_path, thrice, torch.float32)  # transformers as it is: three reads
    got, want = _digests(once), _digests(thrice)
    assert any(k.endswith("model.safetensors") for k in got) and any(k.endswith("tokenizer.json") for k in got)
    assert got == want
