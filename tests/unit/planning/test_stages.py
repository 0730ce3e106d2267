"""The plan's stages are DeepSpeed's: the same layers and the same parameters on each stage.

Two gloo ranks build the real `PipelineModule` at pp 2 (tied embeddings: the first and the
last stage each hold the table) with each partition method; the plan, built on `meta` in this
process, must give every stage the layer range and the trainable parameter count the real
stage holds.
"""

from __future__ import annotations

import torch

from megatron.model.args import ModelArgs
from megatron.planning.stages import plan_stages
from tests.distributed import run_distributed
from tests.tiny import resolve, tiny_settings

METHODS = ("type:transformer|mlp", "parameters", "uniform")


def _real_stages(rank, world_size, folder):
    import deepspeed

    from megatron.model import build_model
    from megatron.parallel import ParallelTopology

    deepspeed.init_distributed(dist_backend="gloo")
    out = {}
    for method in METHODS:
        cfg = resolve(_settings(folder, method), world_size)
        model = build_model(cfg, ParallelTopology.from_config(cfg))
        params = sum(p.numel() for p in model.parameters() if p.requires_grad)
        out[method] = (list(model.parts), params)
    return out


def _settings(folder, method):
    return tiny_settings(folder, pipe_parallel_size=2, num_layers=5, no_weight_tying=False,
                         pipe_partition_method=method)  # fmt: skip


def test_stages_are_deepspeeds(tmp_path):
    real = run_distributed(_real_stages, 2, str(tmp_path))
    for method in METHODS:
        cfg = resolve(_settings(tmp_path, method), 2)
        planned = plan_stages(ModelArgs.from_config(cfg), 2, 1, 1, torch.float32)
        for stage in planned.stages:
            parts, params = real[stage.index][method]
            first, last = stage.entries[0].index, stage.entries[-1].index
            assert (first, last + 1) == (parts[stage.index], parts[stage.index + 1]), method
            assert stage.parameter_count == params, (method, stage.index)
        assert planned.stages[0].first and planned.stages[1].last
