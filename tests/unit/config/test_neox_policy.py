"""GPT-NeoX keys we do not implement: refused, accepted at GPT-NeoX's default, or warned about
when they cannot change the run; schema values nothing builds are refused at resolution."""

import typing

import pytest

from megatron.config import ConfigError, load_config
from megatron.config.config import GROUPS, KEY_TO_GROUP
from megatron.config.neox.keys import IMPLEMENTED, NEOX_KEYS, NO_EFFECT, REFUSED, REFUSED_VALUES
from megatron.config.schema import field_types
from tests.unit.config.conftest import MINIMAL

# Defaults of GPT-NeoX's megatron/neox_arguments/neox_args.py (2024), copied by hand from its
# source; the classification must accept exactly these.
NEOX_DEFAULTS = {
    "expansion_factor": None,
    "layernorm_fusion": False,
    "rmsnorm_fusion": False,
    "opt_pos_emb_offset": 0,
    "sparsity_config": None,
    "num_unique_layers": None,
    "param_sharing_style": "grouped",
    "use_cpu_initialization": False,
    "rotary_save_freqs_buffer": False,
    "soft_prompt_tuning": None,
    "output_layer_parallelism": "column",
    "bias_dropout_fusion": False,
    "fp16_lm_cross_entropy": False,
    "bias_gelu_fusion": False,
    "use_bnb_optimizer": False,
    "short_seq_prob": 0.1,
    "lazy_mpu_init": False,
    "adlr_autoresume": False,
    "adlr_autoresume_interval": 1000,
    "onnx_safe": False,
    "deepscale": False,
    "deepscale_config": None,
    "s3_path": None,
    "s3_chunk_size": 104_857_600,
    "checkpoint_validation_with_forward_pass": False,
    "deepspeed_activation_checkpointing": True,
    "hysteresis": 2,
    "loss_scale": None,
    "loss_scale_window": 1000.0,
    "min_scale": 1.0,
    "char_level_ppl": False,
    "return_logits": False,
    "wandb_init_all_ranks": False,
    "log_grad_pct_zeros": False,
    "log_optimizer_states": False,
    "log_gradient_noise_scale": False,
    "gradient_noise_scale_n_batches": 5,
    "gradient_noise_scale_cpu_offload": False,
    # GPT-NeoX 2025 (MoE group and REINFORCE, online data, weight serving)
    "fp32_reinforce": True,
    "kl_impl": "mse",
    "kl_div_beta": 0.1,
    "reinforce_leave_one_out": False,
    "online_dataserver_ips": "localhost",
    "online_dataserver_ports": 10000,
    "serve_model_weights": False,
    "weight_server_port": 6000,
    "te_columnparallel": False,
    "te_rowparallel": False,
    "te_layernorm_mlp": False,
    "te_mha": False,
    "te_fp8_format": "hybrid",
    "te_fp8_wgrad": True,
    "te_fp8_amax_history_len": 1,
    "te_fp8_amax_compute_algo": "most_recent",
    "te_fp8_margin": 0,
    "te_fp8_mha": False,
    # GPT-NeoX 2024 MoE keys
    "moe_loss_coeff": 0.1,
    "create_moe_param_group": True,
    "use_tutel": False,
    "use_flashattn_swiglu": False,
}

# Our keys whose default GPT-NeoX also defines (same file).
NEOX_DEFAULTS_OF_OUR_KEYS = {
    "use_mup": False,
    "coord_check": False,
    "save_base_shapes": False,
    "base_shapes_file": None,
    "mup_init_scale": 1.0,
    "mup_attn_temp": 1.0,
    "mup_output_temp": 1.0,
    "mup_embedding_mult": 1.0,
    "mup_rp_embedding_mult": 1.0,
    "mup_width_scale": 2,
    "rpe_num_buckets": 32,
    "rpe_max_distance": 128,
    "gmlp_attn_dim": 64,
    "moe_expert_interval": 1,
    "train_impl": "normal",
    "dpo_fp32": True,
    "dpo_reference_free": False,
    "dpo_beta": 0.1,
    "kto_fp32": True,
    "kto_desirable_weight": 1.0,
    "kto_undesirable_weight": 1.0,
    "kto_beta": 0.1,
    "weight_decay": 0.1,
    "gradient_clipping": 1.0,
    "pos_emb": "learned",
    "norm": "layernorm",
    "activation": "gelu",
    "init_method": "normal",
    "output_layer_init_method": "scaled_normal",
    "hidden_dropout": 0.0,
    "attention_dropout": 0.0,
    "lr_decay_style": "linear",
    "warmup": 0.01,
    "min_lr": 0.0,
    "log_interval": 100,
    "eval_interval": 1000,
    "eval_iters": 100,
    "seed": 1234,
    "num_workers": 2,
    "make_vocab_size_divisible_by": 128,
    "data_impl": "infer",
    "pipe_partition_method": "type:transformer|mlp",
    "profile": False,
    "profile_step_start": 10,
    "profile_step_stop": 12,
    "memory_profiling": False,
    "memory_profiling_path": None,
    "use_comet": None,
    "comet_workspace": None,
    "comet_project": None,
    "comet_experiment_name": None,
    "comet_tags": None,
    "comet_others": None,
    "dim_att": None,
    "head_size": None,
    "ffn_dim": None,
}


def _load(write, text, **kw):
    kw.setdefault("warn", [])
    return load_config([write("run.yml", MINIMAL + text)], **kw)


@pytest.mark.parametrize("key", sorted(NEOX_DEFAULTS))
def test_table_defaults_are_gpt_neox_defaults(key):
    assert NEOX_KEYS[key].defaults[0] == NEOX_DEFAULTS[key]


def test_our_defaults_are_gpt_neox_defaults():
    for key, expected in NEOX_DEFAULTS_OF_OUR_KEYS.items():
        assert getattr(GROUPS[KEY_TO_GROUP[key]](), key) == expected, key


def test_every_unimplemented_key_has_a_class_and_advice():
    for key, spec in NEOX_KEYS.items():
        assert key not in KEY_TO_GROUP, key
        assert spec.kind in (NO_EFFECT, REFUSED, IMPLEMENTED) and spec.advice, key
        assert (spec.kind == IMPLEMENTED) == (spec.implies is not None), key


@pytest.mark.parametrize(
    "text, key",
    [
        ("moe_num_experts: 8\nmoe_loss_coeff: 0.5\n", "moe_loss_coeff"),
        ("te_fp8_mha: true\n", "te_fp8_mha"),
        ("num_unique_layers: 1\n", "num_unique_layers"),
        ("soft_prompt_tuning: {enabled: true, num_tokens: 10}\n", "soft_prompt_tuning"),
        ("short_seq_prob: 0.2\n", "short_seq_prob"),
        ("output_layer_parallelism: row\n", "output_layer_parallelism"),
        ("expansion_factor: 4\n", "expansion_factor"),
        ("fp16_lm_cross_entropy: true\n", "fp16_lm_cross_entropy"),
        ("hysteresis: 4\n", "hysteresis"),
    ],
)
def test_keys_that_change_the_run_are_refused_naming_key_and_file(write, text, key):
    with pytest.raises(ConfigError) as err:
        _load(write, text)
    message = str(err.value)
    assert f"'{key}'" in message and "run.yml" in message
    assert "GPT-NeoX's default" in message


def test_keys_of_planned_features_say_so(write):
    with pytest.raises(ConfigError, match=r"moe_loss_coeff.*\(planned, not built yet\)"):
        _load(write, "moe_num_experts: 8\nmoe_loss_coeff: 0.5\n")


def test_every_refusal_is_reported_at_once(write):
    with pytest.raises(ConfigError) as err:
        _load(write, "moe_num_experts: 8\nmoe_loss_coeff: 0.2\nte_fp8_mha: true\nhysteresis: 4\n")
    keys = ("moe_loss_coeff", "te_fp8_mha", "hysteresis")
    assert all(f"'{k}'" in str(err.value) for k in keys)


def test_neox_default_values_pass_silently(write):
    warn: list[str] = []
    text = "moe_loss_coeff: 0.1\noutput_layer_parallelism: column\n"
    cfg = _load(write, text + "hysteresis: 2\n", warn=warn)
    assert warn == []
    assert cfg.unimplemented["moe_loss_coeff"] == 0.1 and cfg.unimplemented["hysteresis"] == 2


def test_dependent_keys_without_their_feature_warn(write):
    warn: list[str] = []
    text = "moe_loss_coeff: 0.5\nte_fp8_margin: 2\nparam_sharing_style: flat\n"
    cfg = _load(write, text, warn=warn)
    assert cfg.unimplemented == {
        "moe_loss_coeff": 0.5,
        "te_fp8_margin": 2,
        "param_sharing_style": "flat",
    }
    assert len(warn) == 3 and all("run.yml" in w and "no effect without" in w for w in warn)
    assert any("moe_num_experts > 1" in w for w in warn)


def test_no_effect_keys_warn_once_and_only_off_default(write):
    warn: list[str] = []
    text = "bias_dropout_fusion: true\nlog_grad_pct_zeros: false\nlog_optimizer_states: true\n"
    _load(write, text, warn=warn)
    assert len(warn) == 2 and all("has no effect here" in w for w in warn)


@pytest.mark.parametrize("text, key", [("data_impl: cached\n", "data_impl")])
def test_schema_values_nothing_builds_are_refused(write, text, key):
    with pytest.raises(ConfigError, match=f"config key '{key}' .*run.yml.*not supported"):
        _load(write, text)


def test_precompute_generation_needs_the_model_name_it_writes_under(write):
    with pytest.raises(ConfigError, match="text_gen_type: precompute.*precompute_model_name"):
        _load(write, "text_gen_type: precompute\n", training=False)
    cfg = _load(write, "text_gen_type: precompute\nprecompute_model_name: sft\n", training=False)
    assert cfg.generation.text_gen_type == "precompute"


def test_bias_gelu_fusion_trains_gpt_neox_tanh_gelu(write):
    import torch

    from megatron.model.activations import build_activation

    cfg = _load(write, "bias_gelu_fusion: true\n")
    assert cfg.model.activation == "gelu_tanh"
    x = torch.linspace(-6, 6, 1001, dtype=torch.float64)
    # GPT-NeoX's fused_bias_gelu.py: x * 0.5 * (1 + tanh(0.79788456 * x * (1 + 0.044715 x^2)))
    neox = x * 0.5 * (1.0 + torch.tanh(0.79788456 * x * (1 + 0.044715 * x * x)))
    torch.testing.assert_close(build_activation(cfg.model.activation)(x), neox)
    assert (build_activation("gelu")(x) - neox).abs().max() > 1e-4  # exact GeLU differs
    gated = _load(write, "bias_gelu_fusion: true\nactivation: swiglu\n")
    assert gated.model.activation == "swiglu"


def _literal_choices(key: str) -> set[str]:
    annotation = field_types(GROUPS[KEY_TO_GROUP[key]])[key]
    args = typing.get_args(annotation)
    if type(None) in args:  # Optional[Literal[...]]
        args = typing.get_args(next(a for a in args if a is not type(None)))
    return set(args)


def _refused_choices(key: str) -> set[str]:
    return {value for k, value in REFUSED_VALUES if k == key}


def test_every_model_choice_is_built_or_refused():
    from megatron.model.activations import ACTIVATIONS
    from megatron.model.init_methods import INIT_METHODS
    from megatron.model.norms import NORMS
    from megatron.model.positional import POSITIONAL_ENCODINGS

    registries = {
        "pos_emb": POSITIONAL_ENCODINGS,
        "norm": NORMS,
        "activation": ACTIVATIONS,
        "init_method": INIT_METHODS,
        "output_layer_init_method": INIT_METHODS,
    }
    for key, registry in registries.items():
        choices = _literal_choices(key)
        assert choices - _refused_choices(key) == set(registry), key
        assert not _refused_choices(key) & set(registry), key


def test_every_attention_type_the_model_builds_resolves_and_no_other(write):
    from megatron.model.attention_backends import ATTENTION_BACKENDS
    from megatron.model.specs import BLOCK_LAYERS

    for kind in (*ATTENTION_BACKENDS, *BLOCK_LAYERS):
        cfg = _load(write, f"attention_config: [[[{kind}], 2]]\n")
        assert cfg.model.layer_attention_types == (kind, kind)
    for kind in ("local", "sparse_fixed", "bigbird"):
        with pytest.raises(ConfigError, match=f"attention_config.*run.yml.*'{kind}'") as err:
            _load(write, f"attention_config: [[[{kind}], 2]]\n")
        assert f"{kind}: DeepSpeed sparse attention, not built" in str(err.value)


def test_the_block_layer_types_are_the_layers_specs_builds_as_blocks():
    """One list says which layers have no MLP (no experts there); specs.py builds them."""
    from megatron.config.groups.model import BLOCK_LAYER_TYPES
    from megatron.model.specs import BLOCK_LAYERS

    assert set(BLOCK_LAYER_TYPES) == set(BLOCK_LAYERS)


def test_sparsity_config_with_local_attention_is_refused_not_ignored(write):
    """GPT-NeoX's `local` type is DeepSpeed sparse attention configured by `sparsity_config`
    (its configs/sparse.yml), so the key is not one without effect there."""
    text = "attention_config: [[[local, global], 1]]\nsparsity_config: {block: 16}\n"
    with pytest.raises(ConfigError, match="'sparsity_config' .*run.yml.*DeepSpeed sparse"):
        _load(write, text)


def test_every_run_choice_is_supported_or_refused():
    from megatron.data.tokenizers import TOKENIZER_TYPES
    from megatron.inference.text import PROMPT_SOURCES
    from megatron.launcher.settings import RUNNER_LAUNCHERS, UNSUPPORTED_LAUNCHERS
    from megatron.training.optim.lr.schedule import DECAY_STYLES

    assert _literal_choices("tokenizer_type") == set(TOKENIZER_TYPES)
    assert _literal_choices("lr_decay_style") <= set(DECAY_STYLES)
    assert _literal_choices("wsd_decay_style") <= set(DECAY_STYLES)
    # precompute is not a prompt source: generate.py hands it to megatron/inference/precompute.py
    assert _literal_choices("text_gen_type") - _refused_choices("text_gen_type") == set(
        PROMPT_SOURCES
    ) | {"precompute"}
    assert _literal_choices("launcher") == set(RUNNER_LAUNCHERS) | set(UNSUPPORTED_LAUNCHERS)


def test_computed_keys_must_agree_with_what_they_are_computed_from(write):
    warn: list[str] = []
    cfg = _load(write, "zero_stage: 0\nbatch_size: 2\noptimizer_type: adam\n", warn=warn)
    assert cfg.parallel.zero_stage == 0 and len(warn) == 3
    with pytest.raises(ConfigError, match="'zero_stage' .*run.yml.* 2 .*zero_optimization"):
        _load(write, "zero_stage: 2\n")
    with pytest.raises(ConfigError, match="'batch_size'"):
        _load(write, "batch_size: 4\n")
