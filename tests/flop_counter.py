"""torch's FLOP counter as the tests use it: the reference for the FLOPs the trainer reports.

torch 2.13's `FlopCounterMode` has formulas for the CUDA kernels of
`scaled_dot_product_attention` but none for the CPU one
(`_scaled_dot_product_flash_attention_for_cpu`), which it counts as 0 FLOPs. GPT-NeoX's `global`
attention runs that kernel on a CPU, so `flop_counter()` counts it with torch's own forward
formula (`sdpa_flop`: the two matmuls over the full score matrix) and its backward as twice
that: the four matmuls of the explicit path's backward. Model FLOPs (PaLM's convention, what
the trainer reports) leave out the kernel's recomputation of the scores in the backward, which
torch's backward formula for the CUDA kernels counts.
"""

from __future__ import annotations

import dataclasses

import torch
from torch.utils.flop_counter import FlopCounterMode, sdpa_flop_count

aten = torch.ops.aten


def _forward(query, key, value, *args, out_shape=None, **kwargs) -> int:
    return sdpa_flop_count(query, key, value)


def _backward(grad_out, query, key, value, *args, out_shape=None, **kwargs) -> int:
    return 2 * sdpa_flop_count(query, key, value)


CPU_SDPA = {
    aten._scaled_dot_product_flash_attention_for_cpu: _forward,
    aten._scaled_dot_product_flash_attention_for_cpu_backward: _backward,
}


def flop_counter() -> FlopCounterMode:
    return FlopCounterMode(display=False, custom_mapping=CPU_SDPA)


def counted_training_flops_per_token(args, seq: int) -> float:
    """Training FLOPs per token of our model (`ModelArgs` `args` at sequence `seq`), counted by
    torch over forward + loss backward on the meta device."""
    from megatron.model import build_gpt

    args = dataclasses.replace(args, pipe_parallel_size=0, seq_length=seq)
    with torch.device("meta"):
        model = build_gpt(args)
        tokens = torch.zeros(1, seq, dtype=torch.long)
        positions = torch.arange(seq).expand(1, seq)
        with flop_counter() as counter:
            logits = model(tokens, positions)
            model.loss_fn(logits, (tokens, torch.ones(1, seq))).backward()
    return counter.get_total_flops() / seq
