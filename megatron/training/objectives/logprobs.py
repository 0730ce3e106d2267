"""Per-sequence log-probabilities from vocab-parallel logits, shared by the preference objectives.

A sequence's log-probability is the sum over its label tokens (loss mask 1) of the per-token
log-probability `-vocab_parallel_cross_entropy(logits, labels)`, as GPT-NeoX's `get_logp`
computes it; the vocabulary may be split over the tensor-parallel group, and its padding
columns are masked out (`vocab_size`, the true vocabulary), so a log-probability is the same
whatever the padding and matches `generate.py`'s precomputed ones. Reference
log-probabilities either come from a reference model's logits through the same function or
from the sample (`ref`, `pos_ref`, `neg_ref`: float per-token values aligned with the text,
of which the last is dropped exactly as the last token is).

With `loss_chunk_tokens` > 0 the model hands over the head's inputs `(hidden (s, b, h), the
weight by reference)` instead of logits (`megatron/model/head.py`); `sequence_logps` then takes the
per-token log-probabilities from `linear_log_probs`, a chunk of tokens at a time, without the
logits (its backward recomputes each chunk's logits).
"""

from __future__ import annotations

import torch

from megatron.config.groups.model import LOSS_CHUNK_TOKENS_MAX
from megatron.model.head import head_weight
from megatron.parallel import vocab_parallel_cross_entropy
from megatron.parallel.chunked_cross_entropy import linear_log_probs


def sequence_logps(
    logits,
    labels,
    loss_mask,
    tp_group=None,
    fp32: bool = True,
    vocab_size: int | None = None,
    consume: bool = False,
    chunk_tokens: int = LOSS_CHUNK_TOKENS_MAX,
) -> torch.Tensor:
    """`(b,)` sum over masked tokens of log p(label) under `(b, s, V/tp)` logits, in fp32
    (fp64 for fp64 logits), over the first `vocab_size` columns (None: all).

    `fp32: false` keeps the per-token values and their sum in the logits' dtype (GPT-NeoX's
    `dpo_fp32`/`kto_fp32` off); the cross entropy itself always runs in fp32 here. `consume`:
    nothing reads the logits after this call, so their memory takes the softmax and then the
    gradient (`vocab_parallel_cross_entropy`'s `consume_logits`), not a new logits-sized
    buffer: the objectives' training losses, which the engines hand the model's output.
    `logits` may instead be the head's inputs `(hidden (s, b, h), weight (V/tp, h) by
    reference)` (module docstring), taken `chunk_tokens` tokens at a time."""
    if isinstance(logits, tuple):
        hidden, weight_reference = logits
        dtype = hidden.dtype
        token_logps = linear_log_probs(
            hidden.reshape(-1, hidden.shape[-1]),  # (s*b, h)
            head_weight(weight_reference),
            labels.t().reshape(-1),
            tp_group=tp_group,
            vocab_size=vocab_size,
            chunk_tokens=chunk_tokens,
        )
        token_logps = token_logps.view(labels.shape[1], labels.shape[0]).t()  # (b, s)
    else:
        dtype = logits.dtype
        token_logps = -vocab_parallel_cross_entropy(
            logits, labels, tp_group, vocab_size=vocab_size, consume_logits=consume
        )
    mask = loss_mask.to(token_logps.dtype)
    if not fp32:
        token_logps, mask = token_logps.to(dtype), mask.to(dtype)
    total = (token_logps * mask).sum(-1)
    return total.to(torch.promote_types(total.dtype, torch.float32))


def stored_sequence_logps(ref: torch.Tensor, loss_mask: torch.Tensor) -> torch.Tensor:
    """`(b,)` sum over masked tokens of a sample's per-token reference values `(b, s + 1)`."""
    per_token = torch.as_tensor(ref).float()[:, :-1]  # (b, s): the value at the input token
    return (per_token * loss_mask.float()).sum(-1)


def require_keys(sample: dict, keys: tuple[str, ...], why: str) -> None:
    missing = [k for k in keys if k not in sample]
    if missing:
        raise ValueError(
            f"{why}: the samples lack {missing} (they hold {sorted(sample)}); check the "
            "dataset paths of the config"
        )


def objective_logps(objective, logits, labels, loss_mask, *, consume: bool = False):
    """`sequence_logps` with a DPO/KTO objective's own settings: its tensor-parallel group,
    fp32 choice, true vocabulary and chunk size."""
    return sequence_logps(
        logits,
        labels,
        loss_mask,
        objective.tp_group,
        objective.fp32,
        objective.vocab_size,
        consume=consume,
        chunk_tokens=objective.chunk_tokens,
    )
