"""The input end of the model: token embedding (shared with the output head when tied), the
input positional encoding and dropout, and the change to the Megatron layout.

GPT-NeoX's layer list, whose indices name the checkpoint files (`specs.py`), holds at index 0
the whole embedding (`EmbeddingPipe`: tokens, learned positions, dropout) and at index 1 a
parameter-free function to the transformer layers' layout (`to_transformer_layout`), which
DeepSpeed writes no file for.

- `WordEmbeddingPipe`: the token table alone; its `project_to_vocab` is the tied output head.
  A tied head on another pipeline stage builds this class, so that stage holds a copy of
  `word_embeddings.weight` alone (DeepSpeed keeps the copies in sync), never an unused
  position table.
- `EmbeddingPipe(WordEmbeddingPipe)`: `(tokens, position_ids) -> (embeddings (b, s, h),
  position_ids)`: adds learned/sinusoidal positions and applies `hidden_dropout`, as GPT-NeoX's
  embedding does. The activations are the same on every tensor-parallel rank here, so the
  default generator (equal on those ranks) draws the mask, also under sequence parallelism
  (the sequence is split after it).
- `to_transformer_layout`: `(b, s, h) -> (s, b, h)`, scattered over the sequence under
  sequence parallelism.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from megatron.model.args import ModelArgs
from megatron.model.head import head_inputs
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
        # muP's readout multiplier of the tied head (`megatron/model/mup.py::apply_mup`).
        self.mup_readout_mult: float | None = None
        # > 0: the tied head returns its inputs for the fused loss (`head.py::head_inputs`)
        self.loss_chunk_tokens = args.loss_chunk_tokens

    def forward(self, inputs: tuple[torch.Tensor, torch.Tensor]):
        tokens, position_ids = inputs  # (b, s) each
        return self.word_embeddings(tokens), position_ids  # (b, s, h)

    def project_to_vocab(self, hidden: torch.Tensor):
        """Tied head: `(s, b, h)` (or `(s/tp, b, h)` under SP) -> logits `(b, s, V/tp)`; with
        `loss_chunk_tokens` > 0 the head's inputs `(hidden (s, b, h), table shard (V/tp, h) by
        reference)` instead (`head.py::head_inputs`)."""
        if self.loss_chunk_tokens:
            if self.mup_readout_mult is not None:
                hidden = hidden * self.mup_readout_mult
            weight = self.word_embeddings.weight
            return head_inputs(hidden, weight, self.tp_group, self.sequence_parallel)
        if self.sequence_parallel:
            hidden = gather_from_sequence_parallel_region(hidden, self.tp_group)  # (s, b, h)
        else:
            hidden = copy_to_tensor_parallel_region(hidden, self.tp_group)
        if self.mup_readout_mult is not None:
            hidden = hidden * self.mup_readout_mult
        # Project from (b, s, h): the logits come out in (b, s, V/tp) without copying them.
        return F.linear(hidden.transpose(0, 1), self.word_embeddings.weight)  # (b, s, V/tp)


def project_to_vocab(embedding: WordEmbeddingPipe, hidden: torch.Tensor) -> torch.Tensor:
    """`forward_fn` of the tied head's `TiedLayerSpec` (DeepSpeed calls it with the module)."""
    return embedding.project_to_vocab(hidden)


class EmbeddingPipe(WordEmbeddingPipe):
    """Tokens and input positions, then embedding dropout (see the module docstring)."""

    def __init__(self, args: ModelArgs, tp_group=None):
        super().__init__(args, tp_group)
        self.hidden_dropout = args.hidden_dropout
        # `position_embeddings` holds the learned table (its weight is
        # `position_embeddings.weight`); None for rotary/alibi/none.
        self.position_embeddings = build_input_positions(args)
        # muP's multipliers (GPT-NeoX's places: positions before the sum, all after dropout)
        self.mup_mults = (
            (args.mup_rp_embedding_mult, args.mup_embedding_mult) if args.use_mup else None
        )

    def forward(self, inputs: tuple[torch.Tensor, torch.Tensor]):
        embeddings, position_ids = super().forward(inputs)  # (b, s, h), (b, s)
        if self.position_embeddings is not None:
            positions = self.position_embeddings(position_ids).to(embeddings.dtype)
            if self.mup_mults is not None:
                positions = positions * self.mup_mults[0]
            embeddings = embeddings + positions
        if self.training and self.hidden_dropout > 0:
            embeddings = F.dropout(embeddings, self.hidden_dropout, training=True)
        if self.mup_mults is not None:
            embeddings = embeddings * self.mup_mults[1]
        return embeddings, position_ids


def to_transformer_layout(inputs, *, tp_group=None, sequence_parallel: bool = False):
    """`(embeddings (b, s, h), position_ids) -> (hidden (s, b, h), position_ids)`; under
    sequence parallelism each tensor-parallel rank keeps its `s/tp` positions."""
    embeddings, position_ids = inputs
    hidden = embeddings.transpose(0, 1).contiguous()  # (s, b, h)
    if sequence_parallel and group_size(tp_group) > 1:
        hidden = scatter_to_sequence_parallel_region(hidden, tp_group)  # (s/tp, b, h)
    return hidden, position_ids
