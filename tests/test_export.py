"""`sapo-node export`: each format written from a real run directory and loaded by the tool it is
meant for (llama_cpp, transformers, peft), and the merged GGUF's log-probs against the trainer's.

The run directory is the project's own: the config snapshot, a checkpoint written by
`Checkpoints.save` and a run store. Its adapter is the embedded model's LoRA with lora_B set to
small random values (what a few hundred rounds of updates look like in size), so a merge that
is skipped or applied with the wrong Q/K row order shows up in the log-probs.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from sapo_core import paths
from sapo_core.export import ExportFailed, ExportRequest, export, load_trained

from helpers import RUN_MODEL_ID, RUN_ROUNDS, make_run

MODEL_ID = RUN_MODEL_ID  # the run make_run leaves
ROUND = RUN_ROUNDS


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("run")
    make_run(d)
    return d


def test_request_rejects_nonsense_with_what_to_do(tmp_path):
    with pytest.raises(ExportFailed, match="choose one of"):
        ExportRequest(run_dir=tmp_path, output=tmp_path / "o", format="onnx")
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "x").write_text("x")
    with pytest.raises(ExportFailed, match="not an empty folder"):
        ExportRequest(run_dir=tmp_path, output=tmp_path / "full")
    with pytest.raises(ExportFailed, match="no config.toml"):
        export(ExportRequest(run_dir=tmp_path / "nothing", output=tmp_path / "o", format="peft"))


@pytest.mark.slow
def test_missing_round_names_the_kept_ones(run_dir, tmp_path):
    with pytest.raises(ExportFailed, match=f"kept: {ROUND}"):
        load_trained(run_dir, round=ROUND + 5)


@pytest.mark.slow
def test_peft_adapter_loads_over_the_base_and_gives_the_trainer_logits(run_dir, tmp_path):
    from peft import PeftModel

    from sapo_core.modelfiles import embedded_gguf_path
    from sapo_core.policy import load_base

    files = {f.name for f in export(ExportRequest(run_dir=run_dir, output=tmp_path / "peft", format="peft"))}
    assert {"adapter_config.json", "adapter_model.safetensors", "README.md"} <= files
    base, tok = load_base(embedded_gguf_path(), paths.converted_models_dir())
    model = PeftModel.from_pretrained(base, tmp_path / "peft").eval()
    trained = load_trained(run_dir)
    ids = torch.tensor([tok("What is 3 + 4? Answer: 7")["input_ids"]])
    with torch.no_grad():
        torch.testing.assert_close(model(input_ids=ids).logits, trained.policy.model(input_ids=ids).logits)
    card = (tmp_path / "peft" / "README.md").read_text()
    assert "apache-2.0" in card and f"{ROUND} rounds" in card
    assert "9 own, 6 from peers" in card  # (5 trained - 2 external) x 3 rounds; 2 x 3
    assert "from peers: 6 peers' groups trained here\n" in card
    assert "held-out: 0.10 at start -> 0.27 now (+0.17, ±0.07)" in card
    assert "[model]" in card  # the config


@pytest.mark.slow
def test_hf_folder_loads_with_transformers_and_equals_the_merged_policy(run_dir, tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig

    export(ExportRequest(run_dir=run_dir, output=tmp_path / "hf", format="hf"))
    names = {f.name for f in (tmp_path / "hf").iterdir()}
    assert {"model.safetensors", "config.json", "generation_config.json", "README.md"} <= names
    model = AutoModelForCausalLM.from_pretrained(tmp_path / "hf").eval()
    tok = AutoTokenizer.from_pretrained(tmp_path / "hf")
    assert GenerationConfig.from_pretrained(tmp_path / "hf").max_new_tokens == 64
    trained = load_trained(run_dir)
    ids = torch.tensor([tok("The capital of France is")["input_ids"]])
    with torch.no_grad():
        torch.testing.assert_close(
            model(input_ids=ids).logits, trained.policy.model(input_ids=ids).logits, atol=1e-3, rtol=1e-3
        )


def _llama_logprobs(path: Path, prompt: list[int], completion: list[int]) -> list[float]:
    import numpy as np
    from llama_cpp import Llama

    llm = Llama(model_path=str(path), n_ctx=256, n_threads=2, logits_all=True, verbose=False)
    try:
        llm.eval(prompt + completion)
        scores = np.asarray(llm.scores[len(prompt) - 1 : len(prompt) + len(completion) - 1], dtype=np.float64)
    finally:
        llm.close()
    scores -= scores.max(axis=1, keepdims=True)
    lse = np.log(np.exp(scores).sum(axis=1))
    return [float(scores[i, t] - lse[i]) for i, t in enumerate(completion)]


@pytest.mark.slow
@pytest.mark.parametrize("quant", ["f16", "q8_0"])
def test_merged_gguf_loads_in_llama_cpp_with_the_trainer_logprobs(run_dir, tmp_path, quant):
    from sapo_core.sampler.llamacpp import logprob_drift, trainer_logprobs

    out = tmp_path / quant
    files = export(
        ExportRequest(run_dir=run_dir, output=out, format="ollama" if quant == "q8_0" else "gguf", quant=quant)
    )
    gguf = next(f for f in files if f.suffix == ".gguf")
    trained = load_trained(run_dir)
    policy = trained.policy
    texts = [
        ("Calculate 12 + 30. End with 'Answer: N'.", "12 + 30 = 42, so the sum is forty-two.\nAnswer: 42"),
        ("Simplify the fraction 18/24.", "Both divide by 6: 18/24 = 3/4.\nAnswer: 3/4"),
        ("What day of the week is 3 days after Monday?", "Tuesday, Wednesday, Thursday.\nAnswer: Thursday"),
    ]
    ours, theirs, plain = [], [], []
    for question, answer in texts:
        prompt = policy.encode_prompt([{"role": "user", "content": question}])
        completion = policy.encode_completion(answer)
        ours.append(_llama_logprobs(gguf, prompt, completion))
        theirs.append(trainer_logprobs(policy, prompt, [completion])[0])
    drift = logprob_drift(ours, theirs)
    policy.model.disable_adapter_layers()
    for question, answer in texts:
        prompt = policy.encode_prompt([{"role": "user", "content": question}])
        plain.append(trainer_logprobs(policy, prompt, [policy.encode_completion(answer)])[0])
    base = logprob_drift(plain, theirs)
    print(
        f"merged {quant} GGUF vs trainer: {drift:.4f} nats/token over {sum(map(len, theirs))} tokens; "
        f"base vs trained {base:.4f}; {gguf.stat().st_size / 1e6:.0f} MB"
    )
    # F16 is the exact merge (0.0026 over these 60 tokens). Q8_0 adds llama.cpp's 8-bit rounding of
    # weights and activations in every layer: 0.070 here, about as far as the node's own Q4_1
    # sampler is from the trainer; keeping the output matrix in F16 gave 0.063 for 18 % more bytes,
    # so it is not done. The 0.05 holds for F16 only, which is why F16 is the default export.
    assert drift < (0.05 if quant == "f16" else 0.1)
    assert base > 2 * drift  # the adapter matters, and it is in the file
    if quant == "q8_0":
        modelfile = (out / "Modelfile").read_text()
        assert f"FROM ./{gguf.name}" in modelfile and 'PARAMETER stop "<|im_end|>"' in modelfile
        assert "<|im_start|>assistant" in modelfile and "SYSTEM" in modelfile
