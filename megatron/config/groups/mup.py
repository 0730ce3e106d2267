"""muP settings (`cfg.mup`), GPT-NeoX's keys, meanings and defaults.

muP (Yang et al. 2022, "Tensor Programs V", arXiv:2203.03466) makes the best hyperparameters
of a narrow model carry over to a wide one. Each parameter's width multiplier is its width
divided by the same parameter's width in a base model, read from `base_shapes_file` (mup's
YAML format: per parameter the base size of each dimension that grows with the width, null for
the others). `save_base_shapes: true` writes that file from the configured model (the base)
and a copy `mup_width_scale` times wider, then stops. The model side is
`megatron/model/mup.py`; `validate_mup` refuses the combinations that are not built.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from megatron.config.schema import ConfigError, derived, set_in


@dataclass(frozen=True)
class MuPConfig:
    use_mup: bool = False
    """Train in muP: matrix-like weights initialised with std / sqrt(width multiplier) and
    trained with LR / width multiplier (Adam; SGD: mup's MuSGD rule), attention scores divided
    by the head width instead of its square root, the output head's input divided by the width
    multiplier. Needs `base_shapes_file`. False leaves the standard parametrisation untouched."""

    save_base_shapes: bool = False
    """Write `base_shapes_file` from this model (the base) and one `mup_width_scale` times
    wider, then stop without training (GPT-NeoX's step before a muP run)."""

    base_shapes_file: str | None = None
    """Path of the base shapes (mup's YAML format) that `save_base_shapes` writes and
    `use_mup` reads. Read once before launch; the run carries its contents."""

    coord_check: bool = False
    """GPT-NeoX's switch to draw coordinate-check plots instead of training; here run
    `tools/coord_check.py` with the config (it trains a few steps at several widths)."""

    mup_init_scale: float = 1.0
    """Multiplies every weight matrix and embedding table at initialisation."""

    mup_attn_temp: float = 1.0
    """Attention temperature: attention scores are divided by `mup_attn_temp × head_dim`
    (GPT-NeoX declares this key and never reads it: its scores are divided by head_dim)."""

    mup_output_temp: float = 1.0
    """Output temperature: the logits are divided by it (and by the width multiplier);
    GPT-NeoX declares this key and never reads it (its logits are divided by the multiplier)."""

    mup_embedding_mult: float = 1.0
    """Multiplies the embedding layer's output (after embedding dropout)."""

    mup_rp_embedding_mult: float = 1.0
    """Multiplies the learned or sinusoidal position embeddings before they are added."""

    mup_width_scale: int = 2
    """How many times wider the delta model of `save_base_shapes` is."""

    mup_base_shapes: dict[str, Any] | None = derived(None)
    """The contents of `base_shapes_file` (derived before launch when `use_mup`)."""


def read_base_shapes(
    mup: MuPConfig, sources: dict[str, str], warn: list[str]
) -> dict[str, Any] | None:
    """The base shapes a muP run reads (None when it reads none); refuses a missing file.
    Without `use_mup` the muP keys have no effect (as in GPT-NeoX): each one set warns."""
    if not mup.use_mup:
        for key in (*MUP_MODEL_KEYS[1:-1], "mup_width_scale", "save_base_shapes"):
            if getattr(mup, key) != getattr(MuPConfig, key):
                warn.append(f"{key}{set_in(sources, key)} has no effect without use_mup: true")
        return None
    where = set_in(sources, "use_mup", "base_shapes_file")
    if mup.save_base_shapes and not mup.base_shapes_file:
        raise ConfigError(
            f"save_base_shapes: true{set_in(sources, 'save_base_shapes')} needs "
            f"base_shapes_file{where}: the path to write the base shapes to"
        )
    if mup.save_base_shapes:
        return None
    if not mup.base_shapes_file:
        raise ConfigError(
            f"use_mup: true needs base_shapes_file{where}: write it once with "
            "save_base_shapes: true (from the base model's config), then train with it"
        )
    path = Path(mup.base_shapes_file)
    if not path.is_file():
        raise ConfigError(
            f"base_shapes_file '{path}'{where} does not exist: write it with save_base_shapes: true"
        )
    shapes = yaml.safe_load(path.read_text())
    if not isinstance(shapes, dict) or not all(
        isinstance(v, list) and all(d is None or isinstance(d, int) for d in v)
        for v in shapes.values()
    ):
        raise ConfigError(
            f"base_shapes_file '{path}'{where} is not a base-shapes file (a mapping of "
            "parameter names to lists of base sizes or null)"
        )
    return shapes


# The keys the model reads (as `ModelArgs` fields, `megatron/model/args.py`).
MUP_MODEL_KEYS = (
    "use_mup",
    "mup_init_scale",
    "mup_attn_temp",
    "mup_output_temp",
    "mup_embedding_mult",
    "mup_rp_embedding_mult",
    "mup_base_shapes",
)
# What muP is built for here, and why the rest is refused.
MUP_OPTIMIZERS = ("Adam", "AdamW", "SGD")  # GPT-NeoX's: mup's MuAdam and MuSGD
MUP_INITS = ("normal", "scaled_normal", "single_residual_scaled_normal", "small_init", "wang_init")
MUP_LAYER_TYPES = ("global", "local", "flash", "sdpa")


def validate_mup(cfg, sources: dict[str, str]) -> None:
    """Refuse what muP is not built for."""
    mup = cfg.mup
    if mup.coord_check:
        raise ConfigError(
            f"coord_check: true{set_in(sources, 'coord_check')} is not a training mode here: "
            "run `python tools/coord_check.py CONFIG...` for the coordinate-check plots"
        )
    if not mup.use_mup:
        return
    problems = []
    if cfg.optimizer.optimizer_type not in MUP_OPTIMIZERS:
        problems.append(
            f"optimizer.type '{cfg.optimizer.optimizer_type}' (muP scales the LR for: "
            f"{', '.join(MUP_OPTIMIZERS)})"
        )
    for key in ("init_method", "output_layer_init_method"):
        if getattr(cfg.model, key) not in MUP_INITS:
            value = getattr(cfg.model, key)
            problems.append(f"{key} '{value}' (muP inits: {', '.join(MUP_INITS)})")
    other = sorted(set(cfg.model.layer_attention_types) - set(MUP_LAYER_TYPES))
    if other:
        problems.append(f"attention_config layers {other} (muP: attention layers only)")
    if cfg.moe.moe_num_experts > 1:
        problems.append("moe_num_experts > 1 (muP for experts is not built)")
    if cfg.model.pos_emb == "rpe":
        problems.append("pos_emb: rpe (its bias is scaled for 1/sqrt(head_dim) scores)")
    if cfg.parallel.zero_stage == 3:
        problems.append("ZeRO stage 3 (muP rescales the weights after they are built whole)")
    if cfg.post_training.train_impl == "rm":
        problems.append("train_impl: rm (muP's readout is built for the vocabulary head)")
    if mup.mup_width_scale < 2:
        problems.append(f"mup_width_scale {mup.mup_width_scale} (must be >= 2)")
    if problems:
        raise ConfigError(
            f"use_mup: true{set_in(sources, 'use_mup')} is not built with: " + "; ".join(problems)
        )
