"""The input end of the model: token embedding (shared with the output head when tied) and
the input positional encoding, dropout and change to the Megatron layout.

Two pipeline layers, so that a tied embedding is only the word table: the last pipeline stage
then holds a copy of `word_embeddings.weight` alone (DeepSpeed keeps the two copies in sync),
never an unused position table.

- `WordEmbeddingPipe`: `(tokens, position_ids) -> (embeddings (b, s, h), position_ids)`;
  its `project_to_vocab` is the tied output head.
- `PositionEmbeddingPipe`: adds learned/sinusoidal positions, transposes to `(s, b, h)`,
  scatters the sequence under sequence parallelism, applies `hidden_dropout`.
"""

from __future__ import annotations

import contextlib

import torch
import torch.nn.functional as F
from torch import nn

from megatron.model.args import ModelArgs
from megatron.model.attention_backends import tensor_parallel_dropout_context
from megatron.model.init_methods import input_init
from megatron.model.positional import build_input_positions
from megatron.parallel import (
    VocabParallelEmbedding,
    copy_to_tensor_parallel_region,
    gather_from_sequence_parallel_region,
    scatter_to_sequence_parallel_region,
)
from megatron.parallel.comm import group_size


class WordEmbeddingPipe(nn.Module):
    """Vocab-parallel token embedding; also the tied output projection."""

    def __init__(self, args: ModelArgs, tp_group=None):
        super().__init__()
        self.tp_group = tp_group
        self.sequence_parallel = args.sequence_parallel and group_size(tp_group) > 1
        self.word_embeddings = VocabParallelEmbedding(
            args.vocab_size, args.hidden_size, tp_group=tp_group, init_method=input_init(args)
        )

    def forward(self, inputs: tuple[torch.Tensor, torch.Tensor]):
        tokens, position_ids = inputs  # (b, s) each
        return self.word_embeddings(tokens), position_ids  # (b, s, h)

    def project_to_vocab(self, hidden: torch.Tensor) -> torch.Tensor:
        """Tied head: `(s, b, h)` (or `(s/tp, b, h)` under SP) -> logits `(b, s, V/tp)`."""
        if self.sequence_parallel:
            hidden = gather_from_sequence_parallel_region(hidden, self.tp_group)  # (s, b, h)
        else:
            hidden = copy_to_tensor_parallel_region(hidden, self.tp_group)
        # Project from (b, s, h): the logits come out in (b, s, V/tp) without copying them.
        return F.linear(hidden.transpose(0, 1), self.word_embeddings.weight)  # (b, s, V/tp)


def project_to_vocab(embedding: WordEmbeddingPipe, hidden: torch.Tensor) -> torch.Tensor:
    """`forward_fn` of the tied head's `TiedLayerSpec` (DeepSpeed calls it with the module)."""
    return embedding.project_to_vocab(hidden)


class PositionEmbeddingPipe(nn.Module):
    """Input positions, layout change, sequence scatter and embedding dropout."""

    def __init__(self, args: ModelArgs, tp_group=None):
        super().__init__()
        self.tp_group = tp_group
        self.sequence_parallel = args.sequence_parallel and group_size(tp_group) > 1
        self.hidden_dropout = args.hidden_dropout
        # `position_embeddings` holds the learned table (its weight is
        # `position_embeddings.weight`); None for rotary/alibi/none.
        self.position_embeddings = build_input_positions(args)

    def forward(self, inputs: tuple[torch.Tensor, torch.Tensor]):
        embeddings, position_ids = inputs  # (b, s, h), (b, s)
        if self.position_embeddings is not None:
            embeddings = embeddings + self.position_embeddings(position_ids).to(embeddings.dtype)
        hidden = embeddings.transpose(0, 1).contiguous()  # (s, b, h)
        rng = contextlib.nullcontext()
        if self.sequence_parallel:
            hidden = scatter_to_sequence_parallel_region(hidden, self.tp_group)  # (s/tp, b, h)
            rng = tensor_parallel_dropout_context(self.tp_group)
        if self.training and self.hidden_dropout > 0:
            with rng:
                hidden = F.dropout(hidden, self.hidden_dropout, training=True)
        return hidden, position_ids
