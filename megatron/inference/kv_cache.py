"""Key/value cache for generation: each step runs only the new tokens through the model.

    with kv_cache(model.module) as cache:      # wraps every attention's backend
        logits = model.forward(prompt, positions)          # prefill: fills the cache
        logits = model.forward(next_token, [[len(prompt)]]) # one token, attends to the cache

`CachedAttention` takes the place of a layer's attention backend (`attention.core`, see
`megatron/model/attention_backends.py`): it appends the new keys and values (already rotated
at their own positions by the layer) to the layer's cache and attends over all of them. The
first call of a generation (empty cache) goes through the layer's own backend, so the prompt's
logits are exactly the uncached ones; later calls use `scaled_dot_product_attention` with the
causal mask aligned to the end (new query `i` sees every cached key and the new keys `<= i`),
and with `sliding_window_width` W only the keys at most W positions before it (the cache keeps
every key; the mask is what limits attention to the window).

Encodings that add a score bias computed from the query and key positions (ALiBi, T5's
relative bias) cannot reuse cached keys this way, nor gMLP layers, whose spatial projection
mixes the whole sequence: `supports_kv_cache` says so and generation then recomputes.
"""

from __future__ import annotations

import contextlib

import torch
import torch.nn.functional as F
from torch import nn

from megatron.model.attention import ParallelSelfAttention
from megatron.model.attention_backends import ATTENTION_BACKENDS, blocked_keys

BIASED_POSITIONS = ("alibi", "rpe")


def supports_kv_cache(args) -> bool:
    """False for positional encodings that bias attention scores by query/key distance, and
    for models with layers other than attention layers (`mamba`, `rwkv`, whose recurrent state
    is not a key/value cache, and `gmlp`/`amlp`, whose spatial gating reads the whole
    sequence): generation recomputes."""
    others = set(args.layer_attention_types) - set(ATTENTION_BACKENDS)
    return args.pos_emb not in BIASED_POSITIONS and not others


class KVCache:
    """Keys and values of every layer so far, `(s_past, b, nkv/tp, d)` each."""

    def __init__(self):
        self.layers: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}

    def append(self, layer: int, k: torch.Tensor, v: torch.Tensor):
        """Add the new keys/values of `layer`; return `(past + new keys, past + new values,
        number of past positions)`."""
        if layer in self.layers:
            past_k, past_v = self.layers[layer]
            past = past_k.shape[0]
            k, v = torch.cat((past_k, k)), torch.cat((past_v, v))  # (past + s, b, nkv, d)
        else:
            past = 0
        self.layers[layer] = (k, v)
        return k, v, past

    def reset(self) -> None:
        self.layers.clear()


class CachedAttention(nn.Module):
    """A layer's attention backend, reading and extending the cache."""

    def __init__(self, core: nn.Module, cache: KVCache, layer: int):
        super().__init__()
        self.core = core
        self.cache = cache
        self.layer = layer

    def forward(self, q, k, v, bias=None):
        if bias is not None:
            raise ValueError("the key/value cache cannot reuse position-dependent score biases")
        k, v, past = self.cache.append(self.layer, k, v)
        if past == 0:
            return self.core(q, k, v)
        # (s, b, n, d) -> (b, n, s, d); True = may attend (the new queries are the last keys;
        # a sliding window also blocks keys more than `sliding_window_width` before a query)
        visible = ~blocked_keys(q.shape[0], k.shape[0], self.core.window, q.device)
        out = F.scaled_dot_product_attention(
            q.permute(1, 2, 0, 3),
            k.permute(1, 2, 0, 3),
            v.permute(1, 2, 0, 3),
            attn_mask=visible,
            scale=self.core.scale,
            enable_gqa=q.shape[2] != k.shape[2],
        )
        return out.permute(2, 0, 1, 3)  # (s, b, nq, d)


@contextlib.contextmanager
def kv_cache(module: nn.Module):
    """Install a fresh `KVCache` in every attention of `module`; restore the backends after."""
    cache = KVCache()
    attentions = [m for m in module.modules() if isinstance(m, ParallelSelfAttention)]
    originals = [m.core for m in attentions]
    for index, (attention, core) in enumerate(zip(attentions, originals)):
        attention.core = CachedAttention(core, cache, index)
    try:
        yield cache
    finally:
        for attention, core in zip(attentions, originals):
            attention.core = core
