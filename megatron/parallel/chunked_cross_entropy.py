"""The output head and the language-model loss in one pass, a chunk of tokens at a time.

`linear_cross_entropy(hidden, weight, target, token_weights, ...)` is the scalar

    sum_t token_weights[t] * CE(hidden[t] @ weight.T, target[t])
        + sum_t z_weights[t] * logsumexp(hidden[t] @ weight.T)²

without a `(tokens, V/tp)` logits tensor: for each chunk of `chunk_tokens` tokens it computes
the chunk's logits (this rank's vocabulary shard, as the column-parallel head writes them), one
max all-reduce (the global max) and one sum all-reduce (target logit, sum of exponentials and,
for label smoothing, the sum of the logits) over the tensor-parallel group, the chunk's loss
and at once the chunk's gradient of the logits, which two matrix multiplies turn into its rows
of the hidden states' gradient and its term of the head weight's gradient. Then the chunk's
logits are dropped. The largest temporaries are one chunk of logits (in the weight's dtype),
its fp32 copy and its gradient.

The cross entropy is `vocab_parallel_cross_entropy`'s (`cross_entropy.py`): label smoothing with
`torch.nn.functional.cross_entropy`'s meaning, the padding columns from the true vocabulary
`vocab_size` on left out (no probability, exactly zero gradient). The z-loss is PaLM's,
`lse²`, per token, here weighted by `z_weights` (the language-model loss passes
`z_loss × mask / sum(mask)`, `megatron/model/loss.py`).

Why the gradients are computed in the forward (as Liger's fused linear cross entropy does)
rather than recomputed in the backward: the output is the final scalar loss, a weighted sum
whose weights are known in the forward, so its gradient with respect to every token's logits is
known there too, up to the one scalar that flows back (1, or a gradient accumulation factor),
which the backward multiplies in. Recomputing the logits in the backward would cost a fourth
head matrix multiply (4 instead of the unfused head's 3, a third more head FLOPs, and the head is
about a quarter of a 160M model's); this way the head's FLOPs are exactly the unfused head's
(`megatron/training/metrics/flops.py` counts the same work for both). The price: the hidden
states' gradient `(tokens, h)` (in their dtype; fp32 in fp16, below) and the weight's
`(V/tp, h)` (fp32 for lower-precision weights) are held from the forward to the backward, far
less than the logits: at 16k tokens of h = 4096 an fp32 hidden states' gradient is 268 MB
(134 MB more than an fp16 one), against 3.3 GB of fp32 logits at a 50k vocabulary and 206 MB
for one 1024-token chunk's.
A forward without gradients (evaluation; `torch.no_grad`) computes the loss alone.

fp16: the logits' gradient is made in the forward, before the scalar that flows back (in
fp16 DeepSpeed's dynamic loss scale) arrives. A token's is its weight times (softmax -
onehot), about `1/tokens × p`: at a mean over 16k tokens and a 50k vocabulary some 2^-14 ×
2^-16, far below fp16's normal range (2^-14). So, in fp16 alone, each chunk's fp32 gradient
is multiplied by the power of two that puts its largest magnitude in [0.5, 1) (from the
exponent of its amax, `torch.frexp`, on the device: no host read) before the cast, the two
matrix multiplies run in fp16 (a GPU's fast path) on the lifted values, and their products
are unscaled into the fp32 gradients. Both stay fp32 until the backward multiplies in the
upstream scalar and only then are cast to the hidden states' and the weight's dtype: a loss
scale too large for fp16 gives inf there, as the unfused head's fp16 gradients would, and
DeepSpeed's scaler skips the step and lowers the scale. The lifted values are below 1, so a
product overflows only where a sum of |gradient| × |entry| passes fp16's 65504: for the cross
entropy a token's row sums to at most 2 (the softmax and the target), times the weight's
largest entry, for the hidden states; a vocabulary column over a chunk to at most
`chunk_tokens`, times the hidden states' largest entry, for the weight (1024 × 64 would reach
it). The unfused fp16 head's weight gradient, one fp16 matmul over the whole micro-batch at the
loss scale, has the same kind of bound, over more tokens. An inf there also reaches the
scaler, which then skips the step.
bf16 has fp32's exponent range: neither lifted nor held in fp32 (the hidden states' gradient
is the bf16 matmul's output, the weight's summed in fp32), as before.

Tensor parallelism: `hidden` must be the full hidden states every rank of the group holds (the
caller enters the tensor-parallel region as `ColumnParallelLinear` does: copy, whose backward
all-reduces the hidden states' gradient, or the sequence-parallel all-gather, whose backward
reduce-scatters it); the gradient returned here is this rank's vocabulary shard's part. The
weight's gradient is this rank's shard's whole gradient.
"""

from __future__ import annotations

import torch

from megatron.parallel.comm import all_reduce, group_rank, group_size
from megatron.parallel.cross_entropy import token_columns


def _chunk_loss(
    logits: torch.Tensor, target, group, start: int, real: int, vocab_size: int, eps: float
):
    """Per-token loss and logsumexp of one chunk of logits `(c, V/tp)`, and its softmax
    written over the chunk's fp32 copy (padding columns 0): `(loss, lse, softmax, local,
    inside)`, `local` the target's column on this rank where `inside`."""
    x = logits.to(torch.promote_types(logits.dtype, torch.float32))  # (c, V/tp), fp32 at least
    tokens = x[:, :real]
    inside = (target >= start) & (target < start + logits.shape[-1])
    local = (target - start).masked_fill(~inside, 0)
    target_logit = x.gather(-1, local.unsqueeze(-1)).squeeze(-1).masked_fill(~inside, 0.0)
    sums = [target_logit]
    if eps:
        sums.append(tokens.sum(dim=-1))
    # One max all-reduce: the global max M over the true vocabulary.
    if real:
        local_max = tokens.max(dim=-1).values
    else:  # a rank whose columns are all padding
        local_max = x.new_full((x.shape[0],), float("-inf"))
    shift = all_reduce(local_max, group, op="max")  # (c,)
    x[:, real:] = 0.0
    torch.sub(tokens, shift.unsqueeze(-1), out=tokens).exp_()
    sums.append(tokens.sum(dim=-1))
    # One sum all-reduce: (target logit[, sum x], sum exp(x - M)), (2|3, c).
    sums = all_reduce(torch.stack(sums), group)
    log_sum = sums[-1].log()
    lse = shift + log_sum
    loss = lse - sums[0]
    if eps:
        loss = (1.0 - eps) * loss + eps * (lse - sums[1] / vocab_size)
    tokens.div_(sums[-1].unsqueeze(-1))  # the softmax over the true vocabulary
    return loss, lse, x, local, inside


def _lift(grad: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """`grad` (fp32) times the power of two that puts its largest magnitude in [0.5, 1), in
    place, and the inverse power (a 0-dim fp32 tensor): computed on the device from the
    exponent of the max (`torch.frexp`), no host read. In fp16 the lifted values keep 11
    significant bits down to 2^-14 of the max and subnormals to 2^-24, where the unlifted ones
    (token weight ~1/tokens times a probability) would have fallen below fp16's range. An
    all-zero chunk (every token weight 0) is left as it is; a non-finite one stays non-finite.
    """
    _, exponent = torch.frexp(torch.linalg.vector_norm(grad, float("inf")))
    exponent = exponent.to(grad.dtype)
    return grad.mul_(torch.exp2(-exponent)), torch.exp2(exponent)


class _LinearCrossEntropy(torch.autograd.Function):
    @staticmethod
    def forward(
        ctx, hidden, weight, target, token_weights, z_weights, group, eps, vocab_size, chunk, grad
    ):
        vocab_per_rank = weight.shape[0]
        start = group_rank(group) * vocab_per_rank
        real = token_columns(vocab_per_rank, group, vocab_size)  # the rest is padding
        math = torch.promote_types(weight.dtype, torch.float32)
        total = torch.zeros((), dtype=math, device=hidden.device)
        lift = weight.dtype == torch.float16  # (see the module docstring)
        # The weight's gradient summed over the chunks in fp32 (fp64) at least; in fp16 the
        # hidden states' too, until the backward's upstream scalar (the loss scale).
        grad_hidden = torch.empty_like(hidden, dtype=math if lift else None) if grad else None
        grad_weight = torch.zeros_like(weight, dtype=math) if grad else None
        for begin in range(0, hidden.shape[0], chunk):
            rows = slice(begin, min(begin + chunk, hidden.shape[0]))
            h = hidden[rows]  # (c, h)
            logits = h @ weight.t()  # (c, V/tp), in the weight's dtype, as the head writes them
            loss, lse, soft, local, inside = _chunk_loss(
                logits, target[rows], group, start, real, vocab_size, eps
            )
            del logits
            w = token_weights[rows].to(math)
            total += (w * loss).sum()
            zw = None
            if z_weights is not None:
                zw = z_weights[rows].to(math)
                total += (zw * lse.square()).sum()
            if not grad:
                continue
            # d/dz of w * CE + zw * lse²: softmax * (w + 2 zw lse) - w (1 - eps) onehot
            # - w eps / V over the true vocabulary (the padding columns stay 0).
            scale = w if zw is None else w + 2.0 * zw * lse
            soft[:, :real].mul_(scale.unsqueeze(-1))
            if eps:
                soft[:, :real].sub_((eps / vocab_size) * w.unsqueeze(-1))
            onehot = (1.0 - eps) * w * inside.to(math)
            soft[torch.arange(soft.shape[0], device=soft.device), local] -= onehot
            if lift:  # fp16's range: the chunk's gradient lifted to about 1 before the cast
                soft, unscale = _lift(soft)
            d = soft.to(weight.dtype)  # (c, V/tp): the logits' gradient, in their dtype
            del soft
            if lift:  # fp16 products of the lifted gradient, unscaled in fp32
                grad_hidden[rows].copy_(d @ weight).mul_(unscale)  # (c, h)
                grad_weight.addcmul_(d.t() @ h, unscale)  # (V/tp, h)
                continue
            grad_hidden[rows] = d @ weight  # (c, h)
            if d.dtype == math:  # (out=, not addmm_: torch's FLOP counter knows addmm)
                torch.addmm(grad_weight, d.t(), h, out=grad_weight)
            else:
                grad_weight += d.t() @ h  # (V/tp, h), summed in fp32
        ctx.save_for_backward(grad_hidden, grad_weight)
        ctx.dtypes = hidden.dtype, weight.dtype
        ctx.set_materialize_grads(False)
        return total

    @staticmethod
    def backward(ctx, grad_total):
        grad_hidden, grad_weight = ctx.saved_tensors
        if grad_total is None or grad_hidden is None:
            return (None,) * 10
        # The scalar that flows back (1, 1 / accumulation steps, an fp16 loss scale) multiplied
        # in place into the held gradients (a second backward, retain_graph, finds the saved
        # tensors modified and autograd refuses it), then cast to the inputs' dtypes: in fp16
        # from fp32, so a gradient too large for the loss scale becomes inf here, where the
        # unfused head's would, for the loss scaler to see.
        g_hidden = grad_hidden.mul_(grad_total.to(grad_hidden.dtype))
        g_weight = grad_weight.mul_(grad_total.to(grad_weight.dtype))
        hidden_dtype, weight_dtype = ctx.dtypes
        return (
            g_hidden.to(hidden_dtype) if ctx.needs_input_grad[0] else None,
            g_weight.to(weight_dtype) if ctx.needs_input_grad[1] else None,
            *(None,) * 8,
        )


def linear_cross_entropy(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    target: torch.Tensor,
    token_weights: torch.Tensor,
    *,
    z_weights: torch.Tensor | None = None,
    tp_group=None,
    label_smoothing: float = 0.0,
    vocab_size: int | None = None,
    chunk_tokens: int,
) -> torch.Tensor:
    """Weighted cross entropy (and z-loss) of `hidden @ weight.T`, a chunk at a time.

    Args:
        hidden: `(tokens, h)` the head's input, the same on every rank of `tp_group` (see the
            module docstring for how to enter the tensor-parallel region).
        weight: `(V/tp, h)` this rank's rows of the head (the untied head's weight, or the
            tied embedding table's shard).
        target: `(tokens,)` integer token ids below `vocab_size`.
        token_weights: `(tokens,)` each token's weight in the sum (a loss mask over its sum
            gives the masked mean); no gradient flows to it.
        z_weights: `(tokens,)` each token's weight of `logsumexp²` (None: no z-loss).
        tp_group: the tensor-parallel group the vocabulary is split over (None: not split).
        label_smoothing: in `[0, 1)`, with `torch.nn.functional.cross_entropy`'s meaning.
        vocab_size: the true vocabulary; the logit columns from it to the padded `V` are left
            out. None: no padding.
        chunk_tokens: tokens per chunk (the largest temporaries are `chunk_tokens × V/tp`).

    Returns:
        the scalar sum, fp32 (fp64 for an fp64 weight); its backward gives the hidden states'
        and the weight's gradients in their dtypes.
    """
    tokens = hidden.shape[0]
    if hidden.dim() != 2 or weight.dim() != 2 or hidden.shape[1] != weight.shape[1]:
        raise ValueError(
            f"linear_cross_entropy: hidden {tuple(hidden.shape)} must be (tokens, h) and weight "
            f"{tuple(weight.shape)} (V/tp, h) with the same h"
        )
    for name, value in (("target", target), ("token_weights", token_weights), ("z", z_weights)):
        if value is not None and tuple(value.shape) != (tokens,):
            raise ValueError(f"linear_cross_entropy: {name} must be ({tokens},), got {value.shape}")
    if not 0.0 <= label_smoothing < 1.0:
        raise ValueError(f"label_smoothing must be in [0, 1), got {label_smoothing}")
    if chunk_tokens < 1:
        raise ValueError(f"linear_cross_entropy: chunk_tokens must be >= 1, got {chunk_tokens}")
    padded = weight.shape[0] * group_size(tp_group)
    if vocab_size is not None and not 0 < vocab_size <= padded:
        raise ValueError(
            f"vocab_size {vocab_size} (the true vocabulary) must be in 1..{padded}, the padded "
            "vocabulary of the weight"
        )
    return _LinearCrossEntropy.apply(
        hidden,
        weight,
        target,
        token_weights.detach(),
        None if z_weights is None else z_weights.detach(),
        tp_group,
        float(label_smoothing),
        vocab_size or padded,
        int(chunk_tokens),
        # (inside the Function's forward gradients are off: decided here)
        torch.is_grad_enabled() and (hidden.requires_grad or weight.requires_grad),
    )


class _LinearLogProbs(torch.autograd.Function):
    """Per-token log p(target) of `hidden @ weight.T`, chunk by chunk; the backward recomputes
    each chunk's logits (the upstream gradient is per token, unknown in the forward)."""

    @staticmethod
    def forward(ctx, hidden, weight, target, group, vocab_size, chunk):
        vocab_per_rank = weight.shape[0]
        start = group_rank(group) * vocab_per_rank
        real = token_columns(vocab_per_rank, group, vocab_size)
        logps = []
        for begin in range(0, hidden.shape[0], chunk):
            rows = slice(begin, min(begin + chunk, hidden.shape[0]))
            loss, *_ = _chunk_loss(
                hidden[rows] @ weight.t(), target[rows], group, start, real, vocab_size, 0.0
            )
            logps.append(loss.neg_())
        ctx.save_for_backward(hidden, weight, target)
        ctx.group, ctx.start, ctx.real, ctx.vocab, ctx.chunk = (
            group,
            start,
            real,
            vocab_size,
            chunk,
        )
        return torch.cat(logps)

    @staticmethod
    def backward(ctx, grad_logps):
        hidden, weight, target = ctx.saved_tensors
        math = torch.promote_types(weight.dtype, torch.float32)
        grad_hidden = torch.empty_like(hidden)
        grad_weight = torch.zeros_like(weight, dtype=math)
        for begin in range(0, hidden.shape[0], ctx.chunk):
            rows = slice(begin, min(begin + ctx.chunk, hidden.shape[0]))
            h = hidden[rows]
            _, _, soft, local, inside = _chunk_loss(
                h @ weight.t(), target[rows], ctx.group, ctx.start, ctx.real, ctx.vocab, 0.0
            )
            # d log p_t / dz = onehot(t) - softmax, times the token's upstream gradient
            g = grad_logps[rows].to(math)
            soft[:, : ctx.real].mul_(-g.unsqueeze(-1))
            soft[torch.arange(soft.shape[0], device=soft.device), local] += g * inside.to(math)
            d = soft.to(weight.dtype)
            del soft
            grad_hidden[rows] = d @ weight
            if d.dtype == math:
                torch.addmm(grad_weight, d.t(), h, out=grad_weight)
            else:
                grad_weight += d.t() @ h
        return grad_hidden, grad_weight.to(weight.dtype), None, None, None, None


def linear_log_probs(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    target: torch.Tensor,
    *,
    tp_group=None,
    vocab_size: int | None = None,
    chunk_tokens: int,
) -> torch.Tensor:
    """`(tokens,)` log p(target) under the logits `hidden @ weight.T` (the true vocabulary's
    softmax), a chunk at a time, fp32: the preference objectives' per-token log-probabilities
    without the logits. Unlike `linear_cross_entropy` its output is not the final loss (DPO and
    KTO combine sequence sums non-linearly), so the backward recomputes each chunk's logits: the
    head runs one more matmul than the unfused head (`megatron/training/metrics/flops.py`
    counts it). The arguments are `linear_cross_entropy`'s."""
    padded = weight.shape[0] * group_size(tp_group)
    if hidden.dim() != 2 or weight.dim() != 2 or hidden.shape[1] != weight.shape[1]:
        raise ValueError(
            f"linear_log_probs: hidden {tuple(hidden.shape)} must be (tokens, h) and weight "
            f"{tuple(weight.shape)} (V/tp, h) with the same h"
        )
    if tuple(target.shape) != (hidden.shape[0],):
        raise ValueError(f"linear_log_probs: target must be ({hidden.shape[0]},)")
    if chunk_tokens < 1:
        raise ValueError(f"linear_log_probs: chunk_tokens must be >= 1, got {chunk_tokens}")
    return _LinearLogProbs.apply(
        hidden, weight, target, tp_group, vocab_size or padded, int(chunk_tokens)
    )
