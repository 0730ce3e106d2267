"""muP's coordinate check (Tensor Programs V, section 7.3; mup's `coord_check`): train copies
of one model at several widths for a few Adam steps from the same data, and record the size
of the activations (mean |x| per coordinate) after each step. Under muP they stay flat as
the width grows; under the standard parametrisation they grow with it.

`coord_data` returns `{width: {module: [size after step 1, 2, ...]}}` for the model's
modules by GPT-NeoX's layer index (`layer 2` .. `layer L+1` the transformer layers, `layer
L+3` the final norm; with tied embeddings the embedding module is not hooked, as the output
head calls it too) and the logits; `tools/coord_check.py` plots it.
"""

from __future__ import annotations

import dataclasses

import torch

from megatron.model.args import ModelArgs
from megatron.model.gpt import build_gpt
from megatron.model.loss import bound_loss_fn
from megatron.model.mup import split_groups
from megatron.model.mup_shapes import base_shapes
from megatron.model.param_groups import param_groups


def widen(args: ModelArgs, width: int, base: dict | None) -> ModelArgs:
    """`args` at hidden size `width` (heads kept, so the head width grows), muP on when
    `base` (base shapes) is given; the head writes logits (the check records them), whatever
    `loss_chunk_tokens`."""
    return dataclasses.replace(
        args,
        loss_chunk_tokens=0,
        hidden_size=width,
        head_dim=width // args.num_attention_heads,
        use_mup=base is not None,
        mup_base_shapes=base,
    )


def coord_data(
    args: ModelArgs,
    widths: list[int],
    *,
    mup: bool,
    lr: float = 1e-2,
    steps: int = 3,
    batch: int = 4,
    seed: int = 0,
) -> dict[int, dict[str, list[float]]]:
    """Activation sizes per width, module and step (see the module docstring); `args` is the
    base model (its width is muP's base)."""
    base = base_shapes(args, 2) if mup else None
    generator = torch.Generator().manual_seed(seed)
    tokens = torch.randint(0, args.vocab_size, (batch, args.seq_length + 1), generator=generator)
    inputs, labels = tokens[:, :-1], tokens[:, 1:]
    positions = torch.arange(args.seq_length).expand(batch, -1)
    loss_fn = bound_loss_fn(None, 0.0, None)
    out = {}
    for width in widths:
        model = build_gpt(widen(args, width, base))
        groups = param_groups(model, 0.0)
        if mup:
            groups = split_groups(groups, "Adam")
        for g in groups:
            g["lr"] = lr * g.get("lr_scale", 1.0)
        optimizer = torch.optim.Adam(groups, lr=lr)
        sizes: dict[str, list[float]] = {}
        hooks = [
            module.register_forward_hook(_recorder(name, sizes))
            for name, module in model.named_children()
            if name != "tied_modules"
        ]
        for _ in range(steps):
            optimizer.zero_grad()
            logits = model(inputs, positions)
            sizes.setdefault("logits", []).append(logits.detach().abs().mean().item())
            loss_fn(logits, (labels, torch.ones_like(labels, dtype=torch.float))).backward()
            optimizer.step()
        for hook in hooks:
            hook.remove()
        out[width] = sizes
    return out


def _recorder(name: str, sizes: dict[str, list[float]]):
    def record(module, inputs, output):
        x = output[0] if isinstance(output, tuple) else output
        if torch.is_tensor(x) and x.is_floating_point():
            sizes.setdefault(f"layer {name}", []).append(x.detach().abs().mean().item())

    return record
