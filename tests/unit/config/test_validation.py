"""Every validation error names the file/key/value and says what would be valid."""

import pytest

from megatron.config import ConfigError, deepspeed_config, load_config

from .conftest import MINIMAL


def _load(write, text, **kwargs):
    return load_config([write("bad.yml", MINIMAL + text)], warn=[], **kwargs)


def test_unknown_key_names_file_and_closest_keys(write):
    with pytest.raises(ConfigError) as err:
        _load(write, "hiden_size_typo: 3\nnum_atention_heads: 4\n")
    msg = str(err.value)
    assert "bad.yml" in msg and "did you mean" in msg


def test_unknown_key_suggestion(write):
    with pytest.raises(ConfigError, match="did you mean 'hidden_dropout'"):
        _load(write, "hiden_dropout: 0.1\n")


def test_wrong_type_names_key_value_and_expected(write):
    with pytest.raises(ConfigError) as err:
        _load(write, "log_interval: often\n")
    assert "'log_interval'" in str(err.value) and "'often'" in str(err.value)
    assert "expected int" in str(err.value) and "bad.yml" in str(err.value)


def test_value_outside_choices_lists_them(write):
    with pytest.raises(ConfigError) as err:
        _load(write, "norm: batchnorm\n")
    msg = str(err.value)
    assert "'batchnorm'" in msg and "'layernorm'" in msg and "'rmsnorm'" in msg


def test_bool_is_not_an_int(write):
    with pytest.raises(ConfigError, match="eval_iters"):
        _load(write, "eval_iters: true\n")


def test_unknown_optimizer_lists_valid_ones(write):
    text = MINIMAL.replace("type: Adam", "type: Adafactor")
    with pytest.raises(ConfigError) as err:
        load_config([write("bad.yml", text)], warn=[])
    assert "Adafactor" in str(err.value) and "madgrad_wd" in str(err.value)


def test_inconsistent_batch_sizes_explain_the_arithmetic(write):
    with pytest.raises(ConfigError) as err:
        _load(write, "train_batch_size: 10\ngradient_accumulation_steps: 2\n", world_size=2)
    msg = str(err.value)
    assert "train_batch_size 10" in msg and "2 × gradient_accumulation_steps 2" in msg
    assert "data-parallel size 2 = 8" in msg


@pytest.mark.parametrize(
    "given, expected",
    [
        ({"train_batch_size": 16, "train_micro_batch_size_per_gpu": 2}, (16, 2, 4)),
        ({"train_batch_size": 16, "gradient_accumulation_steps": 2}, (16, 4, 2)),
        ({"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 3}, (12, 2, 3)),
    ],
)
def test_any_two_batch_sizes_derive_the_third(write, given, expected):
    text = MINIMAL.replace("train_micro_batch_size_per_gpu: 2\n", "")
    text += "".join(f"{k}: {v}\n" for k, v in given.items())
    cfg = load_config([write("b.yml", text)], world_size=2, warn=[])
    t = cfg.training
    got = (t.train_batch_size, t.train_micro_batch_size_per_gpu, t.gradient_accumulation_steps)
    assert got == expected


def test_world_size_not_divisible_by_model_ranks(write):
    with pytest.raises(ConfigError) as err:
        _load(write, "pipe_parallel_size: 2\nmodel_parallel_size: 2\n", world_size=6)
    assert "world size 6" in str(err.value) and "2 × 2 = 4" in str(err.value)


def test_heads_not_divisible_by_tensor_parallel(write):
    with pytest.raises(ConfigError) as err:
        _load(write, "model_parallel_size: 3\n", world_size=3)
    assert "num_attention_heads 4" in str(err.value) and "model_parallel_size 3" in str(err.value)


def test_heads_not_divisible_by_kv_heads(write):
    with pytest.raises(ConfigError, match="num_kv_heads 3"):
        _load(write, "num_kv_heads: 3\n")


def test_hidden_not_divisible_by_heads(write):
    text = MINIMAL.replace("hidden_size: 64", "hidden_size: 66")
    with pytest.raises(ConfigError, match="hidden_size 66 is not divisible by num_attention_heads"):
        load_config([write("bad.yml", text)], warn=[])


def test_zero_2_with_pipeline_says_use_the_plain_engine(write):
    with pytest.raises(ConfigError) as err:
        _load(write, "pipe_parallel_size: 1\nzero_optimization: {stage: 2}\n")
    assert "pipe_parallel_size: 0" in str(err.value) and "bad.yml" in str(err.value)


def test_zero_2_with_plain_engine_is_fine(write):
    cfg = _load(write, "pipe_parallel_size: 0\nzero_optimization: {stage: 3}\n")
    assert cfg.parallel.zero_stage == 3


def test_bad_zero_stage(write):
    with pytest.raises(ConfigError, match="one of 0, 1, 2, 3"):
        _load(write, "zero_optimization: {stage: 4}\n")


def test_untested_optimizer_with_zero_needs_the_flag(write):
    text = MINIMAL.replace("type: Adam", "type: Lion") + "zero_optimization: {stage: 1}\n"
    with pytest.raises(ConfigError, match="zero_allow_untested_optimizer"):
        load_config([write("bad.yml", text)], warn=[])
    cfg = load_config([write("ok.yml", text + "zero_allow_untested_optimizer: true\n")], warn=[])
    assert cfg.optimizer.optimizer_type == "Lion"


def test_deepspeed_extra_args_repeating_a_key(write):
    cfg = _load(write, "deepspeed_extra_args: {gradient_clipping: 2.0}\n")
    with pytest.raises(ConfigError, match="'gradient_clipping'"):
        deepspeed_config(cfg)


def test_deepspeed_extra_args_pass_through(write):
    cfg = _load(write, "deepspeed_extra_args: {comms_logger: {enabled: true}}\n")
    assert deepspeed_config(cfg)["comms_logger"] == {"enabled": True}


def test_fp16_and_bf16_together(write):
    with pytest.raises(ConfigError, match="both enabled"):
        _load(write, "fp16: {enabled: true}\nbf16: {enabled: true}\n")


def test_precision_key_alone_enables_fp16_defaults(write):
    cfg = _load(write, "precision: fp16\n")
    assert deepspeed_config(cfg)["fp16"] == {"enabled": True}


def test_bf16_pipeline_accumulates_in_fp32(write):
    cfg = _load(
        write, "precision: bfloat16\npipe_parallel_size: 1\nzero_optimization: {stage: 1}\n"
    )
    ds = deepspeed_config(cfg)
    assert ds["bf16"] == {"enabled": True} and ds["data_types"] == {"grad_accum_dtype": "fp32"}


def test_split_must_be_numbers(write):
    with pytest.raises(ConfigError, match="949,50,1"):
        _load(write, "split: train-heavy\n")


def test_data_weights_must_match_paths(write):
    with pytest.raises(ConfigError, match="one weight per path"):
        _load(write, "train_data_paths: [a, b]\ntrain_data_weights: [1.0]\n")


def test_attention_config_must_cover_the_layers(write):
    with pytest.raises(ConfigError, match="gives 3 layers but num_layers is 2"):
        _load(write, 'attention_config: [[["global"], 3]]\n')


def test_attention_config_patterns_expand(write):
    cfg = _load(write, 'attention_config: [[["global", "flash"], 1]]\n')
    assert cfg.model.layer_attention_types == ("global", "flash")


def test_derived_keys_cannot_be_set(write):
    with pytest.raises(ConfigError, match="derived"):
        _load(write, "data_parallel_size: 2\n")


def test_renamed_keys_map_and_unimplemented_keys_at_neox_default_pass(write):
    warn: list[str] = []
    a = write("a.yml", MINIMAL + "save_interval: 50\ntrain_data_path: d/x\nmoe_loss_coeff: 0.1\n")
    cfg = load_config([a], warn=warn)
    assert cfg.checkpointing.checkpoint_factor == 50
    assert cfg.data.train_data_paths == ["d/x"]
    assert cfg.unimplemented == {"moe_loss_coeff": 0.1}
    assert len(warn) == 2 and all("a.yml" in w and "now called" in w for w in warn)


def test_old_and_new_name_together_is_an_error(write):
    with pytest.raises(ConfigError, match="save_interval"):
        _load(write, "save_interval: 50\ncheckpoint_factor: 10\n")


def test_sequence_parallel_pipeline_keeps_activations_unsplit(write):
    text = "sequence_parallel: true\npipe_parallel_size: 2\nmodel_parallel_size: 2\n"
    cfg = _load(write, text, world_size=4)
    assert deepspeed_config(cfg)["pipeline"] == {
        "pipe_partitioned": False,
        "grad_partitioned": False,
    }
    plain = _load(write, "sequence_parallel: true\npipe_parallel_size: 1\n")
    assert "pipeline" not in deepspeed_config(plain)


def test_onebit_adam_refuses_zero(write):
    text = MINIMAL.replace("type: Adam", "type: OneBitAdam") + "zero_optimization: {stage: 1}\n"
    with pytest.raises(ConfigError, match="OneBitAdam cannot run with ZeRO stage 1"):
        load_config([write("bad.yml", text)], warn=[])


def test_optimizer_offload_needs_cpu_adam(write):
    zero = "zero_optimization: {stage: 2, offload_optimizer: {device: cpu}}\n"
    with pytest.raises(ConfigError, match="needs optimizer type CPU_Adam"):
        _load(write, zero)
    cfg = load_config([write("ok.yml", MINIMAL.replace("Adam", "CPU_Adam") + zero)], warn=[])
    assert deepspeed_config(cfg)["zero_optimization"]["offload_optimizer"] == {"device": "cpu"}


def test_no_save_optim_with_zero_3(write):
    with pytest.raises(ConfigError, match="no_save_optim with ZeRO stage 3"):
        _load(write, "no_save_optim: true\nzero_optimization: {stage: 3}\n")


def test_no_optimizer_section_is_exported(write):
    cfg = _load(write, "")
    assert "optimizer" not in deepspeed_config(cfg)


def test_bf16_pipeline_without_zero_warns_and_keeps_bf16_accumulation(write):
    warn: list[str] = []
    text = MINIMAL + "precision: bf16\npipe_parallel_size: 1\n"
    cfg = load_config([write("a.yml", text)], warn=warn)
    assert any("zero_optimization: {stage: 1}" in w for w in warn)
    assert "data_types" not in deepspeed_config(cfg)


@pytest.mark.parametrize(
    "text, message",
    [
        ("loss_chunk_tokens: -1\n", r"loss_chunk_tokens \(.*bad.yml\) must be >= 0"),
        (
            "loss_chunk_tokens: 512\nprecision: bf16\npipe_parallel_size: 1\n",
            r"loss_chunk_tokens \(.*bad.yml\): .* bf16 on the pipeline engine .*"
            r"set loss_chunk_tokens: 0 .*pipe_parallel_size: 0",
        ),
        (
            "loss_chunk_tokens: 512\ntrain_impl: rm\n",
            r"loss_chunk_tokens \(.*bad.yml\) .*train_impl: rm .*set loss_chunk_tokens: 0",
        ),
    ],
)
def test_loss_chunk_tokens_is_refused_where_it_would_not_apply(write, text, message):
    with pytest.raises(ConfigError, match=message):
        _load(write, text, vocab_size=100)


@pytest.mark.parametrize(
    "text, chunk",
    [
        ("", 1024),  # on by default: 1024 tokens of a 128-row (padded) vocabulary
        ("pipe_parallel_size: 0\nzero_optimization: {stage: 3}\n", 1024),  # ZeRO 3 too
        ("loss_chunk_tokens: 0\n", 0),  # off
        ("precision: bf16\npipe_parallel_size: 1\n", 0),  # off: bf16 on the pipeline engine
        ("precision: bf16\npipe_parallel_size: 0\n", 1024),  # on: bf16 on the plain engine
        ("loss_chunk_tokens: 96\n", 96),  # as set
    ],
)
def test_loss_chunk_tokens_defaults_on(write, text, chunk):
    cfg = _load(write, text, vocab_size=100)
    assert cfg.model.loss_chunk_tokens == chunk


def test_loss_chunk_tokens_default_follows_the_vocabulary(write):
    """256 MiB of fp32 logits a chunk at most: Qwen3's 151,936 rows take 256-token chunks on
    one tensor-parallel rank and 512 on two (a power of two, written out here)."""
    assert _load(write, "", vocab_size=151_936).model.loss_chunk_tokens == 256
    tp2 = _load(write, "model_parallel_size: 2\n", vocab_size=151_936, world_size=2)
    assert tp2.model.loss_chunk_tokens == 512
    assert 512 * (tp2.model.padded_vocab_size // 2) * 4 <= 256 * 2**20
    assert 1024 * (tp2.model.padded_vocab_size // 2) * 4 > 256 * 2**20


@pytest.mark.parametrize("precision", ["fp16", "bf16", "fp32"])
def test_loss_chunk_tokens_is_accepted_in_every_precision(write, precision):
    """fp16 too: each chunk's logits gradient is lifted into fp16's range before its cast and
    the gradients stay fp32 until the loss scale arrives (`chunked_cross_entropy.py`)."""
    cfg = _load(write, f"loss_chunk_tokens: 512\nprecision: {precision}\n", vocab_size=100)
    assert cfg.model.loss_chunk_tokens == 512 and cfg.precision.dtype == precision


def test_loss_chunk_tokens_reaches_the_model(write):
    from megatron.model import ModelArgs

    cfg = _load(write, "loss_chunk_tokens: 512\n", vocab_size=100)
    assert ModelArgs.from_config(cfg).loss_chunk_tokens == 512
