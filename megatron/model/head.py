"""The output end of the model: final norm and the untied output head.

(The tied head is `WordEmbeddingPipe.project_to_vocab`, in `embedding.py`.) Logits stay
sharded over the vocabulary, `(b, s, V/tp)`: the loss (`loss.py`) is vocab-parallel, so the
full vocabulary is never gathered.
"""

from __future__ import annotations

import torch
from torch import nn

from megatron.model.args import ModelArgs
from megatron.model.init_methods import input_init
from megatron.model.norms import build_norm
from megatron.parallel import ColumnParallelLinear


class FinalNormPipe(nn.Module):
    """`(hidden, position_ids) -> norm(hidden)`; position ids are not needed after this."""

    def __init__(self, args: ModelArgs, tp_group=None):
        super().__init__()
        self.norm = build_norm(args, sequence_parallel=args.sequence_parallel)

    def forward(self, inputs: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        hidden, _ = inputs
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

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        if self.final_linear.sequence_parallel:
            logits = self.final_linear(hidden)  # (s, b, V/tp); gathers the sequence first
            return logits.transpose(0, 1).contiguous()  # (b, s, V/tp)
        # Project from (b, s, h): the logits come out in (b, s, V/tp) without copying them.
        return self.final_linear(hidden.transpose(0, 1))  # (b, s, V/tp)
