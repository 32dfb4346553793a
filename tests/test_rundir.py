"""A run goes on with the model it began with (rundir.keep_run_model): the cases by hand."""

from __future__ import annotations

import pytest

from sapo_core.config import NodeConfig
from sapo_core.rundir import keep_run_model

EMBEDDED = "smollm2-135m-instruct"


@pytest.mark.parametrize(
    "name, gguf_path, began_with, runs",
    [
        ("auto", "", None, "auto"),  # a new run: 'auto' chooses
        ("auto", "", EMBEDDED, EMBEDDED),  # a run of the embedded model: kept
        ("auto", "", "qwen2.5-0.5b-instruct", "qwen2.5-0.5b-instruct"),  # a bigger one: kept too
        ("auto", "", "my-model", "auto"),  # not a catalogue id (a gguf_path run before): not ours to keep
        ("auto", "/models/x.gguf", EMBEDDED, "auto"),  # a file named in the config wins
        ("qwen3-0.6b", "", EMBEDDED, "qwen3-0.6b"),  # named: the checkpoint check says what to do
    ],
)
def test_auto_keeps_the_model_the_run_began_with(name, gguf_path, began_with, runs):
    cfg = NodeConfig().replace(**{"model.name": name, "model.gguf_path": gguf_path})
    kept_cfg, said = keep_run_model(cfg, began_with)
    assert kept_cfg.model.name == runs
    assert kept_cfg.model.gguf_path == gguf_path
    assert bool(said) == (runs != name)
    if said:
        assert said.startswith(f"{runs}, the model this run began with")
