"""`build_model(cfg, topology)`: the GPT model for DeepSpeed's pipeline or plain engine.

- `pipe_parallel_size >= 1`: a DeepSpeed `PipelineModule` over `gpt_layer_specs` (layers
  split by `pipe_partition_method`, activation checkpointing every `checkpoint_num_layers`
  transformer layers when `checkpoint_activations`, `loss_fn` set, DeepSpeed topology from the
  `ParallelTopology`). Feed the engine `((tokens, position_ids), (labels, loss_mask))`.
- `pipe_parallel_size == 0`: `GPTModel`, the same layers (same parameter names) as one
  `nn.Module` for DeepSpeed's ordinary engine (ZeRO 2/3): `model(tokens, position_ids)` gives
  logits `(b, s, V/tp)`, `model.loss_fn(logits, (labels, loss_mask))` the loss.

With `loss_chunk_tokens` > 0 the output of either model is the head's inputs
`(hidden (s, b, h), weight (V/tp, h) by reference)` instead of logits, and `loss_fn` computes
the head and the loss together from them, chunk by chunk (`megatron/model/loss.py`, `head.py`).

Both are built in fp32 on the CPU (the pipeline module then moves itself to the accelerator);
DeepSpeed casts them for bf16/fp16. Both carry `loss_fn` bound to the tensor-parallel group
and the true vocabulary (padding logits masked out), `args` (the `ModelArgs`) and, with tensor
parallelism, hooks summing the gradients of sequence-parallel/partial replicated parameters
over the tensor-parallel group.

`compile_transformer_layers(model)` compiles each transformer layer in place with
`torch.compile` (the training config's `torch_compile`).

With `sequence_parallel` and more than one stage, DeepSpeed's config must carry
`"pipeline": PIPELINE_SP_CONFIG` (`pipeline_config_for(args)` says what a model needs).
"""

from __future__ import annotations

import dataclasses
import functools

import deepspeed
import torch
from deepspeed.pipe import LayerSpec, PipelineModule, TiedLayerSpec
from torch import nn

from megatron.config.ds_export import PIPELINE_SP_SECTION
from megatron.config.verbosity import quiet_deepspeed
from megatron.model.args import ModelArgs
from megatron.model.loss import bound_loss_fn
from megatron.model.mup import apply_mup
from megatron.model.specs import TRANSFORMER_LAYER_NAMES, gpt_layer_specs
from megatron.parallel import register_sequence_parallel_grad_hooks
from megatron.parallel.comm import group_size

PARTITION_METHODS = ("parameters", "uniform", "type:")

PIPELINE_SP_CONFIG = PIPELINE_SP_SECTION
"""DeepSpeed `pipeline` section required with sequence parallelism and pipe_parallel_size > 1
(`megatron.config.deepspeed_config` exports it; see PIPELINE_SP_SECTION there)."""


def pipeline_config_for(args: ModelArgs) -> dict:
    """The DeepSpeed `pipeline` config entries this model needs (empty when none)."""
    if args.sequence_parallel and args.pipe_parallel_size > 1:
        return dict(PIPELINE_SP_CONFIG)
    return {}


class GPTModel(nn.Module):
    """The GPT layers run in one process (no pipeline), named as in the `PipelineModule`.

    Activation checkpointing, when `checkpoint_num_layers > 0`, recomputes runs of that many
    consecutive transformer layers with DeepSpeed's `checkpoint` (which restores the default
    and tensor-parallel RNG states, so dropout masks replay exactly).
    """

    def __init__(self, specs: list, *, loss_fn, checkpoint_num_layers: int = 0):
        super().__init__()
        self.loss_fn = loss_fn
        self.checkpoint_num_layers = checkpoint_num_layers
        self.tied_modules = nn.ModuleDict()
        self.forward_funcs = []
        for index, spec in enumerate(specs):
            if isinstance(spec, TiedLayerSpec):
                if spec.key not in self.tied_modules:
                    self.tied_modules[spec.key] = spec.build()
                module = self.tied_modules[spec.key]
                fn = functools.partial(spec.forward_fn, module) if spec.forward_fn else module
            elif isinstance(spec, LayerSpec):
                fn = spec.build()
                self.add_module(str(index), fn)
            else:  # a parameter-free function (`specs.py::LayerFunction`)
                fn = spec
            self.forward_funcs.append(fn)

    @staticmethod
    def _checkpointable(fn) -> bool:
        return type(fn).__name__ in TRANSFORMER_LAYER_NAMES

    def _run(self, start: int, stop: int):
        def run(*inputs):
            x = inputs if len(inputs) > 1 else inputs[0]
            for fn in self.forward_funcs[start:stop]:
                x = fn(x)
            return x

        return run

    def forward(self, tokens: torch.Tensor, position_ids: torch.Tensor) -> torch.Tensor:
        """`(b, s)` int64 tokens and positions -> logits `(b, s, V/tp)`."""
        x = (tokens, position_ids)
        i, n, chunk = 0, len(self.forward_funcs), self.checkpoint_num_layers
        while i < n:
            if chunk and self._checkpointable(self.forward_funcs[i]):
                j = i
                while j < n and j - i < chunk and self._checkpointable(self.forward_funcs[j]):
                    j += 1
                x = deepspeed.checkpointing.checkpoint(self._run(i, j), *x)
                i = j
            else:
                x = self.forward_funcs[i](x)
                i += 1
        return x


def configure_activation_checkpointing(args: ModelArgs, topology=None) -> None:
    """Point DeepSpeed's activation checkpointing at the tensor-parallel group and settings.

    Needs DeepSpeed's communication set up (`deepspeed.init_distributed`); in a single process
    without it, DeepSpeed's defaults (no partitioning, no CPU offload) apply.
    """
    if not deepspeed.comm.is_initialized():
        return
    mpu = topology
    # Partitioning over one tensor-parallel rank saves nothing, and DeepSpeed's round trip
    # (the input's storage swapped out and back) gave wrong gradients to rwkv layers there.
    partition = args.partition_activations and mpu is not None and mpu.tp_size > 1
    deepspeed.checkpointing.configure(
        mpu,
        partition_activations=partition,
        contiguous_checkpointing=args.contiguous_checkpointing and partition,
        num_checkpoints=args.num_layers,
        checkpoint_in_cpu=args.checkpoint_in_cpu,
        synchronize=args.synchronize_each_layer,
        profile=args.profile_backward,
    )


def compile_transformer_layers(model: nn.Module) -> int:
    """Compile every transformer layer of `model` in place (`nn.Module.compile`); returns how
    many.

    Per layer, not the whole model: the pipeline engine calls the layers of a stage one by one
    and activation checkpointing wraps runs of them in DeepSpeed's `checkpoint`, whose RNG
    state juggling Dynamo cannot trace; a layer is the largest unit both leave whole. The
    layers are instances of one class with parameters of one shape, so they share one graph
    (one compilation, not one per layer). In place, the modules keep their class and
    parameter names, so checkpoints, `checkpointable_layers` and the partitioner see no
    difference. Compilation happens on the first forward.
    """
    layers = [m for m in model.modules() if type(m).__name__ in TRANSFORMER_LAYER_NAMES]
    for layer in layers:
        layer.compile()
    return len(layers)


def _check_partition_method(method: str) -> str:
    if method in PARTITION_METHODS or method.startswith("type:"):
        return method
    raise ValueError(
        f"pipe_partition_method '{method}' is not valid; expected 'type:transformer' (or "
        "'type:REGEX' over layer class names), 'parameters' or 'uniform'"
    )


def full_shapes(args: ModelArgs) -> dict[str, tuple[int, ...]]:
    """Every parameter's whole shape, by name, from the plain model built on
    the meta device (one process, no pipeline: the whole model at any layout; muP reads them)."""
    plain = dataclasses.replace(args, use_mup=False, pipe_parallel_size=0)
    with torch.random.fork_rng(devices=[]), torch.device("meta"):  # layer specs seed torch
        model = GPTModel(gpt_layer_specs(plain), loss_fn=None)
    return {name: tuple(p.shape) for name, p in model.named_parameters()}


def build_gpt(args: ModelArgs, topology=None) -> nn.Module:
    """The model for `args` (see the module docstring); `topology` is a `ParallelTopology`
    (None: one process, no parallelism)."""
    tp_group = topology.tp_group if topology is not None else None
    ep_group = topology.ep_group if topology is not None else None
    partition_method = _check_partition_method(args.pipe_partition_method)
    specs = gpt_layer_specs(args, tp_group, ep_group)
    interval = args.checkpoint_num_layers if args.checkpoint_activations else 0
    loss_fn = bound_loss_fn(tp_group, args.z_loss, args.true_vocab_size, args.loss_chunk_tokens)
    if interval:
        configure_activation_checkpointing(args, topology)
    if args.pipe_parallel_size >= 1:
        if topology is None:
            raise ValueError(
                f"pipe_parallel_size {args.pipe_parallel_size} builds a DeepSpeed "
                "PipelineModule, which needs the ParallelTopology (and torch.distributed "
                "initialised); pass build_model(cfg, topology)"
            )
        with quiet_deepspeed():  # it prints its partition of the layers (deepy --verbose)
            model = PipelineModule(
                layers=specs,
                topology=topology.ds_topology,
                loss_fn=loss_fn,
                partition_method=partition_method,
                activation_checkpoint_interval=interval,
                checkpointable_layers=TRANSFORMER_LAYER_NAMES,
            )
    else:
        model = GPTModel(specs, loss_fn=loss_fn, checkpoint_num_layers=interval)
    model.args = args
    if args.use_mup:
        apply_mup(model, args, full_shapes(args))
    if group_size(tp_group) > 1:
        model.sequence_parallel_grad_hooks = register_sequence_parallel_grad_hooks(model, tp_group)
    return model


def build_model(cfg, topology=None) -> nn.Module:
    """Build the GPT model from the resolved config (`cfg.model`, `cfg.parallel`, seed)."""
    return build_gpt(ModelArgs.from_config(cfg), topology)
