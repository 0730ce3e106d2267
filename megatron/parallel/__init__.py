"""Parallel machinery: topology and groups, tensor-parallel layers, vocab-parallel loss, RNG.

| module             | what it holds                                                        |
| ------------------ | -------------------------------------------------------------------- |
| `topology`         | `ParallelTopology`: dp x pp x tp, the process groups, DeepSpeed mpu  |
| `comm`             | collectives along one dim, where `group=None` means a group of one   |
| `mappings`         | autograd functions entering/leaving the tensor/sequence-parallel region |
| `params`           | sharded parameter creation, marks, gathering, sequence-parallel grads |
| `layers`           | `ColumnParallelLinear`, `RowParallelLinear`, `VocabParallelEmbedding` |
| `cross_entropy`    | `vocab_parallel_cross_entropy`                                        |
| `chunked_cross_entropy` | `linear_cross_entropy`: the head and the loss, chunk by chunk |
| `random`           | `model_parallel_seed`, the tensor-parallel RNG tracker                |
"""

from megatron.parallel.chunked_cross_entropy import linear_cross_entropy
from megatron.parallel.cross_entropy import vocab_parallel_cross_entropy
from megatron.parallel.layers import (
    ColumnParallelLinear,
    RowParallelLinear,
    VocabParallelEmbedding,
)
from megatron.parallel.mappings import (
    copy_to_tensor_parallel_region,
    gather_from_sequence_parallel_region,
    gather_from_tensor_parallel_region,
    reduce_from_tensor_parallel_region,
    reduce_scatter_to_sequence_parallel_region,
    scatter_to_sequence_parallel_region,
    scatter_to_tensor_parallel_region,
)
from megatron.parallel.params import (
    allreduce_sequence_parallel_grads,
    gather_full_parameter,
    is_tensor_parallel,
    mark_sequence_parallel,
    register_sequence_parallel_grad_hooks,
)
from megatron.parallel.random import (
    MODEL_PARALLEL_RNG,
    get_rng_tracker,
    model_parallel_seed,
    tensor_parallel_rng,
)
from megatron.parallel.topology import ParallelTopology

__all__ = [
    "MODEL_PARALLEL_RNG",
    "ColumnParallelLinear",
    "ParallelTopology",
    "RowParallelLinear",
    "VocabParallelEmbedding",
    "allreduce_sequence_parallel_grads",
    "copy_to_tensor_parallel_region",
    "gather_from_sequence_parallel_region",
    "gather_from_tensor_parallel_region",
    "gather_full_parameter",
    "get_rng_tracker",
    "is_tensor_parallel",
    "linear_cross_entropy",
    "mark_sequence_parallel",
    "model_parallel_seed",
    "reduce_from_tensor_parallel_region",
    "reduce_scatter_to_sequence_parallel_region",
    "register_sequence_parallel_grad_hooks",
    "scatter_to_sequence_parallel_region",
    "scatter_to_tensor_parallel_region",
    "tensor_parallel_rng",
    "vocab_parallel_cross_entropy",
]
