"""Merging files, key normalisation, !include, TOML/JSON, --set overrides."""

import json

import pytest

from megatron.config import ConfigError, load_config

from .conftest import MINIMAL


def test_files_merge_in_order_and_dashes_equal_underscores(write):
    a = write("a.yml", MINIMAL)
    b = write("b.yml", "hidden-dropout: 0.1\nlog-interval: 7\n")
    cfg = load_config([a, b], warn=[])
    assert cfg.model.hidden_dropout == 0.1 and cfg.logging.log_interval == 7
    assert cfg.config_files == (str(a), str(b))


def test_key_in_two_files_names_both(write):
    a = write("a.yml", MINIMAL)
    b = write("b.yml", "hidden_size: 128\n")
    with pytest.raises(ConfigError) as err:
        load_config([a, b], warn=[])
    assert "'hidden_size'" in str(err.value)
    assert str(a) in str(err.value) and str(b) in str(err.value)


def test_dash_and_underscore_spellings_of_one_key_conflict(write):
    a = write("a.yml", MINIMAL + "hidden-dropout: 0.1\nhidden_dropout: 0.2\n")
    with pytest.raises(ConfigError, match="hidden_dropout"):
        load_config([a], warn=[])


def test_include_inserts_a_file_as_a_section(write):
    write("zero.yml", "stage: 1\noverlap_comm: true\n")
    a = write("a.yml", MINIMAL + "zero_optimization: !include zero.yml\n")
    cfg = load_config([a], warn=[])
    assert cfg.parallel.zero_optimization == {"stage": 1, "overlap_comm": True}
    assert cfg.parallel.zero_stage == 1


def test_include_of_a_missing_file_names_it(write):
    a = write("a.yml", MINIMAL + "zero_optimization: !include nope.yml\n")
    with pytest.raises(ConfigError, match="nope.yml"):
        load_config([a], warn=[])


def test_json_and_toml_files(write):
    a = write("a.json", json.dumps({"num_layers": 2, "hidden_size": 64, "seq_length": 16}))
    b = write(
        "b.toml",
        """
        num_attention_heads = 4
        train_micro_batch_size_per_gpu = 2
        train_iters = 5
        [optimizer]
        type = "AdamW"
        [optimizer.params]
        lr = 1e-3
        """,
    )
    cfg = load_config([a, b], warn=[])
    assert cfg.optimizer.optimizer_type == "AdamW" and cfg.optimizer.lr == 1e-3


def test_set_overrides_are_typed_and_reach_into_sections(write):
    a = write("a.yml", MINIMAL)
    cfg = load_config(
        [a],
        ["train_iters=3", "optimizer.params.lr=5e-4", "use-wandb=true", "split=90,5,5"],
        warn=[],
    )
    assert cfg.training.train_iters == 3 and cfg.optimizer.lr == 5e-4
    assert cfg.logging.use_wandb is True and cfg.data.split == "90,5,5"


def test_set_without_equals_is_an_error(write):
    with pytest.raises(ConfigError, match="KEY=VALUE"):
        load_config([write("a.yml", MINIMAL)], ["train_iters"], warn=[])


def test_missing_file_is_named():
    with pytest.raises(ConfigError, match="no-such-config"):
        load_config(["no-such-config.yml"], warn=[])


def test_yaml_syntax_error_names_the_file(write):
    a = write("a.yml", "num_layers: [1, 2\n")
    with pytest.raises(ConfigError, match="a.yml"):
        load_config([a], warn=[])


def test_exponent_numbers_written_without_dot_are_numbers(write):
    a = write("a.yml", MINIMAL.replace("lr: 0.001", "lr: 6e-4, eps: 1e-8") + "min_lr: 6e-5\n")
    cfg = load_config([a], warn=[])
    assert cfg.optimizer.lr == 6e-4 and cfg.lr.min_lr == 6e-5
    assert cfg.optimizer.optimizer_params["eps"] == 1e-8
