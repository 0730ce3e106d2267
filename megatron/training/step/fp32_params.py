"""Parameters that stay fp32 inside an fp16/bf16 run (`keep_fp32`: Mamba's `A_log` and `D`
under `mamba_selective_fp32_params`), with their gradients and optimizer state, through
DeepSpeed 0.19.8's engines and optimizer wrappers.

GPT-NeoX marks them `_deepspeed_no_cast`, which its DeeperSpeed honours and DeepSpeed does not:
DeepSpeed casts every floating parameter of the module to the run's dtype. Here:

- `uncast_fp32_params(model)`, around `deepspeed.initialize`: the engine's cast of the module
  (`DeepSpeedEngine._cast_module_mixed_precision`) gives the marked parameters their fp32
  tensors back, the very values they had (not a round trip through fp16/bf16), before the
  engine broadcasts the model and builds the optimizer wrapper. `param_groups` has put them
  in fp32 groups of their own, which every wrapper flattens and steps apart:
  `FP16_UnfusedOptimizer` (fp16, and bf16 on the plain engine, at ZeRO 0) keeps per-tensor
  fp32 copies and reads each gradient `.to(fp32)`; `BF16_Optimizer` (bf16 at ZeRO 1 and on the
  pipeline engine) flattens each group in its own dtype and accumulates fp32 gradients anyway;
  `DeepSpeedZeroOptimizer` (fp16 at ZeRO 1/2, bf16 at ZeRO 2) flattens and partitions each
  group in its own dtype, but stages every gradient in buffers of the model's dtype.
- `keep_zero_fp32_grads(optimizer)` gives that ZeRO optimizer an fp32 reduction bucket, which
  its per-dtype buckets (made for torch autocast) already support: the fp32 parameters'
  gradients are reduced in fp32 there and then kept in tensors of their own instead of the
  model-dtype partition buffer. Everything else in the wrapper works per group (its fp32
  master partition of an fp32 group is an exact copy; the updated partition is copied back
  into the parameter in fp32).
- `reduce_fp32_grads_in_fp32(engine)`: the engine's own data-parallel reduction (ZeRO 0, and
  `BF16_Optimizer`'s fp32 accumulators) casts every gradient bucket to its communication dtype
  (the model's), an fp32 one too, and back; the fp32 parameters' gradients are reduced in fp32.
- `check_fp32_params(engine)`: after `deepspeed.initialize`, a marked parameter that is not
  fp32 (a DeepSpeed upgrade that casts elsewhere) stops the run instead of training silently in
  half precision.

What cannot be kept fp32 is refused at resolution (`megatron/config/checks/mamba.py`): ZeRO
offload, whose CPU buffers are of the model's dtype, and a `data_types.grad_accum_dtype` that
sends the gradients through another path.
"""

from __future__ import annotations

import contextlib

import torch

from megatron.model.param_groups import keeps_fp32


def _marked(model: torch.nn.Module) -> list[torch.nn.Parameter]:
    return [p for p in model.parameters() if keeps_fp32(p)]


@contextlib.contextmanager
def uncast_fp32_params(model: torch.nn.Module):
    """Inside: DeepSpeed's cast of the module to fp16/bf16 leaves `model`'s `keep_fp32`
    parameters fp32 (module docstring)."""
    marked = [p for p in _marked(model) if p.dtype == torch.float32]
    if not marked:
        yield
        return
    from deepspeed.runtime.engine import DeepSpeedEngine

    original = DeepSpeedEngine._cast_module_mixed_precision

    def cast_all_but_fp32(engine, *args, **kwargs):
        kept = [(p, p.data) for p in marked]  # the cast gives each parameter a new tensor
        original(engine, *args, **kwargs)
        for p, data in kept:
            p.data = data

    DeepSpeedEngine._cast_module_mixed_precision = cast_all_but_fp32
    try:
        yield
    finally:
        DeepSpeedEngine._cast_module_mixed_precision = original


def check_fp32_params(engine) -> None:
    """In an fp16/bf16 engine, every `keep_fp32` parameter is fp32 (module docstring)."""
    if not (engine.fp16_enabled() or engine.bfloat16_enabled()):
        return
    names = {id(p): n for n, p in engine.module.named_parameters()}
    cast = [
        f"{names[id(p)]} ({p.dtype})" for p in _marked(engine.module) if p.dtype != torch.float32
    ]
    if cast:
        raise RuntimeError(
            f"parameters marked to stay fp32 were cast by DeepSpeed: {', '.join(cast[:4])}; "
            "this DeepSpeed casts the module elsewhere than `_cast_module_mixed_precision` "
            "(megatron/training/step/fp32_params.py). Set mamba_selective_fp32_params: false "
            "to train them in the run's dtype"
        )


def keep_zero_fp32_grads(optimizer) -> None:
    """Reduce and keep a `DeepSpeedZeroOptimizer`'s fp32 gradients in fp32 (module docstring);
    any other optimizer, or one without fp32 parameters in a half-precision model, is left
    alone."""
    from deepspeed.accelerator import get_accelerator
    from deepspeed.runtime.zero.stage_1_and_2 import DeepSpeedZeroOptimizer, IPGBucket

    if not isinstance(optimizer, DeepSpeedZeroOptimizer) or optimizer.dtype == torch.float32:
        return
    fp32 = torch.float32
    params = [p for group in optimizer.bit16_groups for p in group if p.dtype == fp32]
    if not params or fp32 in optimizer.ipg_buckets:
        return
    bucket = optimizer.ipg_buckets[fp32] = IPGBucket()
    # Every fp32 gradient fits one bucket: it is reduced once per step, when the others are.
    size = min(sum(p.numel() for p in params), int(optimizer.reduce_bucket_size))
    comm_dtype, setup_buckets = optimizer.get_param_comm_dtype, optimizer.setup_buckets
    copy_grads_in_partition = optimizer.copy_grads_in_partition

    def param_comm_dtype(param):
        return fp32 if param.dtype == fp32 else comm_dtype(param)

    def setup_fp32_bucket():
        allocate = optimizer.contiguous_gradients and not optimizer.ready_for_gradients
        del optimizer.ipg_buckets[fp32]  # the wrapper sizes its buffers in the model's dtype
        try:
            setup_buckets()
        finally:
            optimizer.ipg_buckets[fp32] = bucket
        if allocate:
            device = get_accelerator().current_device_name()
            count = 2 if optimizer.overlap_comm else 1
            bucket.buffer[:] = [torch.empty(size, dtype=fp32, device=device) for _ in range(count)]
            bucket.index = 0

    def copy_fp32_grads(param, *args, **kwargs):
        if param.dtype != fp32:
            return copy_grads_in_partition(param, *args, **kwargs)
        grad = optimizer.get_gradient_for_reduction(param)
        if grad is not None:  # a view of the reduction bucket, which the next step rewrites
            grad.data = grad.data.clone()
        return None

    reduce_gradients = optimizer.reduce_gradients

    def reduce_gradients_fp32_sized(pipeline_parallel=False):
        # The pipeline engine's call first gives every dtype's bucket a buffer of
        # reduce_bucket_size (DeepSpeed 0.19.8's prologue, the argument's only use): the fp32
        # one would be 2 GB at GPT-NeoX's 5e8, for parameters of a few thousand elements.
        if pipeline_parallel and optimizer.contiguous_gradients:
            device = get_accelerator().current_device_name()
            for dtype, bucket_of in optimizer.ipg_buckets.items():
                numel = size if dtype == fp32 else int(optimizer.reduce_bucket_size)
                bucket_of.buffer.append(torch.empty(numel, dtype=dtype, device=device))
                bucket_of.index = 0
        return reduce_gradients(pipeline_parallel=False)

    optimizer.get_param_comm_dtype = param_comm_dtype
    optimizer.setup_buckets = setup_fp32_bucket
    optimizer.copy_grads_in_partition = copy_fp32_grads
    optimizer.reduce_gradients = reduce_gradients_fp32_sized


def reduce_fp32_grads_in_fp32(engine) -> None:
    """The engine's dense gradient reduction (`buffered_allreduce_fallback`) reduces the
    gradients of `keep_fp32` parameters in fp32, the others as before (module docstring)."""
    marked = _marked(engine.module)
    if not marked or not (engine.fp16_enabled() or engine.bfloat16_enabled()):
        return
    reduce = engine._reduce_non_expert_gradients

    def fp32_gradients() -> set[int]:
        optimizer = engine.optimizer
        if hasattr(optimizer, "bf16_groups"):  # BF16_Optimizer: one fp32 accumulator a group
            return {
                optimizer.fp32_groups_gradients_flat[i].data_ptr()
                for i, group in enumerate(optimizer.bf16_groups)
                if group and group[0].dtype == torch.float32
            }
        return {p.grad.data_ptr() for p in marked if p.grad is not None}

    def reduce_apart(grads, elements_per_buffer):
        ours = fp32_gradients()
        kept = [g for g in grads if torch.is_tensor(g) and g.data_ptr() in ours]
        reduce([g for g in grads if not (torch.is_tensor(g) and g.data_ptr() in ours)],
               elements_per_buffer)  # fmt: skip
        if not kept:
            return
        config = engine._config  # `communication_data_type` reads it on every bucket
        before = config.communication_data_type
        config.communication_data_type = torch.float32
        try:
            reduce(kept, elements_per_buffer)
        finally:
            config.communication_data_type = before

    engine._reduce_non_expert_gradients = reduce_apart
