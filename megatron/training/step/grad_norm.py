"""The global gradient norm over tensor- and pipeline-parallel shards, and clipping by it.

DeepSpeed's fp32 path without ZeRO clips with a norm that, under its pipeline engine, is
not summed over the pipeline stages (each stage clips by its own partial norm), so a
pipeline run would not match the same run on the plain engine or with ZeRO. The engine's
`clip_fp32_gradients` is therefore replaced by `clip_by_global_norm` (`setup/engine.py`),
which counts every gradient once:

* a tensor-parallel shard on every tensor-parallel rank; a replicated parameter on
  tensor-parallel rank 0 only;
* a tied parameter's copy on a later pipeline stage (`ds_pipe_replicated`) not at all;
* summed (of squares) over the tensor- and pipeline-parallel groups; data-parallel replicas
  hold the same averaged gradients, so they are not summed; mixture-of-experts experts
  (`expert_parallel`) are summed over the expert-parallel group, whose ranks hold different
  experts.
"""

from __future__ import annotations

import functools

import torch

from megatron.parallel import is_tensor_parallel
from megatron.parallel.comm import all_reduce

# The engine attribute where the non-finite step check (`nonfinite.py`) leaves the global norm
# it computed for the step under way, so the clipping of that step (`setup/engine.py`) does not
# compute and all-reduce it a second time.
STEP_GRAD_NORM = "megatron_step_grad_norm"


def global_grad_norm(parameters, topology) -> torch.Tensor:
    """2-norm of all gradients of the model (collective over tp and pp)."""
    parameters = list(parameters)
    counted = [
        p
        for p in parameters
        if p.grad is not None
        and not getattr(p, "ds_pipe_replicated", False)
        and (topology.tp_rank == 0 or is_tensor_parallel(p))
    ]
    device = next((p.device for p in parameters), torch.device("cpu"))
    # Experts differ over the expert-parallel group (each rank holds its own): summed there.
    # (gradients need no detach: nothing records a graph of them; one was an op per parameter)
    experts = [p.grad for p in counted if getattr(p, "expert_parallel", False)]
    dense = [p.grad for p in counted if not getattr(p, "expert_parallel", False)]
    square, expert_square = _square_sum(dense, device), _square_sum(experts, device)
    square = square + all_reduce(expert_square, getattr(topology, "ep_group", None))
    for group in (topology.tp_group, topology.pp_group):
        square = all_reduce(square, group)
    return square.sqrt()


def _square_sum(grads, device) -> torch.Tensor:
    if not grads:
        return torch.zeros((), dtype=torch.float32, device=device)
    # one fused pass over all gradients, in fp32: a 16-bit norm of loss-scaled fp16 gradients
    # would overflow
    norms = torch._foreach_norm(grads, 2, dtype=torch.float32)
    return torch.stack(norms).square().sum()


def clip_by_global_norm(parameters, max_norm: float, topology, norm=None) -> torch.Tensor:
    """Scale the gradients down so their global norm is at most `max_norm`; return the norm
    before clipping. `norm`: this step's `global_grad_norm`, when the caller has it already."""
    parameters = [p for p in parameters if p.grad is not None]
    if norm is None:
        norm = global_grad_norm(parameters, topology)
    if max_norm > 0 and parameters:
        coef = torch.clamp(max_norm / (norm + 1e-6), max=1.0)
        torch._foreach_mul_([p.grad.detach() for p in parameters], coef)
    return norm


def clip_tensors_on_device(input_tensors, max_norm=1.0, global_norm=None, mpu=None, eps=1e-6):
    """DeepSpeed 0.19.8's `clip_tensors_by_global_norm` without its host read.

    DeepSpeed asks `if clip_coef < 1` of a coefficient computed on the device, a read per
    step, to skip a multiplication by a coefficient of at least 1. Here the coefficient is
    clamped to 1 on the device and every tensor is multiplied by it in one fused pass: below 1
    the same value multiplies the same tensors; otherwise a multiplication by exactly 1 changes
    nothing.
    """
    from deepspeed.runtime.utils import get_global_norm_of_tensors

    if global_norm is None:
        global_norm = get_global_norm_of_tensors(input_tensors, mpu=mpu)
    coef = max_norm / (global_norm + eps)
    coef = torch.clamp(coef, max=1.0) if torch.is_tensor(coef) else min(coef, 1.0)
    torch._foreach_mul_([t.detach() for t in input_tensors], coef)
    return global_norm


def clip_bf16_on_device(optimizer) -> None:
    """Make DeepSpeed's `BF16_Optimizer` (bf16 on the pipeline engine, and at ZeRO 1 on both)
    clip with `clip_tensors_on_device`: its step calls the clipping function it imported from
    `deepspeed.runtime.utils`, which no other DeepSpeed optimizer uses, so the name is rebound
    in its module (for every BF16_Optimizer of the process: the same results, without the
    read). Any other optimizer is left alone."""
    from deepspeed.runtime import bf16_optimizer

    if isinstance(optimizer, bf16_optimizer.BF16_Optimizer):
        bf16_optimizer.clip_tensors_by_global_norm = clip_tensors_on_device


# The attribute of a DeepSpeed optimizer wrapper holding the checks its step would read (below,
# and `fp16_scaler.UnfusedStepChecks`): `on_device()` values that the non-finite step check
# (`nonfinite.py`) reads with its own flag and hands to `read()`; `clear()` after the step.
WRAPPER_CHECKS = "megatron_step_checks"
# The attribute of a gradient norm tensor whose validity was read with the step's flag.
NORM_VERDICT = "megatron_norm_is_invalid"


def _answered_or_checked(check):
    """DeepSpeed's `is_invalid_grad_norm` (`check`), answered without a read for a norm that
    carries the verdict already read (`NORM_VERDICT`)."""

    @functools.wraps(check)
    def is_invalid_grad_norm(norm):
        known = getattr(norm, NORM_VERDICT, None) if torch.is_tensor(norm) else None
        return check(norm) if known is None else known

    return is_invalid_grad_norm


class _KnownNorm(list):
    """Gradients (or group norms) carrying the norm computed of them before the step."""

    norm = None


def _known_or_computed(compute):
    """A DeepSpeed norm function (`compute`) that returns the norm a `_KnownNorm` carries."""

    @functools.wraps(compute)
    def norm_of(*args, **kwargs):
        given = (a for a in (*args, *kwargs.values()) if isinstance(a, _KnownNorm))
        known = next(given, _KnownNorm()).norm
        return compute(*args, **kwargs) if known is None else known

    return norm_of


def _rebind(module, name: str, wrap) -> None:
    """`module.name` replaced by `wrap(module.name)`, once per process."""
    function = getattr(module, name)
    if not getattr(function, "megatron_rebound", False):
        rebound = wrap(function)
        rebound.megatron_rebound = True
        setattr(module, name, rebound)


def _invalid(norm) -> torch.Tensor:
    """`is_invalid_grad_norm(norm)` of DeepSpeed 0.19.8, as a 0-dim tensor, without reading."""
    return (~torch.isfinite(norm) | (norm < 0)).any()


def _agree_zero_overflow(optimizer, overflow: torch.Tensor) -> torch.Tensor:
    """A ZeRO optimizer's overflow flag agreed (MAX, in place) as its `has_overflow` agrees it:
    over its data-parallel group, then its model-parallel group."""
    from deepspeed import comm as dist

    all_reduce(overflow, optimizer.dp_process_group, op="max")
    optimizer._model_parallel_all_reduce(tensor=overflow, op=dist.ReduceOp.MAX)
    return overflow


class ZeroStepChecks:
    """ZeRO 1/2's step (`DeepSpeedZeroOptimizer`) with no read of its own.

    DeepSpeed 0.19.8's step reads its overflow flag (fp16/bf16: `has_overflow`), then asks
    `is_invalid_grad_norm` of its scaled global norm once before the update and once per
    parameter group while unscaling: 3-4 reads per step. Here, before the step, `on_device()`
    computes the same overflow flag (the same test of the same partitions, reduced over the
    same groups) and the same norm (`scaled_global_norm`, the wrapper's own), and the flag and
    the norm's validity are read with the non-finite step's flag (`read`). The step then takes
    its overflow flag and norm from here (each once), and its validity checks of that norm
    answer the verdict read (`is_invalid_grad_norm` rebound in DeepSpeed's module to
    `_answered_or_checked`, which checks any other norm as DeepSpeed does). Its clipping is
    already a device-side clamp. The collectives run in the step's order, on every rank.
    """

    def __init__(self, optimizer):
        from deepspeed.runtime.zero import stage_1_and_2

        self.optimizer, self.norm, self.overflow = optimizer, None, None
        self._norm, self._has_overflow = optimizer.scaled_global_norm, optimizer.has_overflow
        optimizer.scaled_global_norm, optimizer.has_overflow = self.scaled_global_norm, self.flag
        setattr(optimizer, WRAPPER_CHECKS, self)
        _rebind(stage_1_and_2, "is_invalid_grad_norm", _answered_or_checked)

    def on_device(self) -> torch.Tensor:
        """[overflow anywhere, norm invalid] as fp32 on the device, agreed as the step would."""
        opt = self.optimizer
        overflow = torch.zeros(1, dtype=torch.uint8, device=opt.device)
        if opt.check_grad_overflow:
            overflow = opt.has_overflow_partitioned_grads_serial().byte().to(opt.device)
            _agree_zero_overflow(opt, overflow)
        self.norm = self._norm() if opt.compute_grad_norm else None
        invalid = _invalid(self.norm) if self.norm is not None else torch.zeros_like(overflow)
        return torch.cat([overflow.float(), invalid.float().reshape(1)])

    def read(self, values) -> None:
        """The values of `on_device()`, read by the caller; the step answers from them."""
        overflow, invalid = values
        self.overflow = bool(overflow)
        if self.norm is not None:
            setattr(self.norm, NORM_VERDICT, bool(invalid))

    def scaled_global_norm(self, norm_type=2):
        norm, self.norm = self.norm, None
        return self._norm(norm_type) if norm is None else norm

    def flag(self, partition_gradients=True):
        overflow, self.overflow = self.overflow, None
        return self._has_overflow(partition_gradients) if overflow is None else overflow

    def clear(self) -> None:
        """Nothing computed for one step is given to another."""
        self.norm = self.overflow = None


class Bf16StepChecks:
    """`BF16_Optimizer`'s step (bf16 on the pipeline engine, and at ZeRO 1 on both) with no
    read of its own.

    DeepSpeed 0.19.8's step computes the global norm of its gradients and asks
    `is_invalid_grad_norm` of it: a read per step. Here `on_device()` computes the same norm
    (the same gradients, `get_grads_for_norm`, and groups; its function with one fused norm of
    all tensors, `bf16_wrapper.foreach_global_norm`) before the step,
    and its validity is read with the non-finite step's flag. The step's own gradient list then
    carries that norm (`_KnownNorm`), which its norm function returns instead of computing it
    again, and its validity check answers the verdict read. Without mixture-of-experts layers
    only (their norm takes another function).
    """

    def __init__(self, optimizer):
        from deepspeed.runtime import bf16_optimizer

        self.optimizer, self.norm = optimizer, None
        self._grads = optimizer.get_grads_for_norm
        optimizer.get_grads_for_norm = self.grads_for_norm
        setattr(optimizer, WRAPPER_CHECKS, self)
        _rebind(bf16_optimizer, "is_invalid_grad_norm", _answered_or_checked)
        _rebind(bf16_optimizer, "get_global_norm_of_tensors", _known_or_computed)

    def on_device(self) -> torch.Tensor:
        """[norm invalid] as fp32 on the device."""
        from megatron.training.step.bf16_wrapper import foreach_global_norm

        opt = self.optimizer
        grads, _ = self._grads()
        self.norm = foreach_global_norm(grads, mpu=opt.mpu, norm_type=opt.norm_type)
        return _invalid(self.norm).float().reshape(1)

    def read(self, values) -> None:
        setattr(self.norm, NORM_VERDICT, bool(values[0]))

    def grads_for_norm(self, for_clipping=False):
        grads = self._grads(for_clipping=for_clipping)
        if for_clipping or self.norm is None:
            return grads
        non_expert, expert = grads
        known = _KnownNorm(non_expert)
        known.norm, self.norm = self.norm, None
        return known, expert

    def clear(self) -> None:
        self.norm = None


class Zero3StepChecks:
    """ZeRO 3's step (`DeepSpeedZeroOptimizer_Stage3`) with no read of its own.

    DeepSpeed 0.19.8's step reads its overflow flag (fp16: `has_overflow`) and asks
    `is_invalid_grad_norm` of its combined group norms: 1-2 reads per step. Here `on_device()`
    computes both before the step, as the step does (`_overflow_on_device`; the group norms,
    `_get_norm_groups`, combined by `combine_grad_norm_groups`), and they are read with the
    non-finite step's flag. The step takes the flag from here; its group norms carry their
    combination (`_KnownNorm`), which its combining function returns, and its validity check
    answers the verdict read. What the step does before its checks (partitioning the
    parameters, resetting its micro-step count) touches no gradient. Without Muon only (it
    changes the gradients before their norm).
    """

    def __init__(self, optimizer):
        from deepspeed.runtime.zero import stage3

        self.optimizer, self.groups, self.overflow = optimizer, None, None
        self._groups, self._has_overflow = optimizer._get_norm_groups, optimizer.has_overflow
        optimizer._get_norm_groups, optimizer.has_overflow = self.norm_groups, self.flag
        setattr(optimizer, WRAPPER_CHECKS, self)
        _rebind(stage3, "is_invalid_grad_norm", _answered_or_checked)
        _rebind(stage3, "combine_grad_norm_groups", _known_or_computed)

    def on_device(self) -> torch.Tensor:
        """[overflow anywhere, norm invalid] as fp32 on the device, agreed as the step would."""
        from deepspeed.runtime.utils import combine_grad_norm_groups

        opt = self.optimizer
        overflow = torch.zeros(1, dtype=torch.uint8, device=opt.device)
        if opt.dtype == torch.float16:
            overflow = self._overflow_on_device()
        self.groups = _KnownNorm(self._groups())
        self.groups.norm = combine_grad_norm_groups(self.groups)
        return torch.cat([overflow.float(), _invalid(self.groups.norm).float().reshape(1)])

    def _overflow_on_device(self) -> torch.Tensor:
        """DeepSpeed 0.19.8's `has_overflow()` (of the partitioned gradients) up to its read."""
        from deepspeed.accelerator import get_accelerator

        opt, accelerator = self.optimizer, get_accelerator()
        with accelerator.stream(opt.reduce_and_partition_stream):
            opt.inf_or_nan_tracker.logical_or_(torch.isinf(opt.grad_partitions_flat_buffer).any())
            opt.inf_or_nan_tracker.logical_or_(torch.isnan(opt.grad_partitions_flat_buffer).any())
            overflow = opt.inf_or_nan_tracker.clone().to(opt.device).to(torch.uint8)
            opt.inf_or_nan_tracker.zero_()
        if not accelerator.resolves_data_dependency():
            accelerator.default_stream().wait_stream(opt.reduce_and_partition_stream)
        return _agree_zero_overflow(opt, overflow).reshape(1)

    def read(self, values) -> None:
        """The values of `on_device()`, read by the caller; the step answers from them."""
        overflow, invalid = values
        self.overflow = bool(overflow)
        setattr(self.groups.norm, NORM_VERDICT, bool(invalid))

    def norm_groups(self):
        groups, self.groups = self.groups, None
        return self._groups() if groups is None else groups

    def flag(self, partition_gradients=True):
        overflow, self.overflow = self.overflow, None
        if overflow is None or not partition_gradients:
            return self._has_overflow(partition_gradients)
        return overflow

    def clear(self) -> None:
        self.groups = self.overflow = None


def zero_checks_on_device(optimizer) -> None:
    """Give DeepSpeed's ZeRO wrappers and its bf16 wrapper their step checks on the device
    (`ZeroStepChecks`, `Zero3StepChecks`, `Bf16StepChecks`; any other optimizer, or a layout
    they do not cover: nothing)."""
    from deepspeed.runtime.bf16_optimizer import BF16_Optimizer
    from deepspeed.runtime.zero.stage3 import DeepSpeedZeroOptimizer_Stage3
    from deepspeed.runtime.zero.stage_1_and_2 import DeepSpeedZeroOptimizer

    if isinstance(optimizer, DeepSpeedZeroOptimizer) and not optimizer.cpu_offload:
        ZeroStepChecks(optimizer)
    elif isinstance(optimizer, DeepSpeedZeroOptimizer_Stage3):
        if not (optimizer.use_muon or optimizer.offload_optimizer):
            Zero3StepChecks(optimizer)
    elif isinstance(optimizer, BF16_Optimizer) and not optimizer.has_moe_layers:
        Bf16StepChecks(optimizer)
