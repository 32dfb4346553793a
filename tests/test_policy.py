"""The policy's prompt encoding: Qwen3's chat template is called with thinking off."""

from __future__ import annotations

import copy

from sapo_core import modelfiles, paths
from sapo_core.policy import Policy, load_tokenizer

# The part of Qwen3's chat template that decides about thinking (Qwen/Qwen3-0.6B, tokenizer_config.json).
QWEN3_TAIL = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n"
    "{% if enable_thinking is defined and enable_thinking is false %}<think>\n\n</think>\n\n{% endif %}{% endif %}"
)


def test_prompts_close_qwen3s_think_block_before_the_answer():
    tok = copy.deepcopy(load_tokenizer(modelfiles.embedded_gguf_path(), paths.converted_models_dir()))
    tok.chat_template = QWEN3_TAIL
    policy = Policy(model=None, tokenizer=tok, model_id="qwen3-like", gguf_path=None, lora=False)
    text = tok.decode(policy.encode_prompt([{"role": "user", "content": "Calculate 4 - 1."}]))
    assert text.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")


def test_templates_without_thinking_are_unchanged():
    tok = load_tokenizer(modelfiles.embedded_gguf_path(), paths.converted_models_dir())
    policy = Policy(model=None, tokenizer=tok, model_id="smollm2", gguf_path=None, lora=False)
    messages = [{"role": "user", "content": "Calculate 4 - 1."}]
    plain = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
    plain = plain["input_ids"] if hasattr(plain, "keys") else plain
    assert policy.encode_prompt(messages) == list(plain)
