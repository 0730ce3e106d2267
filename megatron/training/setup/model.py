"""Build the model for the engine: partitioned from the start under ZeRO stage 3.

With `zero_optimization.stage: 3` the model is constructed inside `deepspeed.zero.Init`: each
module's parameters are split over the data-parallel group as soon as that module's
`__init__` returns, so no rank ever holds the whole model (a model larger than one rank's
memory can be built; each rank keeps about 1/dp of every parameter).

The values are those of the same model built without ZeRO-3. Our layers draw each FULL
weight from the seed (`megatron/model/specs.py`, `megatron/parallel/params.py`), so the
construction itself runs as always: in fp32, with no tensor-creation overrides
(DeepSpeed's default would create tensors, buffers included, directly in bf16/fp16 and
draw different random numbers). `PartitionedInit` then casts each module's new parameters
to the run's dtype just before DeepSpeed partitions them, which is the cast the engine
applies to an unpartitioned model (`DeepSpeedEngine._cast_module_mixed_precision`: parameters
only; buffers keep their dtype).

The pipeline engine never gets here: DeepSpeed's pipeline engine does not support ZeRO-3, and
`validate.validate_parallel` refuses it at resolution.

`torch_compile` compiles the transformer layers of the model built here, partitioned or not
(`megatron.model.compile_transformer_layers`; under ZeRO-3 DeepSpeed's gather hooks, which it
excludes from compilation, split each layer's graph at every sub-module).
"""

from __future__ import annotations

import torch
from deepspeed.runtime.zero.partition_parameters import DeepSpeedTensorOverride, Init


class PartitionedInit(Init):
    """`deepspeed.zero.Init` that builds in fp32 and casts each module's parameters to `dtype`
    just before they are partitioned (see the module docstring)."""

    def _post_init_method(self, module):
        for param in module.parameters(recurse=False):
            if not hasattr(param, "ds_id") and param.is_floating_point():
                param.data = param.data.to(self.dtype)
        super()._post_init_method(module)


def build_model_for_engine(cfg, topology, ds_config: dict) -> torch.nn.Module:
    """`megatron.model.build_model(cfg, topology)`, partitioned at construction under ZeRO-3.

    `ds_config` is the DeepSpeed config the engine gets (`deepspeed_config(cfg)`)."""
    from megatron.config.checks.torch_compile import validate_torch_compile_device
    from megatron.model import compile_transformer_layers

    validate_torch_compile_device(cfg, on_gpu=torch.cuda.is_available())
    model = _build(cfg, topology, ds_config)
    if cfg.training.torch_compile:
        compile_transformer_layers(model)
    return model


def _build(cfg, topology, ds_config: dict) -> torch.nn.Module:
    from megatron.model import build_model

    if cfg.parallel.zero_stage != 3:
        return build_model(cfg, topology)
    # No `dtype=`: DeepSpeed takes it from the config's fp16/bf16 sections (fp32 without);
    # an explicit one is replaced by bf16 on machines without fp16 support (DeepSpeed 0.19.8).
    with PartitionedInit(
        data_parallel_group=topology.dp_group,
        config_dict_or_path=ds_config,
        mpu=topology,
        tensor_overrides=[DeepSpeedTensorOverride.device],
    ):
        return build_model(cfg, topology)
