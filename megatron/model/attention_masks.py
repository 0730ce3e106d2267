"""Score masks and biases built once per forward and shared by the attention layers.

A bias that depends only on the positions (ALiBi's, T5's buckets, the sliding window's mask) is
the same in every layer of a forward. Built per layer it costs a sequence × sequence tensor per
layer, allocated in the forward and, where the attention kernel saves its mask, kept until the
backward: at micro batch 2, sequence 2048 and 12 heads, 200 MB per layer in bf16. Built once,
the layers share one tensor (autograd saves the same storage in each).

- `blocked_keys`: the `(sq, sk)` bool causal/window mask (True = blocked).
- `additive_mask`: the same as an additive `(sq, sk)` score mask in the compute dtype (0 or
  the dtype's lowest value), cached by its arguments (a pure function of them).
- `clear_masks()` drops both kinds.
- `PER_FORWARD.get(position_ids, key, build)`: a tensor derived from one forward's
  `position_ids`, built on first use within the forward and reused by the later layers. A
  pipeline stage that does not hold the embedding builds it in its first layer like any other.
  The entries are dropped when a call brings other position ids (another micro-batch, or the
  copies activation checkpointing recomputes with, which rebuild once per checkpointed run).
"""

from __future__ import annotations

import functools
import weakref

import torch


def blocked_keys(sq: int, sk: int, window: int | None, device=None) -> torch.Tensor:
    """`(sq, sk)` bool, True where query `i` may not see key `j`: the queries are the last `sq`
    of the `sk` positions; a key after the query, or more than `window` before it, is blocked."""
    distance = (torch.arange(sq, device=device) + (sk - sq))[:, None] - torch.arange(
        sk, device=device
    )
    blocked = distance < 0
    return blocked if window is None else blocked | (distance > window)


def additive_mask(sq: int, sk: int, window: int | None, device, dtype) -> torch.Tensor:
    """`(sq, sk)` in `dtype`: 0 where query `i` sees key `j`, the lowest value elsewhere (an
    SDPA `attn_mask`); one tensor for every layer (not to be written in place)."""
    if torch.compiler.is_compiling():  # the compiler builds it inside its graph
        return _additive_mask(sq, sk, window, torch.device(device), dtype)
    return _cached_additive_mask(sq, sk, window, torch.device(device), dtype)


def _additive_mask(sq, sk, window, device, dtype) -> torch.Tensor:
    mask = torch.zeros(sq, sk, dtype=dtype, device=device)
    return mask.masked_fill_(blocked_keys(sq, sk, window, device), torch.finfo(dtype).min)


_cached_additive_mask = functools.lru_cache(maxsize=2)(_additive_mask)  # a run uses one


class PerForward:
    """Tensors derived from one forward's `position_ids` (see the module docstring)."""

    def __init__(self):
        self.clear()

    def clear(self) -> None:
        self._positions, self._version, self._values = None, None, {}

    def _holds(self, position_ids: torch.Tensor) -> bool:
        current = self._positions() if self._positions is not None else None
        return current is position_ids and self._version == position_ids._version

    def get(self, position_ids: torch.Tensor, key: tuple, build):
        """`build()`, or the tensor it gave for these `position_ids` and `key` earlier."""
        if torch.compiler.is_compiling() or position_ids.is_inference():
            return build()  # no version counter to tell an in-place change
        if not self._holds(position_ids):
            self.clear()
            self._positions = weakref.ref(position_ids)
            self._version = position_ids._version
        if key not in self._values:
            self._values[key] = build()
        return self._values[key]


PER_FORWARD = PerForward()


def clear_masks() -> None:
    """Drop every cached mask and bias (a test that watches them being built; a process done
    with a model)."""
    _cached_additive_mask.cache_clear()
    PER_FORWARD.clear()
