"""Cross-field validation of a resolved config, with errors that say what would be valid."""

from __future__ import annotations

from megatron.config.checkpointing import parse_checkpoint_keep
from megatron.config.config import Config
from megatron.config.logging import validate_profiling
from megatron.config.lr import check_cycle_keys
from megatron.config.moe import validate_moe
from megatron.config.optimizer_engines import validate_optimizer_engine
from megatron.config.parallel import validate_hpz
from megatron.config.post_training import validate_post_training
from megatron.config.rope_scaling import check_rope_scaling
from megatron.config.schema import ConfigError
from megatron.config.torch_compile import validate_torch_compile

# Optimizers DeepSpeed's ZeRO accepts without `zero_allow_untested_optimizer`.
ZERO_TESTED_OPTIMIZERS = ("Adam", "AdamW", "CPU_Adam", "CPU_torch_adam")


def _src(sources: dict[str, str], *keys: str) -> str:
    found = [f"{k} in {sources[k]}" for k in keys if k in sources]
    return f" ({'; '.join(found)})" if found else ""


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
    if m.head_dim is None and m.hidden_size % heads:
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
    bad = sorted(set(m.layer_attention_types) - {"global", "flash", "sdpa"})
    if bad:
        raise ConfigError(
            f"attention_config{_src(sources, 'attention_config')}: attention types {bad} are not "
            "supported; valid: 'global', 'flash', 'sdpa'"
        )


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
    untested = opt not in ZERO_TESTED_OPTIMIZERS and not p.zero_allow_untested_optimizer
    if p.zero_stage > 0 and untested:
        raise ConfigError(
            f"optimizer {opt} with ZeRO stage {p.zero_stage}{_src(sources, 'optimizer')}: "
            "DeepSpeed has not tested this combination; set zero_allow_untested_optimizer: true "
            f"to allow it (tested: {', '.join(ZERO_TESTED_OPTIMIZERS)})"
        )


_SPLITS = ("train", "valid", "test")
_SPLIT_PATH_KEYS = tuple(f"{s}_{k}data_paths" for s in _SPLITS for k in ("", "label_", "reward_"))
_PAIR_PATH_KEYS = tuple(
    f"{side}_{s}_{k}data_paths" for s in _SPLITS for side in ("pos", "neg") for k in ("", "label_")
)


def validate_dummy_data(cfg: Config, sources: dict[str, str]) -> None:
    """`data_impl: dummy` reads no files: a data path or an epoch count would be ignored."""
    d = cfg.data
    paths = ("data_path", "precompute_model_name") + _SPLIT_PATH_KEYS + _PAIR_PATH_KEYS
    given = [key for key in paths if getattr(d, key)]
    if given:
        raise ConfigError(
            f"data_impl: dummy{_src(sources, 'data_impl')} uses synthetic tokens and reads no "
            f"files, but {', '.join(given)}{_src(sources, *given)} is set; remove it, or set "
            "data_impl: mmap to train on it"
        )
    if cfg.training.train_epochs:
        raise ConfigError(
            f"train_epochs{_src(sources, 'train_epochs')} with data_impl: dummy: synthetic data "
            "has no epochs; set train_iters instead"
        )


def validate_data(cfg: Config, sources: dict[str, str]) -> None:
    d = cfg.data
    if d.data_impl == "dummy":
        validate_dummy_data(cfg, sources)
    parts = d.split.replace("/", ",").split(",")
    try:
        numbers = [float(x) for x in parts]
    except ValueError:
        numbers = []
    if not numbers or len(numbers) > 3 or any(x < 0 for x in numbers) or sum(numbers) <= 0:
        raise ConfigError(
            f"split '{d.split}'{_src(sources, 'split')} is not valid; expected up to three "
            "non-negative numbers such as '949,50,1' (train, valid, test)"
        )
    pairwise = d.dataset_impl == "pairwise"
    for kind in _SPLITS:
        paths_key = f"pos_{kind}_data_paths" if pairwise else f"{kind}_data_paths"
        paths = getattr(d, paths_key)
        weights = getattr(d, f"{kind}_data_weights")
        if weights is not None and (paths is None or len(weights) != len(paths)):
            key = f"{kind}_data_weights"
            raise ConfigError(
                f"{key}{_src(sources, key)} has {len(weights)} weights but "
                f"{paths_key} has {len(paths or [])} paths; give one weight per path"
            )
        for extra in ("label", "reward"):
            key = f"{kind}_{extra}_data_paths"
            values = getattr(d, key)
            if not pairwise and values is not None and (paths is None or len(values) != len(paths)):
                raise ConfigError(
                    f"{key}{_src(sources, key)} needs one {extra} dataset per data path "
                    f"({paths_key} has {len(paths or [])})"
                )
    validate_post_training_data(cfg, sources)


def validate_post_training_data(cfg: Config, sources: dict[str, str]) -> None:
    """`dataset_impl`, `pack_impl` and the pos/neg/reward paths (GPT-NeoX's post-training
    data): every path given is read, every pair is whole."""
    d = cfg.data
    if cfg.generation.text_gen_type == "precompute" and not d.precompute_model_name:
        raise ConfigError(
            f"text_gen_type: precompute{_src(sources, 'text_gen_type')} writes the reference "
            "log-probs as {prefix}_{precompute_model_name}: set precompute_model_name"
        )
    if cfg.training.train_epochs and (d.pack_impl != "packed" or d.dataset_impl == "pairwise"):
        raise ConfigError(
            f"train_epochs{_src(sources, 'train_epochs')} needs pack_impl: packed and dataset_impl:"
            f" gpt2 (as in GPT-NeoX), not {d.pack_impl} / {d.dataset_impl}; set train_iters"
        )
    if d.dataset_impl != "pairwise":
        given = [k for k in _PAIR_PATH_KEYS if getattr(d, k) is not None]
        if given:
            raise ConfigError(
                f"{', '.join(given)}{_src(sources, *given)} are read only with dataset_impl: "
                f"pairwise (it is {d.dataset_impl}); set dataset_impl: pairwise, or remove them"
            )
        rewarded = [s for s in _SPLITS if getattr(d, f"{s}_reward_data_paths")]
        lacking = [s for s in _SPLITS if getattr(d, f"{s}_data_paths") and s not in rewarded]
        if rewarded and lacking:
            keys = [f"{s}_reward_data_paths" for s in lacking]
            raise ConfigError(
                f"{', '.join(keys)} missing: {rewarded[0]}_reward_data_paths is set, so every "
                "split read needs its rewards (KTO weighs each sample by them)"
            )
        return
    if d.pack_impl == "packed":
        raise ConfigError(
            f"dataset_impl: pairwise{_src(sources, 'dataset_impl', 'pack_impl')} cannot use "
            "pack_impl: packed (it would cut chosen and rejected at different places); set "
            "pack_impl: unpacked or pack_until_overflow"
        )
    ignored = [k for k in ("data_path",) + _SPLIT_PATH_KEYS if getattr(d, k)]
    if ignored:
        raise ConfigError(
            f"{', '.join(ignored)}{_src(sources, *ignored)} not read with dataset_impl: pairwise"
            " (it reads pos_*/neg_*_data_paths); remove them"
        )
    if not d.pos_train_data_paths:
        raise ConfigError(
            "dataset_impl: pairwise needs pos_train_data_paths and neg_train_data_paths (the "
            "chosen and rejected sides of the training pairs)"
        )
    for split in _SPLITS:
        _validate_pairs(d, split, sources)


def _validate_pairs(d, split: str, sources: dict[str, str]) -> None:
    pos, neg = getattr(d, f"pos_{split}_data_paths"), getattr(d, f"neg_{split}_data_paths")
    n = len(pos or [])
    for kind in ("data", "label_data"):
        keys = [f"{side}_{split}_{kind}_paths" for side in ("pos", "neg")]
        a, b = (getattr(d, k) for k in keys)
        if (a is None) != (b is None):
            have, lack = keys if a is not None else keys[::-1]
            raise ConfigError(
                f"{have}{_src(sources, have)} is set but {lack} is not: give both sides of the "
                "pairs, or neither"
            )
        if a is not None and (len(a) != n or len(b) != n):
            raise ConfigError(
                f"{keys[0]} and {keys[1]}{_src(sources, *keys)} have {len(a)} and {len(b)} "
                f"entries; give one per pos_{split}_data_paths entry ({n})"
            )
    if neg is None and pos is None and getattr(d, f"pos_{split}_label_data_paths"):
        raise ConfigError(f"pos_{split}_label_data_paths needs pos_{split}_data_paths")


def validate_schedule(cfg: Config, sources: dict[str, str]) -> None:
    t, lr = cfg.training, cfg.lr
    if t.train_iters is not None and t.train_iters < 0:
        raise ConfigError(f"train_iters{_src(sources, 'train_iters')} must be >= 0")
    if lr.warmup < 0:
        raise ConfigError(f"warmup{_src(sources, 'warmup')} must be >= 0")
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
    `megatron/training/checkpoint_policy.py`): well formed, and only with `save`."""
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
    validate_model(cfg, sources)
    validate_hpz(cfg.parallel, sources)  # before the general ZeRO checks: says more
    validate_parallel(cfg, sources)
    validate_optimizer_engine(cfg, sources)
    validate_data(cfg, sources)
    validate_schedule(cfg, sources)
    validate_torch_compile(cfg, sources)
    validate_profiling(cfg, sources)
    validate_moe(cfg)
    validate_post_training(cfg, sources)
