"""Cross entropy over vocab-parallel logits, without gathering the full vocabulary.

Rank r holds the logits of vocabulary rows `[r*V/tp, (r+1)*V/tp)` (the output of a
column-parallel head without `gather_output`). The loss needs only three numbers per token
from the other ranks: the global max (for a stable softmax), the sum of exponentials and the
target's logit. So the forward costs one max all-reduce and one small sum all-reduce of shape
`(3, tokens)`, instead of an all-gather of `(tokens, V)` logits.

Per token, with `z` the shifted logits, `lse = log(sum exp z)` and smoothing `eps`, this equals
`torch.nn.functional.cross_entropy(logits, target, reduction="none", label_smoothing=eps)`:

    loss = (1 - eps) * (lse - z[target]) + eps * (lse - mean(z))

Targets must be token ids (below the true vocabulary, see below); masking unwanted tokens out
of the loss is the caller's job (multiply the per-token loss by a loss mask).

Vocabulary padding: with `vocab_size` (the tokenizer's, below the padded `V`), the logit
columns from it on are no tokens. They are masked out (`-inf` before the softmax), so the loss
is the true vocabulary's whatever the padding (the same at tp 1 and tp 2, where the padding
differs), label smoothing averages over the true vocabulary, and their gradient is exactly
zero. Only the rank(s) holding padding columns (the last one, in practice) mask anything,
from host integers: no extra collective or synchronisation. GPT-NeoX lets the padding columns
take probability mass; this departs from it on purpose.

The same function serves tp 1 (`tp_group` None: the collectives are no-ops). It is also the
cheapest there: it allocates one logits-sized buffer (the shifted logits, turned into the softmax
in place and then into the gradient in place), where `F.cross_entropy` on the token columns
writes the log-softmax, a zero-filled NLL gradient, the log-softmax gradient and the
zero-filled gradient of the slice: four buffers of `tokens × V` floats whose passes, at a 50k
vocabulary, cost more than the output head's matrix multiply on a CPU.
"""

from __future__ import annotations

import torch

from megatron.parallel.comm import all_reduce, group_rank, group_size


def token_columns(vocab_per_rank: int, tp_group=None, vocab_size: int | None = None) -> int:
    """How many of this rank's `vocab_per_rank` logit columns are tokens (the first ones; the
    rest are padding): all of them when `vocab_size` (the true vocabulary) is None."""
    if vocab_size is None:
        return vocab_per_rank
    start = group_rank(tp_group) * vocab_per_rank
    return min(vocab_per_rank, max(0, vocab_size - start))


def mask_padding(logits: torch.Tensor, tp_group=None, vocab_size: int | None = None):
    """This rank's vocabulary slice `(..., V/tp)` with the padding columns at -inf: `logits`
    itself when the slice holds none, else a new tensor (whose gradient there is zero)."""
    real = token_columns(logits.shape[-1], tp_group, vocab_size)
    if real == logits.shape[-1]:
        return logits
    padding = torch.arange(logits.shape[-1], device=logits.device) >= real
    return logits.masked_fill(padding, float("-inf"))


class _VocabParallelCrossEntropy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, logits, target, group, label_smoothing, true_vocab=None):
        vocab_per_rank = logits.shape[-1]
        vocab_size = true_vocab or vocab_per_rank * group_size(group)
        start = group_rank(group) * vocab_per_rank
        real = token_columns(vocab_per_rank, group, true_vocab)  # the rest is padding
        # fp32 at least (bf16/fp16 logits are upcast; fp64 stays fp64).
        dtype = torch.promote_types(logits.dtype, torch.float32)
        z = logits.to(dtype).reshape(-1, vocab_per_rank)  # (tokens, V/tp)
        own_copy = z.data_ptr() != logits.data_ptr()  # an upcast is ours to overwrite
        flat_target = target.reshape(-1)  # (tokens,)

        # Subtract the global max of the tokens' logits for a stable exp (a copy: the caller's
        # logits stay intact). A padding logit far above them must not set the shift.
        if real:
            local_max = z[:, :real].max(dim=-1).values
        else:  # only padding here
            local_max = z.new_full(z.shape[:1], float("-inf"))
        all_reduce(local_max, group, op="max")
        z = z.sub_(local_max.unsqueeze(-1)) if own_copy else z - local_max.unsqueeze(-1)
        if real < vocab_per_rank:
            z[:, real:] = float("-inf")  # exp() -> 0: padding takes no probability

        outside = (flat_target < start) | (flat_target >= start + vocab_per_rank)
        local_target = (flat_target - start).masked_fill(outside, 0)
        target_logit = z.gather(-1, local_target.unsqueeze(-1)).squeeze(-1)
        target_logit = target_logit.masked_fill(outside, 0.0)

        sums = [target_logit]
        if label_smoothing:
            sums.append(z[:, :real].sum(dim=-1))
        exp_z = z.exp_()  # z is our own copy; it becomes the softmax buffer
        sums.insert(1, exp_z.sum(dim=-1))
        # One all-reduce for the per-token sums (target logit, sum exp[, sum z]): (2|3, tokens).
        sums = all_reduce(torch.stack(sums), group)
        lse = sums[1].log()
        loss = lse - sums[0]
        if label_smoothing:
            loss = (1.0 - label_smoothing) * loss + label_smoothing * (lse - sums[2] / vocab_size)

        softmax = exp_z.div_(sums[1].unsqueeze(-1))  # (tokens, V/tp), reused as the gradient
        ctx.save_for_backward(softmax, local_target, outside)
        ctx.label_smoothing = label_smoothing
        ctx.vocab_size = vocab_size
        ctx.real = real
        ctx.input_shape = logits.shape
        ctx.input_dtype = logits.dtype
        ctx.backward_done = False
        return loss.view(target.shape)

    @staticmethod
    def backward(ctx, grad_loss):
        if ctx.backward_done:
            raise RuntimeError(
                "vocab_parallel_cross_entropy reuses its saved softmax as the gradient buffer, "
                "so it supports one backward per forward (no retain_graph double backward)"
            )
        ctx.backward_done = True
        softmax, local_target, outside = ctx.saved_tensors
        eps = ctx.label_smoothing
        # d loss / d z = softmax - (1 - eps) * onehot(target) - eps / V, computed in place
        # (V the true vocabulary; padding columns keep their softmax, 0: no gradient).
        grad = softmax
        rows = torch.arange(grad.shape[0], device=grad.device)
        inside = (~outside).to(grad.dtype)
        grad[rows, local_target] -= (1.0 - eps) * inside
        if eps:
            grad[:, : ctx.real] -= eps / ctx.vocab_size
        grad.mul_(grad_loss.reshape(-1, 1).to(grad.dtype))
        return grad.view(ctx.input_shape).to(ctx.input_dtype), None, None, None, None


def vocab_parallel_cross_entropy(
    logits_parallel: torch.Tensor,
    target: torch.Tensor,
    tp_group=None,
    label_smoothing: float = 0.0,
    vocab_size: int | None = None,
) -> torch.Tensor:
    """Per-token cross entropy of vocab-sharded logits.

    Args:
        logits_parallel: `(..., V/tp)` this rank's vocabulary slice of the logits (any float
            dtype; the math runs in fp32, or fp64 for fp64 input, and the gradient comes back
            in the input dtype).
        target: `(...)` integer token ids below `vocab_size`, identical on every tp rank.
        tp_group: the tensor-parallel group; `None` means the logits hold the full vocabulary.
        label_smoothing: in `[0, 1)`, with `torch.nn.functional.cross_entropy`'s meaning.
        vocab_size: the true vocabulary (the tokenizer's); the logit columns from it up to the
            padded `V` are masked out (see the module docstring). None: no padding.

    Returns:
        `(...)` loss per token (no reduction), fp32 (fp64 for fp64 logits).
    """
    if target.shape != logits_parallel.shape[:-1]:
        raise ValueError(
            f"vocab_parallel_cross_entropy: target shape {tuple(target.shape)} must equal the "
            f"logits shape without its vocab dim, {tuple(logits_parallel.shape[:-1])}"
        )
    if not 0.0 <= label_smoothing < 1.0:
        raise ValueError(f"label_smoothing must be in [0, 1), got {label_smoothing}")
    padded = logits_parallel.shape[-1] * group_size(tp_group)
    if vocab_size is not None and not 0 < vocab_size <= padded:
        raise ValueError(
            f"vocab_size {vocab_size} (the true vocabulary) must be in 1..{padded}, the "
            "padded vocabulary of the logits"
        )
    true_vocab = vocab_size if vocab_size is not None and vocab_size < padded else None
    return _VocabParallelCrossEntropy.apply(
        logits_parallel, target, tp_group, float(label_smoothing), true_vocab
    )
