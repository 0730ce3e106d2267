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
columns from it on are no tokens. They are left out (every pass reads the token columns only),
so the loss is the true vocabulary's whatever the padding (the same at tp 1 and tp 2, where the
padding differs), label smoothing averages over the true vocabulary, and their gradient is
exactly zero. Only the rank(s) holding padding columns (the last one, in practice) mask anything,
from host integers: no extra collective or synchronisation. GPT-NeoX lets the padding columns
take probability mass; this departs from it on purpose.

The same function serves tp 1 (`tp_group` None: the collectives are no-ops). It is also the
cheapest there. It reads the logits once in the forward, a cache-sized chunk of tokens at a
time (max, shift, exp, sum while the chunk is in cache), and writes one logits-sized buffer:
for fp32 logits exp(z) in the forward, turned into the gradient in place in the backward; for
bf16/fp16 logits the gradient itself, recomputed from the logits in the backward (an fp32
softmax kept until then would hold twice their memory). `F.cross_entropy` on the token columns
writes four (log-softmax, a zero-filled NLL gradient, the log-softmax gradient, the
zero-filled gradient of the slice), each a full pass over `tokens × V` floats that at a 50k
vocabulary costs about as much as the output head's matrix multiply on a CPU.
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


CHUNK_BYTES = {"cpu": 4 << 20}
"""Bytes of fp32 logits the softmax passes take at a time, by device type (others: 1 GiB). On
a CPU a chunk stays in the last-level cache between its passes (max, shift, exp, sum; in the
backward scale and one-hot) and its scratch memory is reused instead of paged in afresh; on a
GPU a few large chunks keep the kernel count low."""


def chunk_rows(cols: int, device: torch.device) -> int:
    """How many rows of `cols` fp32 values fit the device's chunk size (at least one)."""
    return max(1, CHUNK_BYTES.get(device.type, 1 << 30) // (4 * max(cols, 1)))


def row_chunks(rows: int, cols: int, device: torch.device):
    """Slices of `rows` rows whose `rows × cols` fp32 values fit the device's chunk size."""
    step = chunk_rows(cols, device)
    return [slice(i, min(i + step, rows)) for i in range(0, rows, step)] if cols else []


def chunk_scratch(x: torch.Tensor, cols: int, dtype) -> torch.Tensor:
    """One chunk of `dtype` scratch for the passes over `x` `(tokens, V/tp)`: every chunk is
    upcast into it in turn, so the transient memory is one chunk whatever the token count (a
    new upcast copy and a new shifted tensor per chunk were two, 2 GiB on a GPU)."""
    rows = min(x.shape[0], chunk_rows(cols, x.device))
    return torch.empty((rows, cols), dtype=dtype, device=x.device)


FUSED_PASSES = {"cuda": {torch.float16}}
"""Device types, and the logits' dtypes there, that take torch's fused softmax kernels a chunk
at a time (`fused_local_sums`, and the backward's `torch.softmax`) instead of `local_sums`'
passes over an upcast copy. torch's CUDA softmax reads fp16 in its own dtype and writes fp32
(`half_to_float`); bf16 it first copies to fp32, so for bf16 the kernels wrote that copy and
their fp32 output, 2 GiB more peak memory at 160M (16k tokens × 50k vocabulary) for no
measured speed (an H200: 236k tokens/s against the passes' 232k, within run-to-run change);
fp16 there: 250k against 235k. On a CPU the passes run in cache and are the cheaper (1.1-1.3 s
against 1.4-1.6 s for 1024 tokens, forward and backward)."""


def fused_local_sums(x, real: int, dtype, smoothing: bool):
    """`local_sums`' figures from torch's fused log-softmax, a chunk at a time: one kernel reads
    the chunk in the logits' dtype and writes log p in `dtype`, so this rank's logsumexp is
    x_j - log p_j at the row's largest logit j (where log p is nearest 0: the exact one), given
    as the max with a sum of exp(x - max) of 1."""
    tokens = x.shape[0]
    lse = torch.full((tokens,), float("-inf"), dtype=dtype, device=x.device)
    sum_x = torch.zeros((tokens,), dtype=dtype, device=x.device)
    for rows in row_chunks(tokens, real, x.device):
        chunk = x[rows, :real]
        top = chunk.argmax(dim=-1, keepdim=True)
        log_p = torch.log_softmax(chunk, dim=-1, dtype=dtype).gather(-1, top)
        lse[rows] = (chunk.gather(-1, top).to(dtype) - log_p).squeeze(-1)
        if smoothing:
            sum_x[rows] = chunk.sum(dim=-1, dtype=dtype)
    return lse, torch.ones_like(lse), sum_x


def local_sums(x, real: int, dtype, smoothing: bool, exp_out=None):
    """One pass over the token columns of `x` `(tokens, V/tp)`, a chunk at a time: per token
    this rank's max m_r, sum exp(x - m_r) and (for label smoothing) sum x, in `dtype`.
    `exp_out`, a `(tokens, V/tp)` buffer of `dtype`, receives exp(x - m_r); without it the
    chunks are upcast into one reused chunk of scratch."""
    tokens = x.shape[0]
    local_max = torch.full((tokens,), float("-inf"), dtype=dtype, device=x.device)
    sum_exp = torch.zeros((tokens,), dtype=dtype, device=x.device)
    sum_x = torch.zeros((tokens,), dtype=dtype, device=x.device)
    scratch = chunk_scratch(x, real, dtype) if exp_out is None else None
    for rows in row_chunks(tokens, real, x.device):
        if scratch is None:  # a view of the logits, shifted into `exp_out`
            chunk, out = x[rows, :real], exp_out[rows, :real]
        else:  # (rows, real): the chunk upcast, then shifted in place
            chunk = out = scratch[: rows.stop - rows.start].copy_(x[rows, :real])
        local_max[rows] = chunk.max(dim=-1).values
        if smoothing:
            sum_x[rows] = chunk.sum(dim=-1)
        shifted = torch.sub(chunk, local_max[rows].unsqueeze(-1), out=out)
        sum_exp[rows] = shifted.exp_().sum(dim=-1)
    return local_max, sum_exp, sum_x


class _VocabParallelCrossEntropy(torch.autograd.Function):
    @staticmethod
    def forward(
        ctx, logits, target, group, label_smoothing, true_vocab=None, consume=False, grad=True
    ):
        vocab_per_rank = logits.shape[-1]
        vocab_size = true_vocab or vocab_per_rank * group_size(group)
        start = group_rank(group) * vocab_per_rank
        real = token_columns(vocab_per_rank, group, true_vocab)  # the rest is padding
        # fp32 at least (bf16/fp16 logits are upcast chunk by chunk; fp64 stays fp64).
        dtype = torch.promote_types(logits.dtype, torch.float32)
        x = logits.reshape(-1, vocab_per_rank)  # (tokens, V/tp)
        flat_target = target.reshape(-1)  # (tokens,)

        outside = (flat_target < start) | (flat_target >= start + vocab_per_rank)
        local_target = (flat_target - start).masked_fill(outside, 0)
        target_logit = x.gather(-1, local_target.unsqueeze(-1)).squeeze(-1).to(dtype)
        # Logits in the math's dtype: exp(x - m_r) goes to a buffer that the backward turns
        # into the gradient in place. Lower-precision logits: the backward recomputes it from
        # them, rather than hold an fp32 copy twice their size until then. `consume`: the
        # logits' own memory is that buffer, or the gradient's. `grad` False (no backward will
        # come: evaluation, inference) and nothing to consume: one chunk of scratch only.
        consume = consume and x.data_ptr() == logits.data_ptr()  # (not a reshaped copy)
        if x.dtype != dtype or not (grad or consume):
            keep = None
        else:
            keep = x if consume else torch.empty_like(x, dtype=dtype)
        if keep is not None:
            keep[:, real:] = 0.0  # padding columns: no probability, no gradient
        fused = keep is None and x.dtype in FUSED_PASSES.get(x.device.type, ())
        if fused:
            local_max, sum_exp, sum_x = fused_local_sums(x, real, dtype, bool(label_smoothing))
        else:
            local_max, sum_exp, sum_x = local_sums(x, real, dtype, bool(label_smoothing), keep)
        # The global max M (a padding logit far above the tokens' does not set it) rescales
        # the sums: sum exp(x - M) = exp(m_r - M) * sum exp(x - m_r), exactly at tp 1.
        shift = all_reduce(local_max.clone(), group, op="max")
        rescale = (local_max - shift).exp_()

        target_logit = target_logit - shift
        sums = [target_logit.masked_fill(outside, 0.0), sum_exp * rescale]
        if label_smoothing:  # the shifted token logits' sum, sum (x - M)
            sums.append(sum_x - real * shift)
        # One all-reduce for the per-token sums (target logit, sum exp[, sum z]): (2|3, tokens).
        sums = all_reduce(torch.stack(sums), group)
        log_sum = sums[1].log()
        lse = shift + log_sum  # logsumexp of the (true vocabulary's) logits, per token
        loss = log_sum - sums[0]
        if label_smoothing:
            loss = (1.0 - label_smoothing) * loss + label_smoothing * (
                log_sum - sums[2] / vocab_size
            )

        if keep is not None:  # softmax = keep * exp(m_r - M) / sum exp(x - M)
            kept = logits if consume else keep  # (the logits, not a view made here)
            ctx.save_for_backward(kept, rescale.div_(sums[1]), local_target, outside)
        elif fused:  # softmax = softmax over this rank's columns * exp(lse_r - lse)
            ctx.save_for_backward(logits, (local_max - lse).exp_(), local_target, outside)
        else:  # softmax = exp(x - lse)
            ctx.save_for_backward(logits, lse, local_target, outside)
        ctx.kept, ctx.fused, ctx.real, ctx.shape = keep is not None, fused, real, logits.shape
        ctx.label_smoothing, ctx.vocab_size = label_smoothing, vocab_size
        ctx.backward_done, ctx.consume = False, consume
        ctx.set_materialize_grads(False)  # (an unused output's gradient stays None)
        outputs = (loss.view(target.shape), lse.view(target.shape))
        if consume:  # the overwritten logits come back as an output with no gradient
            ctx.mark_dirty(logits)
            return (*outputs, logits)
        return outputs

    @staticmethod
    def backward(ctx, grad_loss, grad_lse, *consumed_logits):
        if any(g is not None for g in consumed_logits):
            raise RuntimeError(
                "vocab_parallel_cross_entropy consumed the logits (consume_logits): their memory "
                "held the softmax and then their gradient, and an op after the loss read them "
                "and wants a gradient through them, which would be lost; read the logits before "
                "the loss, or hand the loss a clone"
            )
        if grad_loss is None and grad_lse is None:  # neither output was used
            return None, None, None, None, None, None, None
        if ctx.backward_done:
            raise RuntimeError(
                "vocab_parallel_cross_entropy turns its saved softmax into the gradient, so it "
                "supports one backward per forward (no retain_graph double backward)"
            )
        ctx.backward_done = True
        saved, row_values, local_target, outside = ctx.saved_tensors
        x = saved.reshape(-1, saved.shape[-1])
        eps, real, dtype = ctx.label_smoothing, ctx.real, row_values.dtype
        # d loss / d z = softmax - (1 - eps) * onehot(target) - eps / V (V the true
        # vocabulary; the padding columns stay 0: no gradient), times the loss's gradient;
        # d lse / d z = softmax, times the logsumexp's gradient (the z-loss's 2 z lse): one
        # softmax term for both. In fp32 (fp64), cast once to the logits' dtype.
        scale = row_values.new_zeros(x.shape[0]) if grad_loss is None else grad_loss.reshape(-1)
        scale = scale.to(dtype)
        soft = scale if grad_lse is None else scale + grad_lse.reshape(-1).to(dtype)
        onehot = ((1.0 - eps) * (~outside).to(dtype)).mul_(scale)
        if ctx.kept:
            grad, factor = x, row_values * soft  # the buffer of exp(x - m_r)
        else:  # each chunk is read before its rows of the gradient are written
            grad = x if ctx.consume else torch.empty_like(x)
            grad[:, real:] = 0.0
            scratch = None if ctx.fused else chunk_scratch(x, real, dtype)
            factor = row_values * soft if ctx.fused else None
        for rows in row_chunks(x.shape[0], real, x.device):
            if ctx.kept:
                g = x[rows, :real].mul_(factor[rows].unsqueeze(-1))
            elif ctx.fused:  # one fused kernel: this rank's softmax, then its global scale
                g = torch.softmax(x[rows, :real], dim=-1, dtype=dtype)
                g.mul_(factor[rows].unsqueeze(-1))
            else:  # (rows, real): x upcast minus lse, in the reused scratch
                g = scratch[: rows.stop - rows.start]
                torch.sub(x[rows, :real], row_values[rows].unsqueeze(-1), out=g)
                g.exp_().mul_(soft[rows].unsqueeze(-1))
            if eps:
                g.sub_((eps / ctx.vocab_size) * scale[rows].unsqueeze(-1))
            g[torch.arange(g.shape[0], device=g.device), local_target[rows]] -= onehot[rows]
            if not ctx.kept:
                grad[rows, :real] = g
        return grad.view(ctx.shape), None, None, None, None, None, None


def vocab_parallel_cross_entropy(
    logits_parallel: torch.Tensor,
    target: torch.Tensor,
    tp_group=None,
    label_smoothing: float = 0.0,
    vocab_size: int | None = None,
    consume_logits: bool = False,
    return_logsumexp: bool = False,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
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
        consume_logits: the logits are not needed after this call (nothing else reads or
            saved them): their memory holds the softmax and then the gradient, instead of a
            new logits-sized buffer (as GPT-NeoX's and Megatron's cross entropy overwrite
            theirs). Autograd sees the overwrite: an op that saved them before fails in
            its backward, and so does the backward through an op that reads them after
            (what it read was the softmax, and its gradient would be lost); a read after the
            call without a gradient (a metric) sees the softmax, not the logits.
        return_logsumexp: also return the per-token logsumexp of the (true vocabulary's)
            logits, which the loss computes anyway: a function of it (the z-loss, lse²) costs
            no second pass over the logits, and its gradient (lse's gradient times the
            softmax) joins the cross entropy's in the same backward pass.

    Returns:
        `(...)` loss per token (no reduction), fp32 (fp64 for fp64 logits); with
        `return_logsumexp`, `(loss, logsumexp)`, both `(...)`.
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
    grad = torch.is_grad_enabled() and logits_parallel.requires_grad
    loss, lse, *_consumed = _VocabParallelCrossEntropy.apply(
        logits_parallel, target, tp_group, float(label_smoothing), true_vocab, consume_logits, grad
    )
    return (loss, lse) if return_logsumexp else loss
