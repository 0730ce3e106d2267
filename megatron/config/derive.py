"""Derived values of the resolved config: computed once, at resolution, then frozen.

Batch arithmetic (any two of global batch, micro batch and gradient accumulation give the
third), data-parallel size, padded vocabulary, LR warm-up/decay iterations, the precision
dtype, the ZeRO stage, the canonical optimizer and the per-layer attention types.
"""

from __future__ import annotations

import dataclasses

from megatron.config.config import Config
from megatron.config.groups.lr import decay_and_warmup_iters
from megatron.config.groups.model import auto_loss_chunk_tokens, pipeline_bf16
from megatron.config.groups.mup import read_base_shapes
from megatron.config.groups.optimizer import (
    NEOX_DEFAULT_LR,
    NEOX_DEFAULT_OPTIMIZER,
    NEOX_DEFAULT_PARAMS,
    OPTIMIZER_TYPES,
)
from megatron.config.schema import ConfigError
from megatron.config.schema import set_in as _src


def pad_vocab_size(vocab_size: int, make_vocab_size_divisible_by: int, tp_size: int = 1) -> int:
    """Round `vocab_size` up to a multiple of `make_vocab_size_divisible_by * tp_size`, so the
    embedding splits evenly over tensor-parallel ranks into GPU-friendly shapes."""
    for name, value in (
        ("make_vocab_size_divisible_by", make_vocab_size_divisible_by),
        ("model_parallel_size", tp_size),
        ("vocab_size", vocab_size),
    ):
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ConfigError(f"{name} must be a positive integer, got {value!r}")
    multiple = make_vocab_size_divisible_by * tp_size
    return -(-vocab_size // multiple) * multiple


def kept_padded_vocab(
    saved: int | None, vocab_size: int, make_vocab_size_divisible_by: int, tp_size: int
) -> int:
    """The padded vocabulary at `tp_size` of a model saved with `saved` vocabulary rows:
    `saved` itself when it holds the tokenizer's `vocab_size` tokens and is a multiple of
    `make_vocab_size_divisible_by` (as at any tensor-parallel size) and of `tp_size`, else
    `pad_vocab_size`'s. Padding rows are masked out of the loss (`true_vocab_size`), so keeping
    the saved rows keeps both the model's function and the checkpoint's shapes."""
    if (
        saved is not None
        and saved >= vocab_size
        and saved % make_vocab_size_divisible_by == 0
        and saved % tp_size == 0
    ):
        return saved
    return pad_vocab_size(vocab_size, make_vocab_size_divisible_by, tp_size)


def resumed_padded_vocab(cfg: Config, saved: int | None) -> int | None:
    """The padded vocabulary a run of `cfg` builds to resume a checkpoint saved with `saved`
    vocabulary rows (None: no checkpoint): `kept_padded_vocab`'s, or the derived one when
    the tokenizer's size is unknown (a dry run without its files)."""
    m = cfg.model
    if saved is None or m.true_vocab_size is None:
        return m.padded_vocab_size
    return kept_padded_vocab(
        saved,
        m.true_vocab_size,
        cfg.tokenizer.make_vocab_size_divisible_by,
        cfg.parallel.model_parallel_size,
    )


def derive_parallel(cfg: Config, sources: dict[str, str], world_size: int | None):
    p = cfg.parallel
    world = world_size or p.world_size or 1
    stages = max(1, p.pipe_parallel_size)
    if p.model_parallel_size < 1 or p.pipe_parallel_size < 0:
        raise ConfigError(
            f"model_parallel_size must be >= 1 and pipe_parallel_size >= 0{_src(sources, 'model_parallel_size', 'pipe_parallel_size')}"  # noqa: E501
        )
    model_ranks = stages * p.model_parallel_size
    if world % model_ranks:
        raise ConfigError(
            f"world size {world} is not divisible by pipe_parallel_size × model_parallel_size "
            f"= {stages} × {p.model_parallel_size} = {model_ranks}"
            f"{_src(sources, 'pipe_parallel_size', 'model_parallel_size', 'num_gpus')}; "
            f"use a number of ranks that is a multiple of {model_ranks}"
        )
    zero = p.zero_optimization or {}
    stage = zero.get("stage", 0)
    if not isinstance(stage, int) or isinstance(stage, bool) or stage not in (0, 1, 2, 3):
        raise ConfigError(
            f"zero_optimization.stage{_src(sources, 'zero_optimization')}: {stage!r} is not "
            "valid; expected one of 0, 1, 2, 3"
        )
    return dataclasses.replace(
        p, world_size=world, data_parallel_size=world // model_ranks, zero_stage=stage
    )


def derive_batch(cfg: Config, sources: dict[str, str], dp: int, training: bool = True):
    t = cfg.training
    gbs, mbs, gas = (
        t.train_batch_size,
        t.train_micro_batch_size_per_gpu,
        t.gradient_accumulation_steps,
    )
    keys = ("train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps")
    for key, value in zip(keys, (gbs, mbs, gas)):
        if value is not None and value < 1:
            raise ConfigError(f"{key}{_src(sources, key)} must be >= 1, got {value}")
    if gbs is None and mbs is None:
        if not training:
            return t  # generate.py/eval.py: no training batch to size
        raise ConfigError(
            "set train_micro_batch_size_per_gpu or train_batch_size (global batch = micro batch "
            "× gradient_accumulation_steps × data-parallel size)"
        )
    if gbs is not None and mbs is not None and gas is not None:
        if gbs != mbs * gas * dp:
            raise ConfigError(
                f"inconsistent batch sizes{_src(sources, *keys)}: train_batch_size {gbs} != "
                f"train_micro_batch_size_per_gpu {mbs} × gradient_accumulation_steps {gas} × "
                f"data-parallel size {dp} = {mbs * gas * dp}; set any two and the third is "
                "derived"
            )
    elif gbs is not None and mbs is not None:
        if gbs % (mbs * dp):
            raise ConfigError(
                f"train_batch_size {gbs} is not divisible by train_micro_batch_size_per_gpu {mbs}"
                f" × data-parallel size {dp} = {mbs * dp}{_src(sources, *keys[:2])}"
            )
        gas = gbs // (mbs * dp)
    elif gbs is not None:
        gas = gas or 1
        if gbs % (gas * dp):
            raise ConfigError(
                f"train_batch_size {gbs} is not divisible by gradient_accumulation_steps {gas} × "
                f"data-parallel size {dp} = {gas * dp}{_src(sources, keys[0], keys[2])}"
            )
        mbs = gbs // (gas * dp)
    else:
        gas = gas or 1
        gbs = mbs * gas * dp
    return dataclasses.replace(
        t, train_batch_size=gbs, train_micro_batch_size_per_gpu=mbs, gradient_accumulation_steps=gas
    )


def derive_precision(cfg: Config, sources: dict[str, str], warn: list[str]):
    pr = cfg.precision
    fp16_on = bool(pr.fp16 and pr.fp16.get("enabled", True))
    bf16_on = bool(pr.bf16 and pr.bf16.get("enabled", True))
    named = {"fp16": "fp16", "bfloat16": "bf16", "bf16": "bf16", "fp32": "fp32"}.get(
        pr.precision or ""
    )
    if fp16_on and bf16_on:
        raise ConfigError(f"fp16 and bf16 are both enabled{_src(sources, 'fp16', 'bf16')}")
    from_sections = "fp16" if fp16_on else "bf16" if bf16_on else None
    if named and from_sections and named != from_sections:
        raise ConfigError(
            f"precision '{pr.precision}' contradicts the enabled {from_sections} section"
            f"{_src(sources, 'precision', from_sections)}"
        )
    dtype = named or from_sections or "fp32"
    fp16_type = str((pr.fp16 or {}).get("type", "fp16"))
    if dtype == "fp16" and fp16_type.lower() not in ("fp16", "float16", "half"):
        warn.append(
            f"fp16.type '{fp16_type}'{_src(sources, 'fp16')} is ignored, as by GPT-NeoX's "
            "DeepSpeed: this run trains in fp16; for bf16 set precision: bfloat16 (or a bf16 "
            "section) in place of the fp16 section"
        )
    p = cfg.parallel
    if dtype == "bf16" and p.pipe_parallel_size >= 1 and p.zero_stage == 0:
        warn.append(
            "bf16 with the pipeline engine and ZeRO stage 0: DeepSpeed accumulates gradients in "
            "bf16 here, and DeepSpeed 0.19.8 cannot load this optimizer's state on resume "
            "(its checkpoints load with finetune: true or no_load_optim: true); use "
            "zero_optimization: {stage: 1} for fp32 accumulation and resumable optimizer state"
        )
    return dataclasses.replace(pr, dtype=dtype)


def _number(value):
    if isinstance(value, str):
        try:
            return float(value)
        except ValueError:
            return value
    if isinstance(value, list):
        return [_number(v) for v in value]
    return value


def derive_optimizer(cfg: Config, sources: dict[str, str], warn: list[str], training: bool):
    """Canonical type, lr and params; GPT-NeoX's defaults (with a warning) for what is unset."""
    o = cfg.optimizer
    section = o.optimizer or {}
    raw_type = str(section.get("type", NEOX_DEFAULT_OPTIMIZER))
    canonical = {t.lower(): t for t in OPTIMIZER_TYPES}.get(raw_type.lower())
    if canonical is None:
        raise ConfigError(
            f"optimizer.type{_src(sources, 'optimizer')}: '{raw_type}' is not valid; expected one "
            f"of {', '.join(OPTIMIZER_TYPES)}"
        )
    # YAML 1.1 reads `1e-8` (no dot) as text: numbers in params are made numbers again.
    params = {k: _number(v) for k, v in (section.get("params") or {}).items()}
    lr = o.lr if o.lr is not None else params.get("lr")
    params.pop("lr", None)
    defaulted = []
    if o.optimizer is None:
        params = dict(NEOX_DEFAULT_PARAMS)
        defaulted.append(
            f"optimizer {NEOX_DEFAULT_OPTIMIZER} (betas {params['betas']}, eps {params['eps']})"
        )
    elif "type" not in section:
        defaulted.append(f"optimizer.type {NEOX_DEFAULT_OPTIMIZER}")
    if lr is None:
        lr = NEOX_DEFAULT_LR
        defaulted.append(f"lr {NEOX_DEFAULT_LR}")
    if defaulted and training:
        warn.append(f"using GPT-NeoX's default {', '.join(defaulted)}: the config sets none")
    return dataclasses.replace(o, lr=float(lr), optimizer_type=canonical, optimizer_params=params)


def derive_generation(cfg: Config):
    """GPT-NeoX's `text_gen_type` default: input-file when a sample_input_file is given."""
    g = cfg.generation
    if g.text_gen_type is not None:
        return g
    kind = "input-file" if g.sample_input_file else "unconditional"
    return dataclasses.replace(g, text_gen_type=kind)


def derive_lr(cfg: Config, sources: dict[str, str]):
    lr = cfg.lr
    decay, warmup = decay_and_warmup_iters(lr, cfg.training.train_iters)
    return dataclasses.replace(
        lr, lr_decay_iters=decay or None, decay_iters=decay, warmup_iters=warmup
    )


def expand_attention_config(attention_config, num_layers: int, source: str = "") -> tuple:
    """GPT-NeoX `[[["global", "flash"], 6]]` → one type per layer (pattern × count)."""
    if not attention_config:
        return ("global",) * num_layers
    if all(isinstance(item, str) for item in attention_config):
        types = list(attention_config)
    else:
        types = []
        for item in attention_config:
            if not (isinstance(item, list | tuple) and len(item) == 2):
                raise ConfigError(f"attention_config{source}: entry {item!r} is not [types, count]")
            pattern, count = list(item[0]), item[1]
            if count == "all":
                count = num_layers // len(pattern)
            types.extend(pattern * int(count))
    if len(types) != num_layers:
        raise ConfigError(
            f"attention_config{source} gives {len(types)} layers but num_layers is {num_layers}"
        )
    return tuple(types)


def derive_model(cfg: Config, sources: dict[str, str], vocab_size: int | None):
    m = cfg.model
    padded, true_vocab = m.padded_vocab_size, m.true_vocab_size
    if vocab_size is not None:
        true_vocab = vocab_size
        padded = pad_vocab_size(
            vocab_size, cfg.tokenizer.make_vocab_size_divisible_by, cfg.parallel.model_parallel_size
        )
    types = m.layer_attention_types
    if m.num_layers:
        types = expand_attention_config(
            m.attention_config, m.num_layers, _src(sources, "attention_config")
        )
    return dataclasses.replace(
        m,
        padded_vocab_size=padded,
        true_vocab_size=true_vocab,
        layer_attention_types=types,
        max_position_embeddings=m.max_position_embeddings or m.seq_length,
        loss_chunk_tokens=_loss_chunk_tokens(cfg, padded),
    )


def _loss_chunk_tokens(cfg: Config, padded_vocab: int | None) -> int:
    """`loss_chunk_tokens: null` (the fused head and loss on, auto-sized) made a number: 0 for a
    reward model (a value head, no vocabulary) and for bf16 on the pipeline engine
    (`pipeline_bf16`), else `auto_loss_chunk_tokens`."""
    chunk = cfg.model.loss_chunk_tokens
    if chunk is not None:
        return chunk
    if getattr(getattr(cfg, "post_training", None), "train_impl", None) == "rm":
        return 0
    if pipeline_bf16(cfg):
        return 0
    # (no vocabulary yet: a config resolved without its tokenizer, sized as for a small one)
    return auto_loss_chunk_tokens(padded_vocab or 0, cfg.parallel.model_parallel_size)


def derive(
    cfg: Config,
    sources: dict[str, str],
    *,
    world_size: int | None,
    vocab_size: int | None,
    warn: list[str],
    training: bool = True,
) -> Config:
    cfg = dataclasses.replace(cfg, parallel=derive_parallel(cfg, sources, world_size))
    cfg = dataclasses.replace(
        cfg,
        training=derive_batch(cfg, sources, cfg.parallel.data_parallel_size, training),
        precision=derive_precision(cfg, sources, warn),
        optimizer=derive_optimizer(cfg, sources, warn, training),
        generation=derive_generation(cfg),
    )
    mup = dataclasses.replace(cfg.mup, mup_base_shapes=read_base_shapes(cfg.mup, sources, warn))
    return dataclasses.replace(
        cfg, lr=derive_lr(cfg, sources), model=derive_model(cfg, sources, vocab_size), mup=mup
    )
