"""Resuming a run that GPT-NeoX saved: what its files hold in place of our `trainer_state.pt`,
and whether its optimizer state fits our parameter groups.

GPT-NeoX's save writes DeepSpeed's files (the layer files in our numbering,
`megatron/model/specs.py`) and, in every engine-state file, `iteration`, `args` and its LR
scheduler's state under DeepSpeed's `lr_scheduler` entry (`start_lr`, `warmup_iter`,
`num_iters`, `decay_style`, `end_iter`, `min_lr`); it writes no `trainer_state.pt` and no
`config.json` (its configs go to `configs/`), which tells its folders from ours. It counts
no consumed samples: its loader starts a resumed run at `iteration × train_batch_size`
samples, and so does ours (`neox_trainer_state`).

Its optimizer state loads as DeepSpeed saved it when every model-parallel rank numbers the
same parameters in the same groups as ours (`grouping_problem`). GPT-NeoX groups by the same
rule as `megatron/model/param_groups.py` (decayed; biases and norm weights not), in module
order, with two exceptions where the state cannot fit and the resume is refused with the
reason (`no_load_optim: true` then resumes without it, or `finetune: true` takes the weights
alone):
- `weight_decay: 0`: GPT-NeoX keeps one group of all parameters, we keep two;
- a layer whose tensors differ from ours, e.g. a gated (Llama-style) MLP, whose up and gate
  projections GPT-NeoX keeps in one tensor (`mlp.linear1`) and we in two, or a stage whose
  layers differ (another `pipe_partition_method`, or a tied embedding with learned positions,
  whose copy on GPT-NeoX's last stage also holds the unused position table).
"""

from __future__ import annotations

from pathlib import Path

from megatron.checkpoint.deepspeed_files import ZERO_MODEL_FILE, mp_rank_file, zero_model_file
from megatron.checkpoint.folders import CONFIG_FILE, TRAINER_STATE
from megatron.checkpoint.neox_layout import our_param_name
from megatron.checkpoint.safe_load import load_file

NEOX_LR_KEYS = {
    "peak_lr": "start_lr",
    "min_lr": "min_lr",
    "warmup_iters": "warmup_iter",
    "decay_iters": "end_iter",
    "decay_style": "decay_style",
    "num_iters": "num_iters",
}
"""Our LR schedule's state keys and GPT-NeoX's `AnnealingLR.state_dict()` keys for them."""


def engine_state_file(folder: Path, mp_rank: int = 0) -> Path:
    """The engine-state file of model-parallel rank `mp_rank` (ZeRO-3's has another name)."""
    folder = Path(folder)
    if any(ZERO_MODEL_FILE.match(p.name) for p in folder.iterdir()):
        return folder / zero_model_file(mp_rank)
    return folder / mp_rank_file(mp_rank)


def is_neox_checkpoint(folder: Path) -> bool:
    """A folder GPT-NeoX saved: GPT-NeoX's `iteration` entry in its engine state, and neither
    our `trainer_state.pt` nor our `config.json` (so one of ours that lost its trainer state
    is not taken for one)."""
    folder = Path(folder)
    if (folder / TRAINER_STATE).is_file() or (folder / CONFIG_FILE).is_file():
        return False
    path = engine_state_file(folder)
    return path.is_file() and "iteration" in load_file(path, mmap=True)


def neox_trainer_state(folder: Path, train_batch_size: int) -> dict:
    """What our `trainer_state.pt` would hold, from a GPT-NeoX folder (module docstring)."""
    state = load_file(engine_state_file(folder), mmap=True)
    iteration = int(state["iteration"])
    saved = state.get("lr_scheduler") or {}
    missing = [key for key in NEOX_LR_KEYS.values() if key not in saved]
    if missing:
        raise ValueError(
            f"{engine_state_file(folder)} holds no GPT-NeoX LR schedule (lacks "
            f"{', '.join(missing)}); resume with finetune: true to load the weights alone"
        )
    schedule = {ours: saved[theirs] for ours, theirs in NEOX_LR_KEYS.items()}
    return {
        "iteration": iteration,
        "consumed_samples": iteration * train_batch_size,
        "lr_scheduler": schedule,
    }


def saved_batch_size(folder: Path) -> int:
    """The global batch (samples per iteration) of the run that saved `folder`, from DeepSpeed's
    record of its config (`ds_config`) in the engine-state file: what GPT-NeoX's loader would
    count its consumed samples by, had it resumed at that batch."""
    path = engine_state_file(folder)
    batch = (load_file(path, mmap=True).get("ds_config") or {}).get("train_batch_size")
    if not isinstance(batch, int) or batch < 1:
        raise ValueError(
            f"{path} records no train_batch_size in DeepSpeed's ds_config entry (found "
            f"{batch!r}), so the samples its run consumed are unknown; resume the folder with "
            "train.py at the layout it was saved at, which counts iteration x train_batch_size"
        )
    return batch


def saved_groups(state: dict, tied: bool) -> list[list[str]] | list[int] | None:
    """The parameter groups of one engine-state file's optimizer state: names per group where
    DeepSpeed recorded them (`param_shapes`, under ZeRO and its bf16 optimizer), in our names
    (`tied`: the model ties its embedding), else the number of parameters per group of a torch
    optimizer's state (possibly inside DeepSpeed's fp16 wrapper); None when the file holds
    neither."""
    shapes = state.get("param_shapes")
    if shapes:
        groups = shapes if isinstance(shapes, list) else [shapes]
        return [[our_param_name(name, tied) for name in group] for group in groups]
    optimizer = state.get("optimizer")
    while isinstance(optimizer, dict) and "param_groups" not in optimizer:
        optimizer = optimizer.get("optimizer_state_dict")
    if not isinstance(optimizer, dict):
        return None
    return [len(group["params"]) for group in optimizer["param_groups"]]


def grouping_problem(saved: list | None, ours: list[list[str]], where: str) -> str:
    """Why optimizer state saved with the groups `saved` (`saved_groups`) cannot be loaded
    into our groups `ours` (parameter names per group), "" when it can."""
    if saved is None:
        return f"{where} holds no optimizer state whose parameter groups can be checked"
    sizes = [len(g) if isinstance(g, list) else g for g in saved]
    want = [len(g) for g in ours]
    if len(saved) == 1 and len(ours) == 2 and sizes[0] == sum(want):
        return (
            f"{where}: GPT-NeoX saved one parameter group of {sizes[0]} parameters, as it "
            "does when weight_decay is 0; we keep two (decayed, and biases and norm weights)"
        )
    if sizes != want:
        return (
            f"{where}: the saved optimizer numbers {sizes} parameters per group, this run's "
            f"model {want} (its layers or stages differ from those GPT-NeoX trained, e.g. a "
            "gated MLP, which GPT-NeoX keeps in one tensor mlp.linear1 and we in two)"
        )
    if isinstance(saved[0], list) and saved != ours:
        differ = next((a, b) for ga, gb in zip(saved, ours) for a, b in zip(ga, gb) if a != b)
        return (
            f"{where}: the saved optimizer's parameter '{differ[0]}' stands where this run "
            f"has '{differ[1]}'"
        )
    return ""
