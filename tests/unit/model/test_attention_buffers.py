"""What a GPU would hold for attention: no sequence × sequence buffer per layer where SDPA's
fused kernels can compute the layer, and score biases built once per forward.

Two transformer layers run one after the other on the same `position_ids`, as in one forward
of a pipeline stage (no embedding in front of them), at micro batch 2 and sequence 2048, in
bf16, with `tests/device_costs.py::LargeTensors` recording each op's outputs and what autograd
saves. The width is scaled down (the attention heads of the 160M model, 12, at head width 8):
sequence × sequence buffers depend on the heads, not on the head width, so their sizes are the
160M model's. On the CPU, SDPA runs its flash kernel (`_scaled_dot_product_flash_attention_for
_cpu`) with or without a mask, unless the mask needs a gradient (rpe's: the math kernel, so the
test freezes rpe's table); the rule that keeps a fused kernel on CUDA with grouped key/value
heads and a mask is held by `test_attention_masks.py::test_a_mask_goes_to_sdpa_with_every_key_
value_head`.

Before the fix (b=2, s=2048, 12 heads, bf16), a layer built: ALiBi a 400 MB fp32 bias, `global`
with the fusion keys, a window or rpe 200 MB bf16 scores/probabilities (rpe also 67 MB of int64
buckets, the window int64 and bool (s, s) masks); after, none but rpe's own 200 MB bias.
"""

from __future__ import annotations

import pytest
import torch

from megatron.model import ModelArgs
from megatron.model.attention_masks import clear_masks
from megatron.model.relative_bias import RelativePositionBias
from megatron.model.transformer import transformer_layer_class
from tests.device_costs import LargeTensors

B, S, HEADS, HEAD_DIM = 2, 2048, 12, 8
WINDOW = 256
ATTENTION = {
    "global": {},
    "global fused": {"softmax_fusion": True},
    "flash": {"layer_attention_types": ("flash", "flash")},
    "alibi": {"pos_emb": "alibi"},
    "alibi flash": {"pos_emb": "alibi", "layer_attention_types": ("flash", "flash")},
    "rpe": {"pos_emb": "rpe"},
    "window": {"sliding_window_width": WINDOW},
    "window fused": {"sliding_window_width": WINDOW, "softmax_fusion": True},
    "gqa": {"num_kv_heads": 4},
    "gqa window": {"num_kv_heads": 4, "sliding_window_width": WINDOW},
    "gqa window flash": {
        "num_kv_heads": 4,
        "sliding_window_width": WINDOW,
        "layer_attention_types": ("flash", "flash"),
    },
}


def layer_args(**changes) -> ModelArgs:
    values = dict(
        num_layers=2,
        hidden_size=HEADS * HEAD_DIM,
        num_attention_heads=HEADS,
        vocab_size=128,
        seq_length=S,
        pos_emb="rotary",
        norm="layernorm",
        activation="gelu",
        gpt_j_residual=True,
        seed=3,
    )
    return ModelArgs(**{**values, **changes})


def two_layers(changes: dict, rows: int = B, frozen_rpe: bool = True):
    """`LargeTensors` of layer 0's and of layer 1's forward (train mode, bf16, no dropout)."""
    args = layer_args(**changes)
    clear_masks()  # what an earlier test left cached would not be built here
    cls = transformer_layer_class(args)
    layers = [cls(args, i).to(torch.bfloat16).train() for i in range(2)]
    for layer in layers:
        if frozen_rpe and isinstance(layer.attention.positions, RelativePositionBias):
            # A mask that needs a gradient takes the CPU's SDPA to its math kernel (CUDA's
            # memory-efficient one keeps no probabilities): frozen, the CPU runs flash too.
            layer.attention.positions.weight.requires_grad_(False)
    x = torch.randn(S, B, args.hidden_size, dtype=torch.bfloat16, requires_grad=True)
    position_ids = torch.arange(S).expand(rows, S).contiguous()
    inputs, seen = (x, position_ids), []
    for layer in layers:
        with LargeTensors() as buffers:
            inputs = layer(inputs)
        seen.append(buffers)
    return seen


ENCODINGS = ("model/positional.py", "model/relative_bias.py", "model/attention_masks.py")


def per_layer(second: LargeTensors) -> list:
    """Sequence × sequence buffers the second layer allocated (what it saves of the first's,
    or of a cache's, is shared)."""
    return second.square(S, "output")


@pytest.mark.parametrize("name", sorted(ATTENTION))
def test_no_layer_builds_a_sequence_by_sequence_buffer(name):
    _, second = two_layers(ATTENTION[name])
    built = per_layer(second)
    if name == "rpe":  # each layer's table gives it its own bias; the buckets are shared
        assert all(b.where.startswith("model/relative_bias.py") for b in built), second.report()
        assert all(b.dtype == torch.bfloat16 for b in built), second.report(built)
        assert max(b.nbytes for b in built) == B * HEADS * S * S * 2, second.report(built)
    else:
        assert not built, f"{name}: {second.report(built)}"


@pytest.mark.parametrize("name", ["alibi", "window", "gqa window", "rpe"])
def test_a_bias_is_built_once_in_the_compute_dtype_and_broadcast_over_the_batch(name):
    """With one row of positions for the batch (rows that agree), what the first layer builds
    from the positions and the layers keep for the backward has no batch dimension and is in
    bf16 (the rpe buckets: int32)."""
    first, second = two_layers(ATTENTION[name], rows=1, frozen_rpe=False)
    built = {
        b.storage
        for b in first.buffers
        if b.kind == "output" and b.where.split(":")[0] in ENCODINGS and b.alive()
    }
    kept = [b for b in first.square(S, "saved") if b.storage in built]
    assert kept, first.report()
    for buffer in kept:
        assert buffer.dtype in (torch.bfloat16, torch.int32), first.report(kept)
        assert len(buffer.shape) == 2 or buffer.shape[0] == 1, first.report(kept)
    assert {b.storage for b in second.square(S, "saved")} & {b.storage for b in kept}
