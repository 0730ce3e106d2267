"""Optimizer settings (`cfg.optimizer`) and the one table of what each optimizer type is.

`OPTIMIZER_TYPES` holds, per `optimizer.type` (GPT-NeoX's spelling), the facts the config
checks, the checkpoint tools and the checkpoint-size estimate need; each of them reads this
table and keeps no list of its own. What builds each type (it needs torch) is
`megatron/training/optim/optimizers.py::OPTIMIZERS`; a test keeps its names equal to these.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from megatron.config.schema import derived, documented


@dataclass(frozen=True)
class OptimizerType:
    """The facts of one `optimizer.type` (a row of `OPTIMIZER_TYPES`)."""

    state_tensors: int
    """fp32 tensors of a parameter's size it saves for each parameter."""

    whole_parameter: str = ""
    """Why its update or its state needs each parameter whole ("" for an element-wise
    optimizer). A config where DeepSpeed would hand it flat partitions is refused with this
    reason (`megatron/config/checks/optimizer_engines.py`), and the checkpoint tools do not move its
    state to another layout (`megatron/checkpoint_tools/optimizer_read.py`)."""

    zero_tested: bool = False
    """DeepSpeed's ZeRO takes it without `zero_allow_untested_optimizer`."""

    state_tensor_with: str = ""
    """An `optimizer.params` switch that, when true, adds one more such tensor."""

    state_per_rank: bool = False
    """Every data-parallel rank saves its own state tensors (they differ between ranks)."""

    def saved_states(self, params: dict, data_parallel_size: int) -> int:
        """fp32 tensors of a parameter's size one checkpoint holds for each parameter."""
        n = self.state_tensors + (1 if params.get(self.state_tensor_with) else 0)
        return n * data_parallel_size if self.state_per_rank else n


def _adam() -> OptimizerType:
    # exp_avg, exp_avg_sq, and max_exp_avg_sq with amsgrad
    return OptimizerType(zero_tested=True, state_tensors=2, state_tensor_with="amsgrad")


OPTIMIZER_TYPES: dict[str, OptimizerType] = {
    "Adam": _adam(),
    "AdamW": _adam(),
    "OneBitAdam": OptimizerType(
        whole_parameter="compresses each parameter's momentum with one scale per tensor and "
        "averages it over data-parallel ranks that must hold the same tensors; a flat partition "
        "mixes parameters and differs from rank to rank",
        state_tensors=4,  # exp_avg, exp_avg_sq, worker and server error
    ),
    "CPU_Adam": _adam(),
    "CPU_torch_adam": _adam(),
    "SM3": OptimizerType(
        whole_parameter="keeps one accumulator per dimension of each parameter (a row and a "
        "column vector for a matrix); on a flat partition it degenerates into element-wise "
        "Adagrad",
        state_tensors=0,
        state_tensor_with="momentum",  # the accumulators are a row and a column: not counted
    ),
    "madgrad_wd": OptimizerType(state_tensors=3),  # s, grad_sum_sq, x0
    "Lion": OptimizerType(state_tensors=1),  # exp_avg
    "SGD": OptimizerType(state_tensors=0, state_tensor_with="momentum"),  # momentum_buffer
    "Distro": OptimizerType(
        whole_parameter="keeps one momentum per data-parallel rank and compresses it by DCT "
        "over chunks of each parameter's rows and columns; ZeRO partitions exactly that state "
        "across the ranks, and a flat partition has no rows and columns",
        state_tensors=1,
        state_per_rank=True,
    ),
}


def _names(names: list[str]) -> str:
    return ", ".join(names[:-1]) + f" and {names[-1]}" if len(names) > 1 else "".join(names)


def _types_doc() -> str:
    """The part of the `optimizer` key's docstring that the table says."""
    whole = [name for name, o in OPTIMIZER_TYPES.items() if o.whole_parameter]
    tested = [name for name, o in OPTIMIZER_TYPES.items() if o.zero_tested]
    return (
        f"`type` is one of {_names(list(OPTIMIZER_TYPES))}. {_names(whole)} need whole "
        "parameters: refused with ZeRO stages 1-3 and with bf16 on the pipeline engine, where "
        f"DeepSpeed hands the optimizer flat partitions. ZeRO stages 1-3 take {_names(tested)}; "
        "any other type needs zero_allow_untested_optimizer."
    )


# What GPT-NeoX trains with when a config has no `optimizer` section (its OPT_DEFAULT and
# OPT_PARAMS_DEFAULTS, the Adam entries): Adam, lr 1e-3, betas (0.9, 0.999), eps 1e-8. Weight
# decay comes from `weight_decay`, as for every optimizer here.
NEOX_DEFAULT_OPTIMIZER = "Adam"
NEOX_DEFAULT_LR = 1.0e-3
NEOX_DEFAULT_PARAMS: dict[str, Any] = {"betas": [0.9, 0.999], "eps": 1.0e-8}


@dataclass(frozen=True)
class OptimizerConfig:
    optimizer: dict[str, Any] | None = documented(None, _types_doc())
    """`{type, params}` as in GPT-NeoX: params holds `lr`, `betas`, `eps`, ... .
    Distro (DisTrO/DeMo, Psyche's names) takes `compression_decay` (0.999),
    `compression_chunk` (64), `compression_topk` (8) and `quantize_1bit` (true); it replaces
    the data-parallel gradient all-reduce and needs fp32 and ZeRO stage 0.
    Without it (or without a type or lr in it), GPT-NeoX's default is used with a warning:
    Adam, lr 1e-3, betas [0.9, 0.999], eps 1e-8."""

    lr: float | None = None
    """Peak learning rate; by default taken from `optimizer.params.lr`."""

    weight_decay: float = 0.1
    """Decoupled weight decay (GPT-NeoX's default 0.1); never applied to biases and norm
    weights."""

    gradient_clipping: float = 1.0
    """Clip the global gradient norm to this value (0 disables)."""

    optimizer_type: str = derived("Adam")
    """Canonical optimizer type name (derived from `optimizer.type`)."""

    optimizer_params: dict[str, Any] = derived(None)
    """Optimizer parameters without `lr` (derived from `optimizer.params`)."""
