"""Write DeepSpeed's universal checkpoint layout, so a ZeRO 1-3 run resumes at any dp.

DeepSpeed's ZeRO optimizers restore a universal checkpoint (`load_universal`) from
`{global_step}/zero/`: one folder per parameter, named as the engine's `named_parameters`
name it, holding `fp32.pt` (the fp32 master weight) and one file per optimizer state
(`exp_avg.pt`, `exp_avg_sq.pt`, ...), each `{"param": full tensor, "cat_dim": d}`, plus
`step.pt` (the step count as saved); and `zero/optimizer_state.pt` with the parameter groups'
hyperparameters and `ds_version`. Each rank takes its tensor-parallel chunk (`chunk(tp,
cat_dim)`, the whole tensor when the shapes already match) and then its ZeRO fragment at the
data-parallel size it runs with; the module's weights come from `fp32.pt` too.

That is what DeepSpeed's converter (`deepspeed/checkpoint/ds_to_universal.py`) writes from a
ZeRO 1/2 checkpoint. It is not called here, because it cannot read ours: it needs the
`universal_checkpoint_info` tensor-split patterns that Megatron-DeepSpeed models save in
their model files (ours save none), it reads only ZeRO 1/2 partition files (not ZeRO-0's
torch optimizer state or our ZeRO-3 saves), and it writes only Adam's states (`fp32`,
`exp_avg`, `exp_avg_sq`). `reshard.py` already holds the full state by parameter name (from
any ZeRO stage, `optimizer_state.py`/`zero_state.py`), so this module writes the same files
from it, and the run loads them with DeepSpeed's own loader: `CheckpointIO.load` switches
`load_universal` on for a folder that has `zero/optimizer_state.pt`
(`megatron/checkpoint/folders.py::UNIVERSAL_STATE`), for that load only: the checkpoints
the run saves afterwards are ordinary ZeRO ones, which that loader could not read. It does so
only when the optimizer state is wanted, because DeepSpeed's ZeRO 1/2 universal loader ignores
`load_optimizer_states` (it would restore the moments under `no_load_optim` or `finetune`);
the weights alone come from the ordinary model files beside `zero/`, which this tool writes
too. Setting DeepSpeed's `checkpoint.load_universal` by hand is never needed, and the
pre-flight refuses it on a folder without `zero/` (DeepSpeed would restore no weights).

Limits (DeepSpeed 0.19.8; `universal_target_problem`): ZeRO 1 and 2 engines restore it at
any layout. The ZeRO-3 loader keeps the full tensor (no tensor-parallel chunk without
DeepSpeed's AutoTP marks), so ZeRO 3 only at tp 1; it reads only Adam's `fp32`, `exp_avg`,
`exp_avg_sq` (other optimizers refused), the step from `optimizer_state_dict` and the engine
state from rank 0's ZeRO-3 model-states file (both written here for it); it gives
every parameter group the first group's hyperparameters and every sub-group one shared step
tensor, which `CheckpointIO.load` undoes right after. A ZeRO-0 engine restores nothing from
it. One `optimizer_state.pt` serves every pipeline stage, so every stage must have the same
parameter groups (checked).
"""

from __future__ import annotations

import shutil
from pathlib import Path

import deepspeed
import torch

from megatron.checkpoint.deepspeed_files import mp_rank_file, zero_model_file
from megatron.checkpoint.folders import UNIVERSAL_STATE
from megatron.checkpoint_tools.layout import CheckpointError
from megatron.checkpoint_tools.optimizer_state import FullOptimizerState
from megatron.checkpoint_tools.schema import ModelSchema, resize_vocab
from megatron.checkpoint_tools.stages import StageModule, stage_bounds

UNIVERSAL_STAGES = (1, 2)
"""ZeRO stages whose partitions hold fp32 master weights in `single_partition_of_fp32_groups`
and whose DeepSpeed optimizer restores a universal checkpoint of any of our layouts."""
ADAM_STATES = {"exp_avg", "exp_avg_sq", "step"}


def universal_target_problem(zero_stage: int, tp: int, pp: int) -> str:
    """Why a run at (tp, pp, ZeRO `zero_stage`) cannot restore a universal checkpoint with its
    optimizer state ("" when it can)."""
    if zero_stage not in (0, 1, 2, 3):
        return f"ZeRO stage {zero_stage} does not exist (0, 1, 2 or 3)"
    if zero_stage in UNIVERSAL_STAGES:
        if pp >= 1 and zero_stage > 1:
            return "DeepSpeed's pipeline engine runs ZeRO stage 0 or 1 only"
        return ""
    if zero_stage == 3 and pp >= 1:
        return "DeepSpeed's pipeline engine runs ZeRO stage 0 or 1 only"
    if zero_stage == 3 and tp > 1:
        return (
            "DeepSpeed 0.19.8's ZeRO-3 universal loader does not split tensor-parallel "
            "weights (it partitions the full tensor over the data-parallel ranks)"
        )
    if zero_stage == 3:
        return ""
    return "a ZeRO-0 engine restores nothing from DeepSpeed's universal layout"


def is_universal(folder: Path) -> bool:
    """Whether a checkpoint folder holds DeepSpeed's universal layout."""
    return (Path(folder) / UNIVERSAL_STATE).is_file()


def reshard_stage(zero_stage: int, tp: int, pp: int) -> tuple[int, str]:
    """`(--zero-stage to convert to, note)` for a run at (tp, pp, ZeRO `zero_stage`): its own
    stage when it restores the optimizer state from a converted checkpoint, else 0 and why."""
    problem = universal_target_problem(zero_stage, tp, pp) if zero_stage else ""
    if not problem:
        return zero_stage, ""
    return 0, f" (ZeRO stage {zero_stage} cannot restore a converted optimizer state: {problem})"


def _param_groups(schema: ModelSchema, full: FullOptimizerState, stages: int, tp: int) -> list:
    """The saved hyperparameters in the target optimizer's group order (one list for every
    stage: DeepSpeed zips it with each rank's groups)."""
    from megatron.model.param_groups import has_fp32_groups, param_groups

    bounds = stage_bounds(schema, stages, tp)
    fp32 = has_fp32_groups(full.groups)  # a half-precision run's fp32 groups (Mamba's A_log, D)
    orders = {
        tuple(g["name"] for g in param_groups(StageModule(schema, bounds, s), 0.0, fp32))
        for s in range(stages)
    }
    if len(orders) != 1:
        raise CheckpointError(
            f"the pipeline stages of the target layout have different parameter groups "
            f"({sorted(orders)}); DeepSpeed's universal checkpoint has one list for all ranks. "
            "Choose another pipe_parallel_size or convert with --zero-stage 0"
        )
    groups = []
    for name in orders.pop():
        if name not in full.groups:
            raise CheckpointError(f"the saved optimizer has no parameter group '{name}'")
        groups.append({**full.groups[name], "params": []})
    return groups


def _tensor_file(tensor: torch.Tensor, spec) -> dict:
    if spec.is_vocab_table:
        tensor = resize_vocab(tensor, spec.shape[0])
    if tuple(tensor.shape) != spec.shape:
        raise CheckpointError(f"'{spec.name}': state {tuple(tensor.shape)}, model {spec.shape}")
    # cat_dim: the dim DeepSpeed chunks over tensor-parallel ranks (any for replicated ones,
    # whose full shape equals the rank's shape, which DeepSpeed then copies whole).
    return {"param": tensor.detach().float().contiguous(), "cat_dim": spec.partition_dim or 0}


def write_universal_state(
    folder: Path,
    *,
    schema: ModelSchema,
    weights: dict[str, torch.Tensor],
    optimizer: FullOptimizerState,
    stages: int,
    tp: int,
    zero_stage: int = 1,
) -> Path:
    """Write `{folder}/zero/` from full fp32 `weights` and `optimizer` state (both by
    parameter name, of the target `schema`) for a run with ZeRO `zero_stage`; returns the
    `zero` folder."""
    groups = _param_groups(schema, optimizer, stages, tp)
    if zero_stage == 3:
        _check_zero3(folder, optimizer)
    state_file = Path(folder) / UNIVERSAL_STATE
    root = state_file.parent
    for name, spec in schema.params.items():
        saved = optimizer.per_param.get(name)
        if saved is None:
            raise CheckpointError(f"the optimizer state has no entry for '{name}'")
        param_dir = root / name
        param_dir.mkdir(parents=True, exist_ok=True)
        torch.save(_tensor_file(weights[name], spec), param_dir / "fp32.pt")
        for key, value in saved.items():
            if torch.is_tensor(value) and value.dim() > 0:
                torch.save(_tensor_file(value, spec), param_dir / f"{key}.pt")
            elif key == "step":
                torch.save(value, param_dir / "step.pt")
            else:
                raise CheckpointError(
                    f"optimizer state '{key}' of '{name}' is a scalar other than the step "
                    "count, which DeepSpeed's universal loader cannot restore; convert with "
                    "--zero-stage 0"
                )
    # ZeRO 3 reads the step and the hyperparameters from a torch-like state dict (and the
    # first group's for every group: `CheckpointIO` puts back each group's own).
    step = next(iter(optimizer.per_param.values())).get("step")
    torch_like = {"state": {0: {"step": step}}, "param_groups": groups}
    torch.save(
        {
            "param_groups": groups,
            "optimizer_state_dict": torch_like,
            "ds_version": deepspeed.__version__,
        },
        state_file,
    )
    return root


def _check_zero3(folder: Path, optimizer: FullOptimizerState) -> None:
    """DeepSpeed's ZeRO-3 universal loader reads `fp32`, `exp_avg` and `exp_avg_sq` only, and
    the engine state from rank 0's ZeRO-3 model-states file (tp 1: model-parallel rank 0)."""
    for name, state in optimizer.per_param.items():
        if set(state) != ADAM_STATES:
            raise CheckpointError(
                f"the optimizer state of '{name}' is {sorted(state)}; DeepSpeed's ZeRO-3 "
                f"universal loader restores Adam's {sorted(ADAM_STATES)} only (convert with "
                "--zero-stage 0, 1 or 2)"
            )
    shutil.copyfile(Path(folder) / mp_rank_file(0), Path(folder) / zero_model_file(0))


def universal_files(reader, schema, weights, optimizer, tp: int, pp: int, zero_stage: int):
    """`write_checkpoint`'s `more_files` for a ZeRO 1-3 target (None for ZeRO 0, or without
    optimizer state: the checkpoint then holds the weights only, in its model files).
    `weights` are the module's; from a ZeRO 1/2 source `fp32.pt` gets the fp32 master weights
    of its partitions (`master_weights.py`; the same values in an fp32 run, not the rounded
    ones in bf16)."""
    if optimizer is None or not zero_stage:
        return None
    stages = max(1, pp)
    if int(getattr(reader.cfg.parallel, "zero_stage", 0) or 0) in UNIVERSAL_STAGES:
        from megatron.checkpoint_tools.master_weights import read_master_weights

        weights = read_master_weights(reader)

    def write(folder: Path) -> None:
        write_universal_state(
            folder,
            schema=schema,
            weights=weights,
            optimizer=optimizer,
            stages=stages,
            tp=tp,
            zero_stage=zero_stage,
        )

    return write


def resume_note(zero_stage: int, with_optimizer: bool) -> str:
    """How a run resumes the converted checkpoint (the tool's report)."""
    if not zero_stage:
        return (
            "written without ZeRO: resume it with zero_optimization stage 0 (another stage "
            "only with no_load_optim, or convert with --zero-stage 1, 2 or 3)"
        )
    if not with_optimizer:
        return f"weights only: resume it with ZeRO stage {zero_stage} and no_load_optim"
    return (
        f"written in DeepSpeed's universal layout (zero/): resume it with ZeRO stage "
        f"{zero_stage} at any data-parallel size (train.py switches DeepSpeed's load_universal "
        "on for it)"
    )
