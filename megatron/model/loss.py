"""The language-model loss, shared by the pipeline and the plain model.

`loss_fn(logits, (labels, loss_mask), tp_group=...)`: the mean over unmasked tokens of the
vocab-parallel cross entropy. Built models carry it bound to their tensor-parallel group as
`model.loss_fn` (DeepSpeed's pipeline engine calls `module.loss_fn(outputs, labels)`; a plain
training loop calls `model.loss_fn(model(tokens, position_ids), (labels, loss_mask))`).
"""

from __future__ import annotations

import functools

import torch

from megatron.parallel import vocab_parallel_cross_entropy


def loss_fn(logits: torch.Tensor, labels, *, tp_group=None) -> torch.Tensor:
    """Masked mean cross entropy.

    Args:
        logits: `(b, s, V/tp)` this rank's vocabulary slice.
        labels: `(labels, loss_mask)`: int64 `(b, s)` targets and float `(b, s)` weights
            (1 for tokens that count, 0 for padding/document boundaries).
        tp_group: the tensor-parallel group the vocabulary is split over (None: not split).

    Returns:
        fp32 scalar `sum(loss * mask) / sum(mask)` (0 when the mask is all zero).
    """
    targets, loss_mask = labels
    losses = vocab_parallel_cross_entropy(logits, targets, tp_group)  # (b, s) fp32
    mask = loss_mask.reshape(-1).float()
    total = mask.sum()
    return (losses.reshape(-1) * mask).sum() / torch.where(total > 0, total, 1.0)


def bound_loss_fn(tp_group=None):
    """`loss_fn` with its tensor-parallel group bound (keeps `__name__` for DeepSpeed's log)."""
    return functools.update_wrapper(functools.partial(loss_fn, tp_group=tp_group), loss_fn)
