"""RWKV-6 layers (`rwkv` in `attention_config`), as GPT-NeoX's `megatron/model/rwkv/v6` defines
them: a time-mix block (the RWKV substitute for attention) and a channel-mix block (its MLP).

    layer 0 only:  x = ln1(x)          (GPT-NeoX normalises the embedding with the same ln1)
    x = x + time_mix(ln1(x))
    x = x + channel_mix(ln2(x))

ln1/ln2 are `nn.LayerNorm(hidden_size)` whatever `norm` says (the final norm follows `norm`).
Each block mixes every token with the one before it (`shift`): `x + (x_{t-1} - x) * mix`.
Time-mix: data-dependent mixes for w, k, v, r, g (a rank-32 tanh projection), r, k, v, g
projections of width `dim_att`, a data-dependent log-decay w = -exp(time_decay + a rank-64
tanh projection), the WKV recurrence of `megatron/model/rwkv_wkv.py` over `dim_att /
head_size` heads with the bonus `time_faaaa`, a group norm per head (eps 64e-5), the gate
silu(g) and the output projection. Channel-mix: `sigmoid(receptance(xr)) * value(relu(key(xk))²)`
with a key of width `ffn_dim`.

Widths (`rwkv_widths`): `dim_att` defaults to `hidden_size`, `head_size` is `dim_att /
num_attention_heads`, `ffn_dim` defaults to `intermediate_size`, else 3.5 × hidden_size, rounded
down to a multiple of 32 (GPT-NeoX's rule). Initial values follow GPT-NeoX's layer-dependent
formulas; the linear layers keep PyTorch's default initialisation, as there.

The pipeline interface is the transformer layers': `(hidden (s, b, h), position_ids)`, the
positions passed on unread. `forward_with_state` runs a stretch of tokens from a given state
(previous token of each block and the WKV state) and returns the state after it: a sequence run
in pieces, or one token at a time, gives the same output as run whole. The class name contains
"TransformerLayer" so that `pipe_partition_method: type:transformer` balances RWKV layers too.
Tensor parallelism is not built (refused at config time, as in GPT-NeoX).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from megatron.config.groups.model import rwkv_ffn_dim
from megatron.model.args import ModelArgs
from megatron.model.rwkv_wkv import wkv6

MIX_RANK = 32  # rank of the data-dependent token-shift mixes (GPT-NeoX's TIME_MIX_EXTRA_DIM)
DECAY_RANK = 64  # rank of the data-dependent decay (GPT-NeoX's TIME_DECAY_EXTRA_DIM)
MIXED = ("w", "k", "v", "r", "g")  # the five time-mix inputs, in GPT-NeoX's order


def rwkv_widths(args: ModelArgs) -> tuple[int, int, int]:
    """`(dim_att, head_size, ffn_dim)` of the RWKV layers of `args` (module docstring)."""
    dim_att = args.dim_att or args.hidden_size
    heads = args.num_attention_heads
    if dim_att % heads:
        raise ValueError(f"dim_att {dim_att} is not divisible by num_attention_heads {heads}")
    head_size = dim_att // heads
    if args.head_size is not None and args.head_size != head_size:
        raise ValueError(
            f"head_size {args.head_size} is not dim_att / num_attention_heads = {head_size}; "
            "leave it unset (it is computed)"
        )
    ffn_dim = rwkv_ffn_dim(args.ffn_dim, args.intermediate_size, args.hidden_size)
    if ffn_dim < 1:
        raise ValueError(f"RWKV ffn_dim {ffn_dim} must be positive; set ffn_dim")
    return dim_att, head_size, ffn_dim


def rwkv_layer_parameters(args: ModelArgs) -> int:
    """Parameters of one RWKV layer (`megatron/model/counting.py` adds them up)."""
    h = args.hidden_size
    a, _, f = rwkv_widths(args)
    norms = 2 * 2 * h + 2 * a  # ln1, ln2 (weight and bias), the per-head group norm
    time_mix = 6 * h + h * MIX_RANK * 5 * 2 + a + h * DECAY_RANK + DECAY_RANK * a + a
    time_mix += 4 * h * a + a * h  # receptance, key, value, gate; output
    channel_mix = 2 * h + h * f + h * h + f * h
    return norms + time_mix + channel_mix


def shift(x: torch.Tensor, previous: torch.Tensor | None) -> torch.Tensor:
    """`x_{t-1}` for each token of `x (B, T, C)`: `previous (B, C)` before the first (None:
    zero)."""
    first = torch.zeros_like(x[:, :1]) if previous is None else previous[:, None].to(x.dtype)
    return torch.cat([first, x[:, :-1]], dim=1)


def _positions(n: int, device=None) -> torch.Tensor:
    return torch.arange(n, dtype=torch.float32, device=device)


class TimeMix(nn.Module):
    def __init__(self, args: ModelArgs, layer_index: int):
        super().__init__()
        h, layers = args.hidden_size, args.num_layers
        a, self.head_size, _ = rwkv_widths(args)
        self.heads = a // self.head_size
        depth = layer_index / max(layers - 1, 1)  # 0 at the first layer, 1 at the last
        shallow = 1.0 - layer_index / layers  # 1 at the first layer, down to 1/L
        ramp = (_positions(h) / h).view(1, 1, h)  # i / h per channel
        self.time_maa_x = nn.Parameter(1.0 - ramp.pow(shallow))
        self.time_maa_w = nn.Parameter(1.0 - ramp.pow(shallow))
        self.time_maa_k = nn.Parameter(1.0 - ramp.pow(shallow))
        self.time_maa_v = nn.Parameter(1.0 - (ramp.pow(shallow) + 0.3 * depth))
        self.time_maa_r = nn.Parameter(1.0 - ramp.pow(0.5 * shallow))
        self.time_maa_g = nn.Parameter(1.0 - ramp.pow(0.5 * shallow))
        self.time_maa_w1 = nn.Parameter(torch.empty(h, MIX_RANK * 5).uniform_(-1e-4, 1e-4))
        self.time_maa_w2 = nn.Parameter(torch.empty(5, MIX_RANK, h).uniform_(-1e-4, 1e-4))
        n = _positions(a) / max(a - 1, 1)  # 0 .. 1 over the attention channels
        self.time_decay = nn.Parameter((-6 + 5 * n.pow(0.7 + 1.3 * depth)).view(1, 1, a))
        self.time_decay_w1 = nn.Parameter(torch.empty(h, DECAY_RANK).uniform_(-1e-4, 1e-4))
        self.time_decay_w2 = nn.Parameter(torch.empty(DECAY_RANK, a).uniform_(-1e-4, 1e-4))
        zigzag = ((_positions(a) + 1) % 3 - 1) * 0.1
        bonus = depth * (1 - n) + zigzag
        self.time_faaaa = nn.Parameter(bonus.view(self.heads, self.head_size))
        self.receptance = nn.Linear(h, a, bias=False)
        self.key = nn.Linear(h, a, bias=False)
        self.value = nn.Linear(h, a, bias=False)
        self.output = nn.Linear(a, h, bias=False)
        self.gate = nn.Linear(h, a, bias=False)
        self.ln_x = nn.GroupNorm(self.heads, a, eps=1e-5 * 8**2)

    def forward(self, x: torch.Tensor, previous=None, wkv_state=None):
        """`x (B, T, h)` -> `(out, last token of x, WKV state)`."""
        b, t, _ = x.shape
        delta = shift(x, previous) - x
        mixes = torch.tanh((x + delta * self.time_maa_x) @ self.time_maa_w1)
        mixes = torch.einsum("btfr,frc->fbtc", mixes.view(b, t, 5, MIX_RANK), self.time_maa_w2)
        base = (self.time_maa_w, self.time_maa_k, self.time_maa_v, self.time_maa_r, self.time_maa_g)
        xw, xk, xv, xr, xg = (x + delta * (m0 + m) for m0, m in zip(base, mixes, strict=True))
        heads = (b, t, self.heads, self.head_size)
        r = self.receptance(xr).view(heads)
        k = self.key(xk).view(heads)
        v = self.value(xv).view(heads)
        g = F.silu(self.gate(xg))
        decay = self.time_decay + torch.tanh(xw @ self.time_decay_w1) @ self.time_decay_w2
        # the decay in at least fp32 (as GPT-NeoX's kernel takes it), whatever the weights' dtype
        log_decay = -torch.exp(decay.to(torch.promote_types(decay.dtype, torch.float32)))
        log_decay = log_decay.view(heads)
        y, wkv_state = wkv6(r, k, v, log_decay, self.time_faaaa, wkv_state)
        y = self.ln_x(y.reshape(b * t, -1)).view(b, t, -1)
        return self.output(y * g), x[:, -1], wkv_state


class ChannelMix(nn.Module):
    def __init__(self, args: ModelArgs, layer_index: int):
        super().__init__()
        h = args.hidden_size
        _, _, f = rwkv_widths(args)
        shallow = 1.0 - layer_index / args.num_layers
        ramp = (_positions(h) / h).view(1, 1, h)
        self.time_maa_k = nn.Parameter(1.0 - ramp.pow(shallow))
        self.time_maa_r = nn.Parameter(1.0 - ramp.pow(shallow))
        self.key = nn.Linear(h, f, bias=False)
        self.receptance = nn.Linear(h, h, bias=False)
        self.value = nn.Linear(f, h, bias=False)

    def forward(self, x: torch.Tensor, previous=None):
        """`x (B, T, h)` -> `(out, last token of x)`."""
        delta = shift(x, previous) - x
        k = torch.relu(self.key(x + delta * self.time_maa_k)).square()
        out = torch.sigmoid(self.receptance(x + delta * self.time_maa_r)) * self.value(k)
        return out, x[:, -1]


class RWKVTransformerLayer(nn.Module):
    """One RWKV-6 layer in a transformer layer's place (module docstring)."""

    def __init__(self, args: ModelArgs, layer_index: int, tp_group=None, ep_group=None):
        super().__init__()
        self.layer_index = layer_index
        self.ln1 = nn.LayerNorm(args.hidden_size)
        self.ln2 = nn.LayerNorm(args.hidden_size)
        self.att = TimeMix(args, layer_index)
        self.ffn = ChannelMix(args, layer_index)

    def forward_with_state(self, x: torch.Tensor, state=None):
        """`x (B, T, h)` from `state` (None: the start of a sequence) -> `(out, state after
        x)`; the state is `(att's previous token, WKV state, ffn's previous token)`."""
        att_prev, wkv_state, ffn_prev = state if state is not None else (None, None, None)
        if self.layer_index == 0:
            x = self.ln1(x)
        att, att_prev, wkv_state = self.att(self.ln1(x), att_prev, wkv_state)
        x = x + att
        ffn, ffn_prev = self.ffn(self.ln2(x), ffn_prev)
        return x + ffn, (att_prev, wkv_state, ffn_prev)

    def forward(self, inputs: tuple[torch.Tensor, torch.Tensor]):
        x, position_ids = inputs
        out, _ = self.forward_with_state(x.transpose(0, 1))
        return out.transpose(0, 1).contiguous(), position_ids
