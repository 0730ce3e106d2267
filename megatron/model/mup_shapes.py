"""mup's base-shapes file: which dimensions of each parameter grow with the width.

`base_shapes(args, width_scale)` compares the whole model's shapes (`gpt.py::full_shapes`)
with those of a model `width_scale` times wider; `save_base_shapes(cfg)` writes them as mup's
YAML (`save_base_shapes: true`). Apart from `mup.py`, which `gpt.py` imports.
"""

from __future__ import annotations

import dataclasses

from megatron.model.args import ModelArgs
from megatron.model.gpt import full_shapes


def base_shapes(args: ModelArgs, width_scale: int) -> dict[str, list[int | None]]:
    """mup's base shapes for `args` as the base: per parameter the base size of each dimension
    that differs in a model `width_scale` times wider (`hidden_size`), null for the others."""
    base = full_shapes(args)
    wider = dataclasses.replace(
        args,
        hidden_size=args.hidden_size * width_scale,
        head_dim=args.head_dim * width_scale,
    )
    delta = full_shapes(wider)
    return {
        name: [b if b != d else None for b, d in zip(shape, delta[name], strict=True)]
        for name, shape in base.items()
    }


def save_base_shapes(cfg) -> None:
    """`save_base_shapes: true`: write `base_shapes_file` for the configured model (global rank
    0 of the launch writes it; the shapes need no process group)."""
    import os

    import yaml

    if int(os.environ.get("RANK", "0")) != 0:
        return
    shapes = base_shapes(ModelArgs.from_config(cfg), cfg.mup.mup_width_scale)
    path = cfg.mup.base_shapes_file
    tmp = f"{path}.tmp"
    with open(tmp, "w") as f:
        yaml.safe_dump(shapes, f, sort_keys=False)
    os.replace(tmp, path)
    print(f"muP base shapes of {len(shapes)} parameters written to {path}", flush=True)
