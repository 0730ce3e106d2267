"""The `mpu` interface DeepSpeed expects, as a mixin for `ParallelTopology`.

`deepspeed.initialize(model=..., mpu=topology)` (the non-pipeline engine, with ZeRO) and
`deepspeed.checkpointing.configure(topology, ...)` (activation partitioning) query these methods.
With a `PipelineModule`, DeepSpeed builds its own `PipelineParallelGrid` from
`topology.ds_topology` and takes the `mpu` from it; the semantics below copy that grid's, so
both engines see the same groups:

- data parallel: ranks holding the same model shard (same pipe and model coordinates);
- pipe parallel: the stages of one pipeline;
- tensor ("slice") parallel: the ranks sharing the weights of one layer;
- model parallel: every rank of one model replica (pipe x tensor), over which DeepSpeed sums
  gradient norms and overflow flags. Its rank is `pp_rank * tp_size + tp_rank`.

Unlike the `*_group` attributes of the topology (None for a group of one), these methods always
return a real process group: DeepSpeed passes them to collectives, where None means WORLD.
The `get_sequence_parallel_*` methods are deliberately absent: DeepSpeed reads them as Ulysses
sequence parallelism, which is not Megatron's sequence parallelism.
"""

from __future__ import annotations


class DeepSpeedMpuMixin:
    """Megatron/DeepSpeed `mpu` methods over `self._group(axis)` and the rank attributes."""

    def get_global_rank(self) -> int:
        return self.rank

    # data parallel
    def get_data_parallel_rank(self) -> int:
        return self.dp_rank

    def get_data_parallel_world_size(self) -> int:
        return self.dp_size

    def get_data_parallel_group(self):
        return self._group("data")

    def get_data_parallel_group_ranks(self) -> list[int]:
        return list(self.dp_ranks)

    # pipeline parallel
    def get_pipe_parallel_rank(self) -> int:
        return self.pp_rank

    def get_pipe_parallel_world_size(self) -> int:
        return self.pp_size

    def get_pipe_parallel_group(self):
        return self._group("pipe")

    def get_pipeline_model_parallel_rank(self) -> int:
        return self.pp_rank

    def get_pipeline_model_parallel_world_size(self) -> int:
        return self.pp_size

    def get_pipeline_model_parallel_group(self):
        return self._group("pipe")

    # tensor parallel (DeepSpeed's "slice" parallelism)
    def get_tensor_model_parallel_rank(self) -> int:
        return self.tp_rank

    def get_tensor_model_parallel_world_size(self) -> int:
        return self.tp_size

    def get_tensor_model_parallel_group(self):
        return self._group("model")

    def get_tensor_model_parallel_src_rank(self) -> int:
        """Global rank of tensor-parallel rank 0 in this rank's tensor-parallel group."""
        return self.tp_ranks[0]

    def get_slice_parallel_rank(self) -> int:
        return self.tp_rank

    def get_slice_parallel_world_size(self) -> int:
        return self.tp_size

    def get_slice_parallel_group(self):
        return self._group("model")

    # model parallel = pipe x tensor, one whole model replica
    def get_model_parallel_rank(self) -> int:
        return self.pp_rank * self.tp_size + self.tp_rank

    def get_model_parallel_world_size(self) -> int:
        return self.pp_size * self.tp_size

    def get_model_parallel_group(self):
        return self._group("replica")
