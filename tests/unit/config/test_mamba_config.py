"""`mamba` layers in configs: GPT-NeoX's keys and defaults, what is refused with why, and
GPT-NeoX's five `configs/mamba/*.yml` resolving to what they say."""

from pathlib import Path

import pytest
import torch

from megatron.config import ConfigError, deepspeed_config, load_config
from megatron.config.groups.model import ModelConfig
from megatron.model.args import ModelArgs
from megatron.model.gpt import build_gpt
from tests.unit.config.conftest import MINIMAL

# GPT-NeoX's megatron/neox_arguments/neox_args.py defaults of the Mamba keys, copied by hand.
NEOX_MAMBA_DEFAULTS = {
    "mamba_selective_scan_fusion": False,
    "mamba_causal_conv_fusion": False,
    "mamba_inner_func_fusion": False,
    "mamba_selective_fp32_params": True,
    "mamba_use_bias_in_conv": True,
    "mamba_use_bias_in_linears": False,
}


def _load(write, text, **kw):
    kw.setdefault("warn", [])
    return load_config([write("run.yml", MINIMAL + text)], **kw)


def test_mamba_keys_have_gpt_neox_defaults():
    defaults = ModelConfig()
    assert {k: getattr(defaults, k) for k in NEOX_MAMBA_DEFAULTS} == NEOX_MAMBA_DEFAULTS


def test_mamba_layers_mix_with_attention(write):
    warn: list[str] = []
    text = 'attention_config: [[["mamba", "global"], 1]]\nmamba_use_bias_in_conv: false\n'
    cfg = _load(write, text, warn=warn)
    assert cfg.model.layer_attention_types == ("mamba", "global")
    assert cfg.model.mamba_use_bias_in_conv is False and warn == []


@pytest.mark.parametrize(
    "text, match",
    [
        ("model_parallel_size: 2\n", "model_parallel_size 2.*x_proj.*model_parallel_size: 1"),
        ("zero_optimization: {stage: 3}\n", "ZeRO stage 3.*Mamba"),
        (
            "precision: bf16\nzero_optimization: {stage: 2, offload_optimizer: {device: cpu}}\n",
            "mamba_selective_fp32_params: true.*ZeRO offload .*offload_optimizer.*bf16.*"
            "Turn the offload off, or set mamba_selective_fp32_params: false",
        ),
        (
            "fp16: {enabled: true}\nzero_optimization: {stage: 1, cpu_offload: true}\n",
            "mamba_selective_fp32_params: true.*ZeRO offload .*cpu_offload.*fp16",
        ),
        (
            "fp16: {enabled: true}\nzero_optimization: {stage: 1}\n"
            "data_types: {grad_accum_dtype: fp32}\n",
            "data_types.grad_accum_dtype 'fp32'.*fp16 training at ZeRO stage 1.*"
            "Leave grad_accum_dtype unset \\(or set it to fp16\\)",
        ),
        (
            "mamba_use_bias_in_linears: true\nmamba_inner_func_fusion: true\n",
            "mamba_use_bias_in_linears and mamba_inner_func_fusion.*run.yml",
        ),
        ("torch_compile: true\nmamba_selective_scan_fusion: true\n", "mamba_selective_scan"),
    ],
    ids=[
        "tp",
        "zero3",
        "fp32-params-offload",
        "fp32-params-cpu-offload",
        "fp32-params-accum-dtype",
        "bias-inner-fusion",
        "compile-kernels",
    ],
)
def test_what_mamba_cannot_do_is_refused(write, text, match):
    with pytest.raises(ConfigError, match=match):
        _load(write, 'attention_config: [[["mamba"], 2]]\n' + text, world_size=2)


def test_heads_need_not_split_the_width_when_no_layer_attends(write):
    """GPT-NeoX's Mamba configs keep 12 heads at widths 12 does not divide (mamba-370M: 1024),
    which GPT-NeoX allows when the model has Mamba layers; with an attention layer beside them
    the heads split the width again."""
    heads = ["num_attention_heads=12"]  # MINIMAL's hidden_size is 64
    text = 'attention_config: [[["mamba"], 2]]\nloss_chunk_tokens: 0\n'  # the logits, read below
    cfg = _load(write, text, overrides=heads, vocab_size=64)
    args = ModelArgs.from_config(cfg)
    tokens = torch.randint(0, 64, (2, 8))
    logits = build_gpt(args)(tokens, torch.arange(8).expand(2, -1))
    assert args.layer_attention_types == ("mamba", "mamba")
    assert logits.shape == (2, 8, args.vocab_size)
    with pytest.raises(ConfigError, match="hidden_size 64 is not divisible by num_attention_h"):
        _load(write, 'attention_config: [[["mamba", "global"], 1]]\n', overrides=heads)


def test_half_precision_trains_with_fp32_params_off(write):
    text = 'attention_config: [[["mamba"], 2]]\nprecision: bf16\n'
    cfg = _load(write, text + "mamba_selective_fp32_params: false\n")
    assert cfg.precision.dtype == "bf16"


# GPT-NeoX's configs/mamba/*.yml, kept unchanged as tests/data/configs/mamba-*-neox.yml: what
# each file says, copied by hand from the files (layers, hidden, lr, min_lr, Adam's betas,
# log_interval).
NEOX_MAMBA_FILES = {
    "130M": (24, 768, 6.0e-4, 6.0e-5, [0.9, 0.95], 100),
    "370M": (48, 1024, 3.0e-4, 3.0e-5, [0.9, 0.95], 100),
    "790M": (48, 1536, 2.5e-4, 2.5e-5, [0.9, 0.999], 100),
    "1.4B": (48, 2048, 2.0e-4, 2.0e-5, [0.9, 0.95], 1),
    "2.8B": (64, 2560, 1.6e-4, 1.6e-5, [0.9, 0.95], 100),
}
FIXTURES = Path(__file__).resolve().parents[2] / "data" / "configs"


def neox_mamba_file(size: str) -> Path:
    return FIXTURES / f"mamba-{size}-neox.yml"


@pytest.mark.parametrize(
    "text",
    [
        "precision: bf16\n",
        "fp16: {enabled: true}\nzero_optimization: {stage: 2}\n",
        "precision: bf16\nzero_optimization: {stage: 1}\ndata_types: {grad_accum_dtype: fp32}\n",
        "fp16: {enabled: true}\nzero_optimization: {stage: 1}\n"
        "data_types: {grad_accum_dtype: fp16}\n",
    ],
    ids=["bf16", "fp16-zero2", "bf16-zero1-fp32-accum", "fp16-accum"],
)
def test_half_precision_keeps_fp32_params(write, text):
    cfg = _load(write, 'attention_config: [[["mamba"], 2]]\n' + text, world_size=2)
    assert cfg.model.mamba_selective_fp32_params and cfg.precision.dtype in ("bf16", "fp16")


@pytest.mark.parametrize("size", NEOX_MAMBA_FILES)
def test_gpt_neox_mamba_files_load_unchanged(size):
    """Unchanged, each file trains in fp16 at ZeRO 1 with GPT-NeoX's default fp32 A_log and D
    (`tests/unit/training/test_mamba_fp32_params.py` trains that way)."""
    cfg = load_config([neox_mamba_file(size)], world_size=1, vocab_size=50277, warn=[])
    assert cfg.model.mamba_selective_fp32_params is True
    assert (cfg.precision.dtype, cfg.parallel.zero_stage) == ("fp16", 1)


@pytest.mark.parametrize("size", NEOX_MAMBA_FILES)
def test_gpt_neox_mamba_files_resolve_to_what_they_say(size):
    layers, hidden, lr, min_lr, betas, log_interval = NEOX_MAMBA_FILES[size]
    warn: list[str] = []
    cfg = load_config([neox_mamba_file(size)], world_size=1, vocab_size=50277, warn=warn)
    assert len(warn) == 1 and "'synchronize_each_layer'" in warn[0]  # its cost, warned
    m = cfg.model
    assert (m.num_layers, m.hidden_size, m.num_attention_heads) == (layers, hidden, 12)
    assert m.layer_attention_types == ("mamba",) * layers
    assert (m.seq_length, m.max_position_embeddings, m.pos_emb) == (2048, 2048, "learned")
    assert (m.norm, m.rms_norm_epsilon, m.activation) == ("rmsnorm", 1.0e-5, "silu")
    assert (m.init_method, m.output_layer_init_method) == (
        "small_init",
        "single_residual_scaled_normal",
    )
    fusions = (m.mamba_selective_scan_fusion, m.mamba_causal_conv_fusion, m.mamba_inner_func_fusion)
    assert fusions == (True, True, True)
    assert m.checkpoint_activations and m.partition_activations and m.synchronize_each_layer
    assert (m.hidden_dropout, m.attention_dropout) == (0.0, 0.0)
    o = cfg.optimizer
    assert (o.optimizer_type, o.lr, cfg.lr.min_lr) == ("Adam", lr, min_lr)
    assert o.optimizer_params["betas"] == betas and o.optimizer_params["eps"] == 1.0e-8
    assert (o.weight_decay, o.gradient_clipping) == (0.1, 1.0)
    assert (cfg.lr.lr_decay_style, cfg.lr.decay_iters, cfg.lr.warmup_iters) == (
        "cosine",
        320000,
        3200,
    )
    assert cfg.training.train_iters == 320000 and cfg.training.train_micro_batch_size_per_gpu == 4
    assert (cfg.training.eval_interval, cfg.training.eval_iters) == (1000, 10)
    assert cfg.checkpointing.checkpoint_factor == 10000
    assert cfg.checkpointing.keep_last_n_checkpoints == 4
    assert (cfg.logging.log_interval, cfg.logging.steps_per_print) == (log_interval, 10)
    assert cfg.parallel.zero_stage == 1 and cfg.precision.dtype == "fp16"


@pytest.mark.parametrize("size", NEOX_MAMBA_FILES)
def test_gpt_neox_mamba_files_fp16_section_is_one_deepspeed_takes(size):
    """The DeepSpeed config of each file passes DeepSpeed's own fp16 section model (which
    refuses keys it does not know, where GPT-NeoX's DeeperSpeed ignored them)."""
    from deepspeed.runtime.precision_config import get_float16_config

    cfg = load_config([neox_mamba_file(size)], world_size=1, warn=[])
    fp16 = get_float16_config(deepspeed_config(cfg))
    assert fp16.enabled and (fp16.loss_scale, fp16.loss_scale_window) == (0, 1000)
    assert (fp16.hysteresis, fp16.min_loss_scale) == (2, 1)
