"""The output end of the model: final norm, the untied output head and the value head.

(The tied head is `WordEmbeddingPipe.project_to_vocab`, in `embedding.py`.) Logits stay
sharded over the vocabulary, `(b, s, V/tp)`: the loss (`loss.py`) is vocab-parallel, so the
full vocabulary is never gathered.

With `loss_chunk_tokens` > 0 both heads write no logits: they return the head's inputs,
`(hidden (s, b, h), weight (V/tp, h) by reference)` (`head_inputs`), the hidden states already
in the tensor-parallel region as the column-parallel projection takes them, and the loss
computes the projection and the cross entropy together a chunk of tokens at a time
(`megatron/parallel/chunked_cross_entropy.py`). The weight travels by reference, a function
returning the parameter itself (`head_weight` opens it), so its gradient lands on the head's
parameter (the tied table's, which DeepSpeed's tied-weight all-reduce then sees on every stage
that holds a copy). Not as a tensor: ZeRO stage 3's hooks replace every tensor in a module's
output with a detached alias of it, whose storage is freed when the parameter is partitioned
again after the forward; a function passes through them untouched, and `head_weight` gathers
the partitioned parameter for the loss, where it stays until DeepSpeed releases it after its
module's backward (DPO/KTO's backward recomputes the logits from it).

A reward model (`train_impl: rm`) ends in `ValueHeadPipe` instead: one scalar per token,
`(b, s)`, from a `(1, h)` weight without bias, `score.weight` (GPT-NeoX's `rm_linear`,
Hugging Face's `score` of its `...ForSequenceClassification` models). The weight is replicated
on every tensor-parallel rank, not split: each rank computes the same values from the same
full hidden states, so the values, the loss and the weight's gradient are identical on every
rank and need no communication.
"""

from __future__ import annotations

import torch
from torch import nn

from megatron.model.args import ModelArgs
from megatron.model.init_methods import input_init
from megatron.model.neox_names import accept_neox_names
from megatron.model.norms import build_norm
from megatron.parallel import (
    ColumnParallelLinear,
    copy_to_tensor_parallel_region,
    gather_from_sequence_parallel_region,
)
from megatron.parallel.comm import group_size


def head_inputs(hidden: torch.Tensor, weight: torch.Tensor, tp_group, sequence_parallel: bool):
    """`(hidden (s, b, h), weight)` for the fused loss: the hidden states enter the
    tensor-parallel region as `ColumnParallelLinear`'s input does (under sequence parallelism
    the all-gather of the sequence, whose backward reduce-scatters the gradient; otherwise the
    copy, whose backward all-reduces it), so every rank projects the same full hidden states
    onto its vocabulary shard."""
    if sequence_parallel:
        hidden = gather_from_sequence_parallel_region(hidden, tp_group)  # (s, b, h)
    else:
        hidden = copy_to_tensor_parallel_region(hidden, tp_group)
    return hidden, lambda: weight  # by reference (module docstring)


def head_weight(reference) -> torch.Tensor:
    """The head's weight from `head_inputs`'s reference, gathered if ZeRO stage 3 holds it
    partitioned (module docstring)."""
    weight = reference()
    if getattr(weight, "ds_status", None) is not None and not weight.numel():
        weight.all_gather(param_list=[weight])
    return weight


class FinalNormPipe(nn.Module):
    """`hidden -> norm(hidden)` (the position ids were dropped by the step before it,
    `specs.py::drop_position_ids`)."""

    def __init__(self, args: ModelArgs, tp_group=None):
        super().__init__()
        self.norm = build_norm(args, sequence_parallel=args.sequence_parallel)
        accept_neox_names(self, args)  # GPT-NeoX's RMSNorm calls its weight `scale`

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.norm(hidden)  # (s, b, h) or (s/tp, b, h) under SP


class OutputHeadPipe(nn.Module):
    """Untied head: column-parallel `(h -> V)` projection without bias."""

    def __init__(self, args: ModelArgs, tp_group=None):
        super().__init__()
        self.final_linear = ColumnParallelLinear(
            args.hidden_size,
            args.vocab_size,
            tp_group=tp_group,
            bias=False,
            gather_output=False,
            init_method=input_init(args),
            sequence_parallel=args.sequence_parallel,
        )
        # muP's readout multiplier (`megatron/model/mup.py::apply_mup`).
        self.mup_readout_mult: float | None = None
        # > 0: return the head's inputs for the fused loss (module docstring)
        self.loss_chunk_tokens = args.loss_chunk_tokens

    def forward(self, hidden: torch.Tensor):
        if self.mup_readout_mult is not None:
            hidden = hidden * self.mup_readout_mult
        if self.loss_chunk_tokens:
            linear = self.final_linear
            return head_inputs(hidden, linear.weight, linear.tp_group, linear.sequence_parallel)
        if self.final_linear.sequence_parallel:
            logits = self.final_linear(hidden)  # (s, b, V/tp); gathers the sequence first
            return logits.transpose(0, 1).contiguous()  # (b, s, V/tp)
        # Project from (b, s, h): the logits come out in (b, s, V/tp) without copying them.
        return self.final_linear(hidden.transpose(0, 1))  # (b, s, V/tp)


class ValueHeadPipe(nn.Module):
    """Reward-model head: `(s, b, h)` hidden states -> values `(b, s)` (one per token).

    Under sequence parallelism the hidden states arrive as `(s/tp, b, h)`; the full sequence
    is gathered first and its gradient only split again on the way back (every rank computes
    the full gradient), so the replicated weight's gradient is complete on each rank.
    """

    def __init__(self, args: ModelArgs, tp_group=None):
        super().__init__()
        self.tp_group = tp_group
        self.sequence_parallel = args.sequence_parallel and group_size(tp_group) > 1
        # (1, h) weight, drawn from the same seed on every tp rank (so equal on all of them)
        self.score = nn.Linear(args.hidden_size, 1, bias=False)
        with torch.no_grad():
            input_init(args)(self.score.weight)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        if self.sequence_parallel:
            hidden = gather_from_sequence_parallel_region(
                hidden, self.tp_group, tensor_parallel_output_grad=False
            )  # (s, b, h)
        values = self.score(hidden)  # (s, b, 1)
        return values.squeeze(-1).transpose(0, 1).contiguous()  # (b, s)
