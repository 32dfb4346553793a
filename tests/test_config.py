"""Config: defaults are valid, TOML round-trips, nonsense is rejected with the key's name."""

import pytest

from sapo_core.config import ConfigError, NodeConfig, dump_config, field_help, from_dict, load_config, save_config


def test_defaults_roundtrip_through_toml(tmp_path):
    cfg = NodeConfig()
    save_config(cfg, tmp_path / "c.toml")
    assert load_config(tmp_path / "c.toml") == cfg


def test_paper_defaults():
    cfg = NodeConfig()
    assert (cfg.round.local_groups, cfg.round.external_groups, cfg.sampler.group_size) == (4, 4, 8)
    assert (cfg.train.epsilon_low, cfg.train.epsilon_high, cfg.train.kl_beta) == (0.2, 0.28, 0.0)
    assert cfg.tasks.format_reward == 0.0


def test_replace_with_dotted_keys():
    cfg = NodeConfig().replace(**{"train.learning_rate": 1e-4, "round.external_groups": 0})
    assert cfg.train.learning_rate == 1e-4 and cfg.round.external_groups == 0


def test_task_weights_replace_not_merge():
    cfg = NodeConfig().replace(**{"tasks.weights": {"bf": 1.0}})
    assert cfg.tasks.weights == {"bf": 1.0}


@pytest.mark.parametrize(
    "data, message",
    [
        ({"train": {"learning_rate": -1}}, "train.learning_rate"),
        ({"sampler": {"group_size": 1}}, "sampler.group_size"),
        ({"sampler": {"backend": "vllm"}}, "sampler.backend"),
        ({"round": {"local_groups": 0}}, "round.local_groups"),
        ({"train": {"learnin_rate": 1e-4}}, "unknown key"),
        ({"train": {"learning_rate": "fast"}}, "train.learning_rate: expected float"),
        ({"train": 3}, "expected a table"),
        ({"tasks": {"weights": {}}}, "tasks.weights"),
        ({"control": {"throttle": 2.0}}, "control.throttle"),
        ({"eval": {"max_new_tokens": -1}}, "eval.max_new_tokens"),
    ],
)
def test_nonsense_is_rejected_with_its_key(data, message):
    with pytest.raises(ConfigError, match=message):
        from_dict(data)


def test_broken_toml_is_a_clear_error(tmp_path):
    p = tmp_path / "c.toml"
    p.write_text("[train\nlearning_rate = 1")
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_config(p)
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(tmp_path / "missing.toml")


def test_every_field_has_help():
    helps = field_help()
    assert "train.epsilon_high" in helps
    assert all(helps.values()), [k for k, v in helps.items() if not v]
    assert dump_config(NodeConfig()).startswith('run_dir = ""')
