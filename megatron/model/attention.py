"""Tensor-parallel causal self-attention: fused QKV projection, positions, backend, output.

Fused QKV layout (the one checkpoint conversion must know, see `hf_names.py`): the
`query_key_value` weight has `(nq + 2 nkv) * d` rows, grouped by key/value head:

    rows viewed as (nkv, nq/nkv + 2, d):  for each kv head j, its nq/nkv query heads,
                                           then key head j, then value head j

With one kv head per query head this is GPT-NeoX's per-head `[q | k | v]` interleaving, so a
GPT-NeoX/Pythia `query_key_value` maps over unchanged. Because whole kv groups are contiguous,
the column-parallel split hands each tensor-parallel rank `nkv/tp` complete groups: its query
heads and exactly the key/value heads they use.

Variants (issue 13): `head_dim` may differ from `hidden_size / heads` (the projections are
`heads × head_dim` wide); `use_bias_in_qkv` biases the QKV projection alone (Qwen2);
`use_qk_layernorm` normalises each query and key head over `head_dim` before the rotary
embedding (Qwen3's q_norm/k_norm with `norm: rmsnorm`); `sliding_window_width` is applied by
the backend (`attention_backends.py`).
"""

from __future__ import annotations

import torch
from torch import nn

from megatron.model.args import ModelArgs
from megatron.model.attention_backends import build_attention_backend
from megatron.model.init_methods import input_init, output_init
from megatron.model.norms import build_norm
from megatron.model.positional import build_attention_positions
from megatron.parallel import ColumnParallelLinear, RowParallelLinear
from megatron.parallel.comm import divide, group_size


class ParallelSelfAttention(nn.Module):
    """`dense(attention(rotate(split(query_key_value(x)))))` on this rank's heads.

    Input `(s, b, h)` (or `(s/tp, b, h)` under sequence parallelism) and `position_ids (b, s)`;
    output in the input's layout.
    """

    def __init__(self, args: ModelArgs, layer_index: int, tp_group=None):
        super().__init__()
        tp = group_size(tp_group)
        self.head_dim = args.head_dim
        self.q_per_kv = args.num_attention_heads // args.kv_heads
        self.kv_heads = divide(args.kv_heads, tp, "num_kv_heads (key/value heads)")
        self.q_heads = self.kv_heads * self.q_per_kv
        qkv_rows = (args.num_attention_heads + 2 * args.kv_heads) * args.head_dim
        sp = args.sequence_parallel
        self.query_key_value = ColumnParallelLinear(
            args.hidden_size,
            qkv_rows,
            tp_group=tp_group,
            bias=args.use_bias_in_attn_linear or args.use_bias_in_qkv,
            init_method=input_init(args),
            sequence_parallel=sp,
        )
        self.positions = build_attention_positions(args, tp_group)
        self.qk_norm = None
        if args.use_qk_layernorm:
            # Replicated weights applied to different heads on each tp rank: their gradients
            # are partial, so they are marked for the tensor-parallel gradient sum.
            self.qk_norm = nn.ModuleDict(
                {
                    "query": build_norm(args, args.head_dim, sequence_parallel=tp > 1),
                    "key": build_norm(args, args.head_dim, sequence_parallel=tp > 1),
                }
            )
        self.core = build_attention_backend(args, layer_index, tp_group)
        self.dense = RowParallelLinear(
            args.num_attention_heads * args.head_dim,
            args.hidden_size,
            tp_group=tp_group,
            bias=args.use_bias_in_attn_linear,
            input_is_parallel=True,
            init_method=output_init(args),
            sequence_parallel=sp,
        )

    def split_qkv(self, qkv: torch.Tensor):
        """`(s, b, rows/tp)` -> q `(s, b, nq/tp, d)`, k and v `(s, b, nkv/tp, d)`."""
        s, b = qkv.shape[:2]
        grouped = qkv.view(s, b, self.kv_heads, self.q_per_kv + 2, self.head_dim)
        # One split (its backward writes the QKV gradient once), not three slices (each of
        # whose backward zero-fills a QKV-sized gradient that autograd then sums).
        q, k, v = grouped.split([self.q_per_kv, 1, 1], dim=3)
        q = q.reshape(s, b, self.q_heads, self.head_dim)
        return q, k.squeeze(3), v.squeeze(3)

    def forward(self, x: torch.Tensor, position_ids: torch.Tensor) -> torch.Tensor:
        q, k, v = self.split_qkv(self.query_key_value(x))  # full sequence (gathered under SP)
        if self.qk_norm is not None:
            q, k = self.qk_norm["query"](q), self.qk_norm["key"](k)
        q, k, bias = self.positions.encode(q, k, position_ids)
        context = self.core(q, k, v, bias)  # (s, b, nq/tp, d)
        s, b = context.shape[:2]
        return self.dense(context.reshape(s, b, self.q_heads * self.head_dim))
