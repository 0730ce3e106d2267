"""What GPT-NeoX defaults, we default the same way (with a warning naming it); what only
training needs is not demanded from generate.py/eval.py configs."""

import pytest

from megatron.config import ConfigError, load_config
from megatron.config.resolve import is_training_script

MODEL = """
num_layers: 2
hidden_size: 64
num_attention_heads: 4
seq_length: 32
"""
TRAINING = "train_micro_batch_size_per_gpu: 2\ntrain_iters: 10\n"


def test_no_optimizer_section_trains_with_neox_adam(write):
    warn: list[str] = []
    cfg = load_config([write("model.yml", MODEL + TRAINING)], warn=warn)
    o = cfg.optimizer
    # GPT-NeoX's OPT_DEFAULT / OPT_PARAMS_DEFAULTS: Adam, lr 1e-3, betas (0.9, 0.999), eps 1e-8.
    assert o.optimizer_type == "Adam" and o.lr == 1e-3
    assert o.optimizer_params == {"betas": [0.9, 0.999], "eps": 1e-8}
    assert warn == [
        "using GPT-NeoX's default optimizer Adam (betas [0.9, 0.999], eps 1e-08), lr 0.001: "
        "the config sets none"
    ]


def test_optimizer_section_without_lr_or_type_takes_neox_defaults(write):
    warn: list[str] = []
    text = MODEL + TRAINING + "optimizer: {params: {betas: [0.9, 0.95]}}\n"
    cfg = load_config([write("model.yml", text)], warn=warn)
    assert cfg.optimizer.optimizer_type == "Adam" and cfg.optimizer.lr == 1e-3
    assert cfg.optimizer.optimizer_params == {"betas": [0.9, 0.95]}
    assert len(warn) == 1 and "optimizer.type Adam" in warn[0] and "lr 0.001" in warn[0]


def test_sample_input_file_means_input_file_generation(write):
    cfg = load_config([write("g.yml", MODEL + "sample_input_file: p.txt\n")], training=False)
    assert cfg.generation.text_gen_type == "input-file"
    cfg = load_config([write("u.yml", MODEL)], training=False)
    assert cfg.generation.text_gen_type == "unconditional"


def test_model_and_checkpoint_config_resolves_for_generation_not_training(write):
    path = write("model.yml", MODEL + "load: ckpt\n")
    warn: list[str] = []
    cfg = load_config([path], warn=warn, training=False)
    assert cfg.checkpointing.load == "ckpt" and cfg.training.train_batch_size is None
    assert warn == []
    with pytest.raises(ConfigError, match="train_micro_batch_size_per_gpu"):
        load_config([path], warn=[])


@pytest.mark.parametrize(
    "script, training",
    [("train.py", True), ("generate.py", False), ("/x/eval.py", False), ("tools/w.py", True)],
)
def test_which_scripts_train(script, training):
    assert is_training_script(script) is training
