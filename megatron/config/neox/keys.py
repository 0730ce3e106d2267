"""GPT-NeoX (and Megatron) keys that are renamed here, computed, or not implemented: what each
one does to a run, as data.

Existing GPT-NeoX config files must load unchanged, but a run must do what its config says.
So every GPT-NeoX key this trainer does not implement has a class in `NEOX_KEYS`:

- `no effect`: cannot change what is trained (a fusion switch whose unfused path computes the
  same numbers, a logging destination or profiler we do not have): accepted, with a one-line
  warning when set to anything but GPT-NeoX's default.
- `refused`: changes the model, the objective, the data or the schedule. GPT-NeoX's default
  value is accepted (it asks for nothing); any other value is refused before launch, naming the
  key, the file and what to do.
- `refused (planned)`: as `refused`, for a feature that is planned (`issue` records the
  project issue that builds it, for developers; users are told only that it is planned).
- `implemented`: GPT-NeoX's switch is expressed by our own keys (`implies`).

A key that only matters while another one switches its feature on (`moe_top_k` without
experts, `dpo_beta` without `train_impl: dpo`) has no effect while that switch is off, in
GPT-NeoX as here: it is then accepted with a warning. `neox_policy.py` applies the table.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

# old name -> (new name, wrap a single value into a list)
RENAMED: dict[str, tuple[str, bool]] = {
    "save_interval": ("checkpoint_factor", False),
    "clip_grad": ("gradient_clipping", False),
    "tensor_model_parallel_size": ("model_parallel_size", False),
    "pipeline_model_parallel_size": ("pipe_parallel_size", False),
    "global_batch_size": ("train_batch_size", False),
    "micro_batch_size": ("train_micro_batch_size_per_gpu", False),
    "num_query_groups": ("num_kv_heads", False),
    "ffn_hidden_size": ("intermediate_size", False),
    "rotary_base": ("rotary_emb_base", False),
    "lr_warmup_fraction": ("warmup", False),
    # GPT-NeoX's name until its dMoE integration: the same layer rule (default 2 there)
    "expert_interval": ("moe_expert_interval", False),
}
for _split in ("train", "valid", "test"):
    for _kind in ("data", "label_data", "reward_data"):
        RENAMED[f"{_split}_{_kind}_path"] = (f"{_split}_{_kind}_paths", True)
    for _side in ("pos", "neg"):
        for _kind in ("data", "label_data"):
            RENAMED[f"{_side}_{_split}_{_kind}_path"] = (f"{_side}_{_split}_{_kind}_paths", True)

# Keys GPT-NeoX computes itself (found in dumped configs); a value given is not read there
# either. Ignored with a warning, except the ones in DERIVED_MUST_AGREE.
DERIVED_IN_NEOX = frozenset(
    {
        "batch_size",
        "config_files",
        "deepspeed",
        "deepspeed_config",
        "do_train",
        "do_valid",
        "dynamic_loss_scale",
        "git_hash",
        "global_num_gpus",
        "is_pipe_parallel",
        "iteration",
        "local_rank",
        "optimizer_type",
        "padded_vocab_size",
        "rank",
        "save_iters",
        "tensorboard_writer",
        "user_script",
        "world_size",
        "zero_allgather_bucket_size",
        "zero_contiguous_gradients",
        "zero_reduce_bucket_size",
        "zero_reduce_scatter",
        "zero_stage",
    }
)

# Computed keys whose given value must equal what we compute from the keys that define it
# (a dumped config agrees; `zero_stage: 2` without a zero_optimization section would silently
# train at stage 0): NeoX key -> (our resolved key, the keys that set it).
DERIVED_MUST_AGREE: dict[str, tuple[str, str]] = {
    "zero_stage": ("zero_stage", "zero_optimization: {stage: N}"),
    "batch_size": ("train_micro_batch_size_per_gpu", "train_micro_batch_size_per_gpu"),
    "optimizer_type": ("optimizer_type", "optimizer: {type: NAME}"),
}


@dataclass(frozen=True)
class Gate:
    """The keys that switch a feature on: a dependent key matters only while one is active."""

    keys: tuple[str, ...]
    active: Callable[[Any], bool]
    text: str


def attention_types(value: Any) -> set[str]:
    """Every type name in a GPT-NeoX `attention_config` (`[[["global", "local"], 6]]`)."""
    if isinstance(value, str):
        return {value}
    if isinstance(value, list | tuple):
        return set().union(*(attention_types(v) for v in value)) if value else set()
    return set()


# GPT-NeoX's attention types built on DeepSpeed's block-sparse attention kernels
# (`configure_sparse_attention`; `local` is its LocalSlidingWindowSparsityConfig), read with
# `sparsity_config`. Not built here.
SPARSE_ATTENTION_TYPES = ("local", "sparse_fixed", "sparse_variable", "bigbird", "bslongformer")


def _uses(*types: str) -> Callable[[Any], bool]:
    return lambda value: bool(attention_types(value) & set(types))


GATES: dict[str, Gate] = {
    "moe": Gate(("moe_num_experts",), lambda v: v not in (None, 1), "moe_num_experts > 1"),
    "dpo": Gate(("train_impl",), lambda v: v == "dpo", "train_impl: dpo"),
    "kto": Gate(("train_impl",), lambda v: v == "kto", "train_impl: kto"),
    "reinforce": Gate(("train_impl",), lambda v: v == "reinforce", "train_impl: reinforce"),
    "online": Gate(("dataset_impl",), lambda v: v == "online", "dataset_impl: online"),
    "unique": Gate(("num_unique_layers",), lambda v: v is not None, "num_unique_layers"),
    "te": Gate(
        ("te_columnparallel", "te_rowparallel", "te_layernorm_mlp", "te_mha", "te_fp8_mha"),
        bool,
        "a TransformerEngine te_* switch",
    ),
    "sparse": Gate(
        ("attention_config",),
        _uses(*SPARSE_ATTENTION_TYPES),
        "sparse attention types in attention_config",
    ),
}

NO_EFFECT, REFUSED, IMPLEMENTED = "no effect", "refused", "implemented"


@dataclass(frozen=True)
class NeoxKey:
    """What one unimplemented GPT-NeoX key does here (see the module docstring)."""

    kind: str
    defaults: tuple
    """GPT-NeoX's default first, then values GPT-NeoX treats the same (accepted silently)."""
    advice: str
    issue: int | None = None
    gate: str | None = None
    implies: Callable[[Any, dict[str, Any]], dict[str, Any]] | None = None
    """For `implemented` keys: `(value, given settings) -> our keys to set` (their effect)."""

    @property
    def label(self) -> str:
        if self.kind == REFUSED and self.issue:
            return "refused (planned)"
        return self.kind


def _none(advice, *defaults, gate=None):
    return NeoxKey(NO_EFFECT, defaults, advice, gate=gate)


def _refused(advice, *defaults, gate=None):
    return NeoxKey(REFUSED, defaults, advice, gate=gate)


def _pending(issue, advice, *defaults, gate=None):
    return NeoxKey(REFUSED, defaults, advice, issue=issue, gate=gate)


_MOE = "a key of DeepSpeed's MoE layer (moe_type: deepspeed), which is not built"
_TE = "TransformerEngine layers are not built here"
_OURS_FP32 = "the output cross entropy is always computed in fp32 here"
_FP16 = "top-level loss-scaling keys are not read: set fp16.loss_scale, fp16.hysteresis, ..."
_LOG = "a logging/profiling back end this trainer does not have"
_ONLINE = "online data serving is not implemented"
_REINFORCE = "REINFORCE training is not implemented"

NEOX_KEYS: dict[str, NeoxKey] = {
    # model variants
    "bias_gelu_fusion": NeoxKey(
        IMPLEMENTED,
        (False,),
        "GPT-NeoX's fused bias-GeLU computes GeLU's tanh approximation: with activation gelu, "
        "the model uses activation gelu_tanh",
        implies=lambda on, given: (
            {"activation": "gelu_tanh"} if on and given.get("activation", "gelu") == "gelu" else {}
        ),
    ),
    "expansion_factor": _refused("set intermediate_size (the MLP width) instead", None),
    "layernorm_fusion": _none("fused layer norm kernel; the unfused one computes the same", False),
    "rmsnorm_fusion": _none("fused RMSNorm kernel; the unfused one computes the same", False),
    "opt_pos_emb_offset": _refused("OPT's learned-position offset is not built", 0),
    "sparsity_config": _refused(
        "DeepSpeed sparse attention (attention types local, sparse_fixed, sparse_variable, "
        "bigbird, bslongformer) is not built",
        None,
        {},
        gate="sparse",
    ),
    "num_unique_layers": _refused("layer sharing is not built", None),
    "param_sharing_style": _refused("layer sharing is not built", "grouped", gate="unique"),
    "use_cpu_initialization": _none(
        "weights are always initialised as full tensors before splitting, as on CPU", False
    ),
    "rotary_save_freqs_buffer": _none(
        "checkpoints never hold the rotary frequencies; they are recomputed", False
    ),
    "soft_prompt_tuning": _refused("soft prompt tuning is not implemented", None),
    "output_layer_parallelism": _refused(
        "the output layer is always split over the vocabulary (column)", "column"
    ),
    "te_columnparallel": _refused(_TE, False),
    "te_rowparallel": _refused(_TE, False),
    "te_layernorm_mlp": _refused(_TE, False),
    "te_mha": _refused(_TE, False),
    "te_fp8_mha": _refused(_TE + " (no FP8 training)", False),
    "te_fp8_format": _refused(_TE, "hybrid", gate="te"),
    "te_fp8_wgrad": _refused(_TE, True, gate="te"),
    "te_fp8_amax_history_len": _refused(_TE, 1, gate="te"),
    "te_fp8_amax_compute_algo": _refused(_TE, "most_recent", gate="te"),
    "te_fp8_margin": _refused(_TE, 0, gate="te"),
    "bias_dropout_fusion": _none("fused bias-dropout-add; unfused computes the same", False),
    "fp16_lm_cross_entropy": _refused(_OURS_FP32, False),
    "use_flashattn_swiglu": _none("flash-attn's fused SwiGLU; unfused computes the same", False),
    "mlp_type": _refused(
        "older GPT-NeoX's Llama MLP: set activation: swiglu and mlp_multiple_of: 256", "regular"
    ),
    # mixture of experts (issue 13)
    "moe_loss_coeff": _pending(13, _MOE, 0.1, gate="moe"),
    "create_moe_param_group": _pending(13, _MOE, True, gate="moe"),
    "use_tutel": _none("Tutel MoE kernels (MoE is refused)", False),
    # objectives and datasets (issue 12)
    "fp32_reinforce": _refused(_REINFORCE, True, gate="reinforce"),
    "kl_impl": _refused(_REINFORCE, "mse", gate="reinforce"),
    "kl_div_beta": _refused(_REINFORCE, 0.1, gate="reinforce"),
    "reinforce_leave_one_out": _refused(
        "REINFORCE training is not implemented", False, gate="reinforce"
    ),
    "online_dataserver_ips": _refused(_ONLINE, "localhost", gate="online"),
    "online_dataserver_ports": _refused(_ONLINE, 10000, gate="online"),
    # optimizer, data and schedule
    "use_bnb_optimizer": _refused("bitsandbytes 8-bit optimizers are not implemented", False),
    "short_seq_prob": _refused("short-sequence sampling is not implemented", 0.1),
    "curriculum_seqlen": _none(
        "GPT-NeoX's record of the current curriculum length, set from curriculum_learning "
        "each step (logged here as train/curriculum_seqlen)",
        0,
    ),
    "hysteresis": _refused(_FP16, 2),
    "loss_scale": _refused(_FP16, None),
    "loss_scale_window": _refused(_FP16, 1000.0),
    "min_scale": _refused(_FP16, 1.0),
    "scheduler": _refused("the LR schedule comes from lr_decay_style, warmup, min_lr", None),
    "sparse_attention": _refused("DeepSpeed sparse attention is not built", None),
    "autotuning_run": _refused("DeepSpeed autotuning (changes batch sizes) is not run", None),
    # no effect on what is trained
    "checkpoint_validation_with_forward_pass": _none("a check after loading", False),
    "char_level_ppl": _none("an extra evaluation metric", False),
    "return_logits": _none("generation output detail", False),
    "eval_interval_early": _none("evaluation schedule only; eval_interval applies", None),
    "lazy_mpu_init": _none("process groups are always set up at start", False),
    "onnx_safe": _none("GeLU is already computed with erf", False),
    "adlr_autoresume": _none("ADLR cluster auto-resume; SIGTERM saves and exits here", False),
    "adlr_autoresume_interval": _none("ADLR cluster auto-resume", 1000),
    "deepscale": _none("deprecated in GPT-NeoX", False),
    "deepscale_config": _none("deprecated in GPT-NeoX", None),
    "deepspeed_activation_checkpointing": _none("deprecated in GPT-NeoX", True),
    "activation_checkpointing": _none("use checkpoint_activations and its keys", None),
    "s3_path": _none("checkpoints are not uploaded to S3", None),
    "s3_chunk_size": _none("checkpoints are not uploaded to S3", 104_857_600),
    "detect_nvlink_pairs": _none("launcher detail", False),
    "serve_model_weights": _none("weights are not served over a socket", False),
    "weight_server_port": _none("weights are not served over a socket", 6000),
    "log_optimizer_states": _none(_LOG, False),
    "wandb_init_all_ranks": _none(_LOG, False),
    "log_grad_pct_zeros": _none(_LOG, False),
    "log_gradient_noise_scale": _none(_LOG, False),
    "gradient_noise_scale_n_batches": _none(_LOG, 5),
    "gradient_noise_scale_cpu_offload": _none(_LOG, False),
    "tensorboard": _none("DeepSpeed's monitor section; use tensorboard_dir", None),
    "wandb": _none("DeepSpeed's monitor section; use use_wandb", None),
}

# Values our schema accepts (GPT-NeoX's vocabulary) that nothing here builds or runs:
# (key, value) -> what to do instead. Refused at resolution, never on the workers.
REFUSED_VALUES: dict[tuple[str, str], str] = {
    ("data_impl", "cached"): (
        "only the mmap .bin/.idx format is read; re-run tools/preprocess_data.py and use "
        "data_impl: mmap"
    ),
}
