"""The language-model loss, shared by the pipeline and the plain model.

`loss_fn(logits, (labels, loss_mask), tp_group=..., z_loss=..., vocab_size=...)`: the mean over
unmasked tokens of the vocab-parallel cross entropy, plus, with `z_loss` > 0, PaLM's z-loss: the
coefficient times the mean over the same tokens of `logsumexp(logits)²` (it pulls the softmax
normaliser towards 1 without changing the probabilities). Both run over the true vocabulary
(`vocab_size`, the tokenizer's): the padding columns of the logits are masked out
(`megatron/parallel/cross_entropy.py`). Built models carry it bound to their tensor-parallel
group, the config's `z_loss` and `true_vocab_size` as `model.loss_fn` (DeepSpeed's pipeline engine
calls `module.loss_fn(outputs, labels)`; a plain training loop calls
`model.loss_fn(model(tokens, position_ids), (labels, loss_mask))`), so the loss a run reports
includes the z-loss term.

With the config's `loss_chunk_tokens` > 0 the model's output is not logits but the head's
inputs, `(hidden (s, b, h), the weight (V/tp, h) by reference)` (`megatron/model/head.py`),
and `loss_fn` computes the same loss from them a chunk of tokens at a time
(`linear_cross_entropy`), never holding the tokens × vocabulary logits: same cross entropy
over the true vocabulary, same z-loss, same loss-mask average. The type of the output says
which path a call takes; the model's heads decide it from `loss_chunk_tokens`, once, when it is
built.

GPT-NeoX's `z_loss` key exists only for its reward-model objective (`train_impl: rm`), where it
squares the rewards; for language-model training it has no effect there. Here the key is the
PaLM term on the output logits described above, and GPT-NeoX's reward penalty for
`train_impl: rm` (`megatron/training/objectives/rm.py` defines it).
"""

from __future__ import annotations

import functools

import torch

from megatron.config.groups.model import LOSS_CHUNK_TOKENS_MAX
from megatron.model.head import head_weight
from megatron.parallel import vocab_parallel_cross_entropy
from megatron.parallel.chunked_cross_entropy import linear_cross_entropy


def _masked_mean(values: torch.Tensor, loss_mask: torch.Tensor) -> torch.Tensor:
    mask = loss_mask.reshape(-1).float()
    total = mask.sum()
    return (values.reshape(-1) * mask).sum() / torch.where(total > 0, total, 1.0)


def _fused_loss(
    head_inputs, targets, loss_mask, *, tp_group, z_loss, vocab_size, chunk_tokens
) -> torch.Tensor:
    """`loss_fn` from the head's inputs (module docstring), chunk by chunk."""
    hidden, weight_reference = head_inputs  # (s, b, h), the (V/tp, h) weight by reference
    # Tokens in the hidden states' (s, b) order: the labels are small, the hidden states not.
    flat_hidden = hidden.reshape(-1, hidden.shape[-1])  # (s*b, h)
    mask = loss_mask.t().reshape(-1).float()  # (s*b,)
    total = mask.sum()
    weights = mask / torch.where(total > 0, total, 1.0)
    return linear_cross_entropy(
        flat_hidden,
        head_weight(weight_reference),
        targets.t().reshape(-1),
        weights,
        z_weights=z_loss * weights if z_loss else None,
        tp_group=tp_group,
        vocab_size=vocab_size,
        chunk_tokens=chunk_tokens,
    )


def loss_fn(
    logits,
    labels,
    *,
    tp_group=None,
    z_loss: float = 0.0,
    vocab_size: int | None = None,
    consume: bool = False,
    chunk_tokens: int = LOSS_CHUNK_TOKENS_MAX,
) -> torch.Tensor:
    """Masked mean cross entropy (plus the z-loss term when `z_loss` > 0).

    Args:
        logits: `(b, s, V/tp)` this rank's vocabulary slice; or the head's inputs
            `(hidden (s, b, h), weight (V/tp, h))` (a tuple), which take the fused path a chunk
            of `chunk_tokens` tokens at a time (module docstring).
        labels: `(labels, loss_mask)`: int64 `(b, s)` targets and float `(b, s)` weights
            (1 for tokens that count, 0 for padding/document boundaries).
        tp_group: the tensor-parallel group the vocabulary is split over (None: not split).
        z_loss: coefficient of `mean(logsumexp(logits)²)` over the same tokens.
        vocab_size: the true vocabulary; logit columns from it on are padding, masked out
            (None: no padding).
        consume: the logits are used by nothing after the loss (their memory then holds the
            softmax and its gradient; see `vocab_parallel_cross_entropy`'s `consume_logits`).
        chunk_tokens: tokens per chunk of the fused path.

    Returns:
        fp32 scalar `sum(loss * mask) / sum(mask)` (0 when the mask is all zero).
    """
    targets, loss_mask = labels
    if isinstance(logits, tuple):
        return _fused_loss(
            logits,
            targets,
            loss_mask,
            tp_group=tp_group,
            z_loss=z_loss,
            vocab_size=vocab_size,
            chunk_tokens=chunk_tokens,
        )
    # The z-loss takes the logsumexp the cross entropy computes (no second pass over the
    # logits, no fp32 copy of them), so the logits stay this call's alone to consume.
    losses, lse = vocab_parallel_cross_entropy(
        logits,
        targets,
        tp_group,
        vocab_size=vocab_size,
        consume_logits=consume,
        return_logsumexp=True,
    )
    loss = _masked_mean(losses, loss_mask)  # fp32
    if z_loss:
        loss = loss + z_loss * _masked_mean(lse.square(), loss_mask)
    return loss


def bound_loss_fn(
    tp_group=None,
    z_loss: float = 0.0,
    vocab_size: int | None = None,
    chunk_tokens: int = LOSS_CHUNK_TOKENS_MAX,
):
    """`loss_fn` with its tensor-parallel group, z-loss coefficient, true vocabulary and fused
    chunk size bound (keeps `__name__` for DeepSpeed's log). It consumes the logits, as the
    engines hand them over: `model.loss_fn(model(tokens, positions), labels)`; keep a `clone()`
    to read them after."""
    bound = functools.partial(
        loss_fn,
        tp_group=tp_group,
        z_loss=z_loss,
        vocab_size=vocab_size,
        consume=True,
        chunk_tokens=chunk_tokens or LOSS_CHUNK_TOKENS_MAX,
    )
    return functools.update_wrapper(bound, loss_fn)
