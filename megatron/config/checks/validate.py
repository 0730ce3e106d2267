"""Cross-field validation of a resolved config, with errors that say what would be valid."""

from __future__ import annotations

from megatron.config.checks.curriculum import validate_curriculum
from megatron.config.checks.data import validate_data
from megatron.config.checks.gmlp_rpe import GMLP_TYPES, validate_gmlp, validate_rpe
from megatron.config.checks.mamba import MAMBA, validate_mamba
from megatron.config.checks.optimizer_engines import validate_optimizer_engine
from megatron.config.checks.rwkv import validate_rwkv
from megatron.config.checks.torch_compile import validate_torch_compile
from megatron.config.config import Config
from megatron.config.groups.checkpointing import parse_checkpoint_keep
from megatron.config.groups.logging import validate_profiling
from megatron.config.groups.lr import check_cycle_keys
from megatron.config.groups.model import heads_split_hidden, pipeline_bf16
from megatron.config.groups.moe import validate_moe
from megatron.config.groups.mup import validate_mup
from megatron.config.groups.optimizer import OPTIMIZER_TYPES
from megatron.config.groups.parallel import validate_hpz
from megatron.config.groups.planning import validate_planning
from megatron.config.groups.post_training import validate_post_training
from megatron.config.groups.rope_scaling import check_rope_scaling
from megatron.config.neox.keys import SPARSE_ATTENTION_TYPES
from megatron.config.schema import ConfigError
from megatron.config.schema import set_in as _src


def _validate_attention_variants(m, sources: dict[str, str]) -> None:
    """head_dim, sliding_window_width and z_loss (issue 13)."""
    if m.head_dim is not None and m.head_dim < 1:
        raise ConfigError(
            f"head_dim{_src(sources, 'head_dim')} must be a positive integer or null "
            f"(hidden_size / num_attention_heads), got {m.head_dim}"
        )
    width = m.sliding_window_width
    if width is not None and width < 0:
        raise ConfigError(
            f"sliding_window_width{_src(sources, 'sliding_window_width')} must be >= 0 (the "
            f"tokens before each one it attends to) or null (full attention), got {width}"
        )
    if m.z_loss < 0:
        raise ConfigError(f"z_loss{_src(sources, 'z_loss')} must be >= 0, got {m.z_loss}")


def _validate_loss_chunks(cfg: Config, sources: dict[str, str]) -> None:
    """`loss_chunk_tokens` (the fused head and loss): >= 0, and only where it takes effect."""
    chunk = cfg.model.loss_chunk_tokens or 0  # null: auto, made a number by `derive.py`
    where = _src(sources, "loss_chunk_tokens")
    if chunk < 0:
        raise ConfigError(f"loss_chunk_tokens{where} must be >= 0 (0: off), got {chunk}")
    if not chunk:
        return
    impl = getattr(getattr(cfg, "post_training", None), "train_impl", "normal") or "normal"
    if impl == "rm":
        raise ConfigError(
            f"loss_chunk_tokens{where} fuses the vocabulary head with the loss; train_impl: rm "
            "ends in a value head, which has no vocabulary: set loss_chunk_tokens: 0"
        )
    if pipeline_bf16(cfg):
        raise ConfigError(
            f"loss_chunk_tokens{where}: the fused head and loss is not available for bf16 on the "
            "pipeline engine (DeepSpeed's bf16 optimizer there does not update the head's "
            "weight from its gradient); set loss_chunk_tokens: 0 (or leave it null), or "
            "pipe_parallel_size: 0 for the plain engine"
        )


def validate_model(cfg: Config, sources: dict[str, str]) -> None:
    m, tp = cfg.model, cfg.parallel.model_parallel_size
    for key in ("num_layers", "hidden_size", "num_attention_heads", "seq_length"):
        value = getattr(m, key)
        if value is None:
            raise ConfigError(f"config key '{key}' is required (a positive integer)")
        if value < 1:
            raise ConfigError(f"{key}{_src(sources, key)} must be positive, got {value}")
    heads = m.num_attention_heads
    _validate_attention_variants(m, sources)
    _validate_loss_chunks(cfg, sources)
    split = heads_split_hidden(m.layer_attention_types)  # every layer mamba: heads unused
    if m.head_dim is None and m.hidden_size % heads and split:
        raise ConfigError(
            f"hidden_size {m.hidden_size} is not divisible by num_attention_heads {heads}"
            f"{_src(sources, 'hidden_size', 'num_attention_heads')}"
        )
    if heads % tp:
        raise ConfigError(
            f"num_attention_heads {heads} is not divisible by model_parallel_size {tp}"
            f"{_src(sources, 'num_attention_heads', 'model_parallel_size')}; choose a tensor-"
            f"parallel size that divides {heads}"
        )
    kv = m.num_kv_heads
    if kv is not None:
        if kv < 1 or heads % kv:
            raise ConfigError(
                f"num_attention_heads {heads} is not divisible by num_kv_heads {kv}"
                f"{_src(sources, 'num_kv_heads', 'num_attention_heads')}; num_kv_heads must "
                f"divide {heads}"
            )
        if kv % tp:
            raise ConfigError(
                f"num_kv_heads {kv} is not divisible by model_parallel_size {tp}"
                f"{_src(sources, 'num_kv_heads', 'model_parallel_size')}"
            )
    if not 0 < m.rotary_pct <= 1:
        raise ConfigError(f"rotary_pct{_src(sources, 'rotary_pct')} must be in (0, 1]")
    check_rope_scaling(m.rope_scaling, m.pos_emb, f"rope_scaling{_src(sources, 'rope_scaling')}")
    if m.max_position_embeddings < m.seq_length and m.pos_emb in ("learned", "sinusoidal"):
        raise ConfigError(
            f"seq_length {m.seq_length} exceeds max_position_embeddings "
            f"{m.max_position_embeddings}{_src(sources, 'seq_length', 'max_position_embeddings')}"
        )
    for p in ("hidden_dropout", "attention_dropout"):
        if not 0 <= getattr(m, p) < 1:
            raise ConfigError(f"{p}{_src(sources, p)} must be in [0, 1)")
    valid = ("global", "flash", "sdpa", MAMBA, "rwkv", *GMLP_TYPES)
    bad = sorted(set(m.layer_attention_types) - set(valid))
    if bad:
        sparse = ", ".join(t for t in bad if t in SPARSE_ATTENTION_TYPES)
        why = f" ({sparse}: DeepSpeed sparse attention, not built here)" if sparse else ""
        raise ConfigError(
            f"attention_config{_src(sources, 'attention_config')}: attention types {bad} are not "
            f"supported{why}; valid: {', '.join(repr(v) for v in valid)}"
        )
    validate_gmlp(cfg, sources)
    validate_rpe(cfg, sources)


def validate_parallel(cfg: Config, sources: dict[str, str]) -> None:
    p = cfg.parallel
    if p.zero_stage >= 2 and p.pipe_parallel_size >= 1:
        raise ConfigError(
            f"ZeRO stage {p.zero_stage} cannot be combined with the pipeline engine "
            f"(pipe_parallel_size {p.pipe_parallel_size})"
            f"{_src(sources, 'zero_optimization', 'pipe_parallel_size')}: DeepSpeed's pipeline "
            "engine supports ZeRO stages 0 and 1 only; set pipe_parallel_size: 0 to use the "
            "plain engine"
        )
    method = p.pipe_partition_method
    if not (method in ("parameters", "uniform") or method.startswith("type:")):
        raise ConfigError(
            f"pipe_partition_method '{method}'{_src(sources, 'pipe_partition_method')} is not "
            "valid; expected 'type:transformer' (or another 'type:REGEX'), 'parameters' or "
            "'uniform'"
        )
    opt = cfg.optimizer.optimizer_type
    zero = p.zero_optimization or {}
    if opt == "OneBitAdam" and p.zero_stage > 0:
        raise ConfigError(
            f"optimizer OneBitAdam cannot run with ZeRO stage {p.zero_stage}"
            f"{_src(sources, 'optimizer', 'zero_optimization')}: it exchanges its own compressed "
            "momentum instead of the gradients ZeRO partitions; use zero_optimization stage 0 "
            "or another optimizer"
        )
    offload = (zero.get("offload_optimizer") or {}).get("device", "none")
    if (
        offload not in (None, "none")
        and opt != "CPU_Adam"
        and zero.get("zero_force_ds_cpu_optimizer", True)
    ):
        raise ConfigError(
            f"zero_optimization.offload_optimizer (device {offload!r}){_src(sources, 'optimizer')}"
            f" needs optimizer type CPU_Adam (DeepSpeed's CPU Adam), not {opt}; or set "
            "zero_optimization.zero_force_ds_cpu_optimizer: false"
        )
    if cfg.checkpointing.no_save_optim and p.zero_stage == 3:
        raise ConfigError(
            f"no_save_optim with ZeRO stage 3{_src(sources, 'no_save_optim')} would save no "
            "weights (they live in the partitioned optimizer files); set no_save_optim: false"
        )
    untested = not OPTIMIZER_TYPES[opt].zero_tested and not p.zero_allow_untested_optimizer
    if p.zero_stage > 0 and untested:
        tested = sorted(name for name, o in OPTIMIZER_TYPES.items() if o.zero_tested)
        raise ConfigError(
            f"optimizer {opt} with ZeRO stage {p.zero_stage}{_src(sources, 'optimizer')}: "
            "DeepSpeed has not tested this combination; set zero_allow_untested_optimizer: true "
            f"to allow it (tested: {', '.join(tested)})"
        )


def validate_schedule(cfg: Config, sources: dict[str, str]) -> None:
    t, lr = cfg.training, cfg.lr
    if t.train_iters is not None and t.train_iters < 0:
        raise ConfigError(f"train_iters{_src(sources, 'train_iters')} must be >= 0")
    if lr.min_lr > cfg.optimizer.lr:
        raise ConfigError(
            f"min_lr {lr.min_lr} is above the learning rate {cfg.optimizer.lr}"
            f"{_src(sources, 'min_lr', 'optimizer')}"
        )
    if lr.lr_decay_style == "inv" and lr.min_lr <= 0:
        raise ConfigError(
            f"lr_decay_style 'inv' decays towards min_lr, so min_lr{_src(sources, 'min_lr')} "
            f"must be > 0 (it is {lr.min_lr}); Levanter's default is 0.1 × the learning rate"
        )
    check_cycle_keys(lr)  # with train_epochs the cycles themselves are checked at run time
    c = cfg.checkpointing
    if c.checkpoint_factor is not None and c.checkpoint_factor < 1:
        raise ConfigError(f"checkpoint_factor{_src(sources, 'checkpoint_factor')} must be >= 1")
    if c.checkpoint_scale == "log" and (c.checkpoint_factor or 0) < 2:
        raise ConfigError("checkpoint_scale 'log' needs checkpoint_factor >= 2 (the log base)")
    validate_checkpoint_policy(cfg, sources)


def validate_checkpoint_policy(cfg: Config, sources: dict[str, str]) -> None:
    """`checkpoint_keep` tiers and `checkpoint_save_interval_minutes` (see
    `megatron/training/checkpoint/policy.py`): well formed, and only with `save`."""
    c = cfg.checkpointing
    parse_checkpoint_keep(c.checkpoint_keep, _src(sources, "checkpoint_keep"))
    minutes = c.checkpoint_save_interval_minutes
    if minutes is not None and not minutes > 0:
        raise ConfigError(
            f"checkpoint_save_interval_minutes {minutes}"
            f"{_src(sources, 'checkpoint_save_interval_minutes')} must be > 0 (or null for no "
            "time-based checkpoints)"
        )
    given = [k for k in ("checkpoint_keep", "checkpoint_save_interval_minutes") if getattr(c, k)]
    if given and not c.save:
        raise ConfigError(
            f"{' and '.join(given)}{_src(sources, *given)} would save checkpoints, but `save` is "
            "not set; set save to a folder, or remove them"
        )


def validate(cfg: Config, sources: dict[str, str]) -> None:
    validate_mamba(cfg, sources)  # first: its tp refusal says why, before head arithmetic
    validate_model(cfg, sources)
    validate_hpz(cfg.parallel, sources)  # before the general ZeRO checks: says more
    validate_parallel(cfg, sources)
    validate_optimizer_engine(cfg, sources)
    validate_data(cfg, sources)
    validate_schedule(cfg, sources)
    validate_torch_compile(cfg, sources)
    validate_profiling(cfg, sources)
    validate_moe(cfg)
    validate_mup(cfg, sources)
    validate_curriculum(cfg, sources)  # before post_training: names the curriculum
    validate_rwkv(cfg, sources)
    validate_post_training(cfg, sources)
    validate_planning(cfg.planning, sources)
