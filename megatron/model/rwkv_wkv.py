"""RWKV-6's WKV recurrence in PyTorch, computed chunk by chunk (any device, any dtype).

Per head, with receptance r_t, key k_t, log-decay w_t <= 0 (all of the key width K), value
v_t (width V), bonus u (K) and a K × V state S (zero before the first token):

    y_t = r_t · (S_{t-1} + diag(u) k_t v_tᵀ)
    S_t = diag(exp(w_t)) S_{t-1} + k_t v_tᵀ

(GPT-NeoX's `megatron/model/rwkv/v6` CUDA kernel computes the same, with w = -exp(decay).)

Run token by token this is a loop of T small updates. Here the sequence is cut into chunks of
`chunk` tokens: inside a chunk every pair (t, s < t) is summed at once with the decay between
them, exp(W_{t-1} - W_s) where W is the chunk's running sum of w; the state carries the rest
from one chunk to the next, so only T / chunk steps run in order. Every exponent is a sum of
w <= 0 over a stretch of tokens, never its negative, so nothing overflows however strong the
decay. The arithmetic is at least fp32 (as the CUDA kernel's; fp64 inputs stay fp64), and the
output takes the inputs' dtype.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

DEFAULT_CHUNK = 16
"""Tokens per chunk: the pairwise sum inside a chunk holds (chunk × chunk × K) per head."""


def wkv6(
    r: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    w: torch.Tensor,
    u: torch.Tensor,
    state: torch.Tensor | None = None,
    chunk: int = DEFAULT_CHUNK,
) -> tuple[torch.Tensor, torch.Tensor]:
    """`(y, final_state)` of the recurrence in the module docstring.

    r, k, w: `(B, T, H, K)`; v: `(B, T, H, V)`; u: `(H, K)`; state: `(B, H, K, V)` or None
    (zero). y is `(B, T, H, V)` in r's dtype, the final state `(B, H, K, V)` in the dtype of
    the arithmetic.
    """
    dtype = r.dtype
    exact = torch.promote_types(dtype, torch.float32)
    b, t, h, kd = r.shape
    vd = v.shape[-1]
    r, k, v, w, u = (x.to(exact) for x in (r, k, v, w, u))
    state = r.new_zeros(b, h, kd, vd) if state is None else state.to(exact)
    pad = (-t) % chunk
    if pad:  # padded tokens: no key, no value, decay 1; they leave the state unchanged
        r, k, v, w = (F.pad(x, (0, 0, 0, 0, 0, pad)) for x in (r, k, v, w))
    n = (t + pad) // chunk
    # (B, T, H, D) -> (B, H, N, L, D)
    r, k, v, w = (x.view(b, n, chunk, h, -1).permute(0, 3, 1, 2, 4) for x in (r, k, v, w))
    cum = w.cumsum(dim=3)  # W_t: decay logs summed over the chunk up to and including t
    before = cum - w  # W_{t-1}
    # Pairs inside a chunk: A[t, s] = sum_i r_t,i k_s,i exp(W_{t-1},i - W_s,i) for s < t.
    causal = torch.ones(chunk, chunk, dtype=torch.bool, device=r.device).tril(-1)
    exponent = before.unsqueeze(-2) - cum.unsqueeze(-3)  # (B, H, N, L_t, L_s, K)
    exponent = exponent.masked_fill(~causal[..., None], float("-inf"))
    pairs = torch.einsum("bhntk,bhnsk,bhntsk->bhnts", r, k, exponent.exp())
    bonus = torch.einsum("bhntk,hk,bhntk->bhnt", r, u, k)  # s == t: the bonus u
    pairs = pairs + torch.diag_embed(bonus)
    y = pairs @ v  # (B, H, N, L, V)
    # Between chunks: what the state holds at a chunk's start, decayed to each token.
    r_decayed = r * before.exp()
    k_to_end = k * (cum[..., -1:, :] - cum).exp()  # each key decayed to the chunk's end
    chunk_decay = cum[..., -1, :].exp()  # (B, H, N, K)
    outputs = []
    for i in range(n):
        outputs.append(r_decayed[:, :, i] @ state)
        state = (
            chunk_decay[:, :, i, :, None] * state + k_to_end[:, :, i].transpose(-1, -2) @ v[:, :, i]
        )
    y = y + torch.stack(outputs, dim=2)
    y = y.permute(0, 2, 3, 1, 4).reshape(b, n * chunk, h, vd)[:, :t]
    return y.to(dtype), state
