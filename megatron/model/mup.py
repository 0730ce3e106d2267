"""muP (Tensor Programs V, arXiv:2203.03466) as GPT-NeoX applies it, without the mup package.

Every parameter gets an "infshape" as mup defines it: a dimension is infinite when it grows
with the width, i.e. when the base-shapes file (`mup_shapes.py`, mup's format) gives it a base
size; its multiplier is size / base size. A parameter with two infinite dimensions is
matrix-like, with fewer vector-like; its width multiplier is that of its last infinite
dimension (the fan-in of a `(out, in)` weight). Sizes are those of the whole model on one
process (tensor parallelism splits a dimension of the base and the model alike).

`apply_mup(model, args, full_shapes)` then does, after the standard initialisation:
- matrix-like weights × width_mult^-1/2 (mup's `init.normal_`), every weight matrix and
  embedding table × `mup_init_scale`;
- records each parameter's `InfShape` (attribute `INFSHAPE`), from which `split_groups`
  scales its LR and weight decay for the optimizer (mup's `MuAdam` and `MuSGD` rules);
- sets the output head's input multiplier 1 / (width_mult × `mup_output_temp`) (mup's
  `MuReadout`, as GPT-NeoX divides the head's input).
The attention scale 1 / (head_dim × `mup_attn_temp`) and the embedding multipliers are read
from the args by `attention_backends.py` and `embedding.py`.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch
from torch import nn

from megatron.model.args import ModelArgs

INFSHAPE = "mup_infshape"  # attribute of each parameter: its `InfShape`
READOUT = "mup_readout_mult"  # attribute of the head module: its input multiplier


@dataclasses.dataclass(frozen=True)
class InfShape:
    """mup's view of one parameter: per dimension its multiplier, None where finite."""

    mults: tuple[float | None, ...]

    @property
    def ninf(self) -> int:
        return sum(m is not None for m in self.mults)

    @property
    def width_mult(self) -> float:
        """The multiplier of the last infinite dimension (1 when there is none)."""
        inf = [m for m in self.mults if m is not None]
        return inf[-1] if inf else 1.0

    def fanin_fanout_ratio(self) -> float:
        fanout, fanin = (m or 1.0 for m in self.mults[:2])
        return fanin / fanout


def infshapes(args: ModelArgs, shapes: dict[str, tuple[int, ...]]) -> dict[str, InfShape]:
    """Each parameter's `InfShape` from `args.mup_base_shapes` and the whole model's shapes
    (`gpt.py::full_shapes`)."""
    base = args.mup_base_shapes
    missing = sorted(set(shapes) - set(base or {}))
    if missing:
        raise ValueError(
            f"base_shapes_file has no entry for parameters {missing[:5]}: it was written for "
            "another model; write it again with save_base_shapes: true"
        )
    out = {}
    for name, shape in shapes.items():
        dims = base[name]
        if len(dims) != len(shape):
            raise ValueError(
                f"base_shapes_file gives parameter {name} {len(dims)} dimensions, the model "
                f"{len(shape)}: write it again with save_base_shapes: true"
            )
        out[name] = InfShape(tuple(None if b is None else s / b for s, b in zip(shape, dims)))
    return out


def _scales(shape: InfShape, optimizer_type: str) -> tuple[float, float]:
    """(LR scale, weight-decay scale): mup's MuAdam (matrix-like: LR / w, decay × w) or MuSGD
    (vector-like: LR × w, decay / w; matrix-like: LR / (fan-in w / fan-out w), decay ×)."""
    if shape.ninf > 2:
        raise ValueError("muP is defined for at most two infinite dimensions")
    if optimizer_type == "SGD":
        if shape.ninf == 2:
            ratio = shape.fanin_fanout_ratio()
            return 1.0 / ratio, ratio
        return shape.width_mult, 1.0 / shape.width_mult
    if shape.ninf == 2:
        return 1.0 / shape.width_mult, shape.width_mult
    return 1.0, 1.0


def apply_mup(model: nn.Module, args: ModelArgs, full: dict[str, tuple[int, ...]]) -> None:
    """Turn a standard-initialised model into muP (see the module docstring), in place;
    `full`: every parameter's shape in the whole model (`gpt.py::full_shapes`)."""
    shapes = infshapes(args, full)
    with torch.no_grad():
        for name, p in model.named_parameters():
            shape = shapes[name]
            if p.dim() >= 2:  # weights and tables: the init_method's tensors
                scale = args.mup_init_scale
                if shape.ninf == 2:
                    scale *= shape.width_mult**-0.5
                if scale != 1.0:
                    p.mul_(scale)
            setattr(p, INFSHAPE, shape)
    for module_name, module in model.named_modules():
        if hasattr(module, READOUT):
            weight = readout_weight(module_name, module)
            mult = shapes[weight].width_mult
            setattr(module, READOUT, 1.0 / (mult * args.mup_output_temp))


def readout_weight(module_name: str, module: nn.Module) -> str:
    """The name of the weight a readout module projects with."""
    tied = hasattr(module, "word_embeddings")
    local = "word_embeddings.weight" if tied else "final_linear.weight"
    return f"{module_name}.{local}" if module_name else local


def split_groups(groups: list[dict[str, Any]], optimizer_type: str) -> list[dict[str, Any]]:
    """Each optimizer group split by its parameters' muP scales: `lr_scale` (read by the LR
    schedule) and the weight decay, scaled. Parameters without an `InfShape` keep theirs."""
    out = []
    for group in groups:
        by_scale: dict[tuple[float, float], list] = {}
        for p in group["params"]:
            shape = getattr(p, INFSHAPE, None)
            key = (1.0, 1.0) if shape is None else _scales(shape, optimizer_type)
            by_scale.setdefault(key, []).append(p)
        for (lr_scale, wd_scale), params in by_scale.items():
            extra = {} if lr_scale == 1.0 else {"lr_scale": group.get("lr_scale", 1.0) * lr_scale}
            name = group.get("name", "group")
            if (lr_scale, wd_scale) != (1.0, 1.0):
                name = f"{name}_mup_lr{lr_scale:g}_wd{wd_scale:g}"
            out.append(
                {
                    **group,
                    "params": params,
                    "weight_decay": group["weight_decay"] * wd_scale,
                    "name": name,
                    **extra,
                }
            )
    return out
