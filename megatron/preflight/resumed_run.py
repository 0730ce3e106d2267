"""Which run a training `load` folder holds, said before launch in the user's own keys.

A `load` folder that is not this run's is the first trap of a new user: one `checkpoints/`
for every model, or `--set data_path=...` on the folder of the Shakespeare run. The pre-flight
compares the folder's `config.json` with the config and leads with what it finds:

- another model (`checkpoints.py` finds the shapes): the folder is another run's, and this
  one needs a folder of its own;
- a run on other data: resuming continues that run (its iteration, LR schedule and data
  position) on this data, a warning naming the keys;
- another LR schedule: the resume would stop after launch, on a value derived from the keys
  (`warmup_iters`, `decay_iters`); refused here instead, naming the keys the user set
  (`train_iters 40, the config says 60`), unless `override_lr_scheduler` or
  `use_checkpoint_lr_scheduler` says which schedule to follow;
- a finished run (its iteration is the config's `train_iters`): nothing would train;
- another optimizer group layout: Mamba's `A_log` and `D` in fp32 groups of their own (an
  fp16/bf16 run with `mamba_selective_fp32_params`) or not; DeepSpeed restores the optimizer
  group by group, so the saved state does not fit, and the resume is refused unless
  `no_load_optim` (or `finetune`) says to start a fresh optimizer.
"""

from __future__ import annotations

from pathlib import Path

from megatron.config import Config
from megatron.config.checks.mamba import keeps_fp32_groups
from megatron.preflight.findings import ERROR, WARNING, Finding

NAME = "load"
DATA_KEYS = ("data_path", "train_data_paths", "train_data_weights", "data_impl")
SCHEDULE_KEYS = ("train_iters", "lr_decay_iters", "lr_decay_fraction", "warmup", "lr",
                 "min_lr", "lr_decay_style", "wsd_decay_fraction", "wsd_decay_style",
                 "lr_cycles", "lr_cycle_length", "lr_rewarmup", "lr_cycle_decay")  # fmt: skip
"""The keys the LR schedule is made of (`lr` is the optimizer's peak)."""
CURVE = ("min_lr", "warmup_iters", "decay_iters", "lr_decay_style", "lr_cycles",
         "lr_cycle_length", "lr_rewarmup", "lr_cycle_decay")  # fmt: skip
"""The schedule's values as the trainer compares them on resume (`AnnealingLR`), besides the
peak LR: a resume stops when one differs."""


def own_folder_hint(cfg: Config) -> str:
    """`--set save=... load=...` of a new folder named after the run's first config file:
    `checkpoints/<name>`, or `<name>-2`, `-3`, ... where that one is the `load` or `save`
    folder the run already has, or exists."""
    files = [f for f in cfg.config_files if not f.startswith("<")]  # not `<dict>`
    name = Path(files[0]).stem if files else "this-run"
    taken = {Path(p).resolve() for p in (cfg.checkpointing.load, cfg.checkpointing.save) if p}
    folder, n = f"checkpoints/{name}", 1
    while Path(folder).resolve() in taken or Path(folder).exists():
        n += 1
        folder = f"checkpoints/{name}-{n}"
    return f"--set save={folder} --set load={folder}"


def another_model(folder: Path, differences: list[str], cfg: Config) -> Finding:
    """The lead finding for a folder whose model is not the config's."""
    named = "; ".join(differences[:4]) + (
        f"; {len(differences) - 4} more" if len(differences) > 4 else ""
    )
    return Finding(
        NAME,
        ERROR,
        f"{cfg.checkpointing.load} holds a run of another model ({folder}: {named}): this run "
        f"would resume it. Give this run a folder of its own ({own_folder_hint(cfg)}), or "
        "set those keys to the checkpoint's to continue that run",
    )


def _value(cfg: Config, key: str):
    return cfg.optimizer.lr if key == "lr" else cfg.get(key)


def _changed(saved: Config, cfg: Config, keys) -> list[str]:
    return [f"{k} {_value(saved, k)!r}, the config says {_value(cfg, k)!r}"
            for k in keys if _value(saved, k) != _value(cfg, k)]  # fmt: skip


def _curve(cfg: Config) -> tuple:
    lr = cfg.lr
    values = tuple(getattr(lr, k) if hasattr(lr, k) else cfg.get(k) for k in CURVE)
    return (float(cfg.optimizer.lr), *values)


def run_findings(folder: Path, saved: Config, cfg: Config) -> list[Finding]:
    """What a training run resuming `folder` (of the same model) should know first."""
    found = []
    data = _changed(saved, cfg, DATA_KEYS)
    if data:
        found.append(Finding(NAME, WARNING,
            f"{folder} is a run on other data ({'; '.join(data)}): resuming continues that "
            "run (its iteration, LR schedule and data position) on this data; give a new run "
            f"a folder of its own ({own_folder_hint(cfg)}), or finetune: true to start from "
            "its weights"))  # fmt: skip
    lr = cfg.lr
    follows = lr.override_lr_scheduler or lr.use_checkpoint_lr_scheduler
    if not follows and _curve(saved) != _curve(cfg):
        keys = "; ".join(_changed(saved, cfg, SCHEDULE_KEYS)) or "a derived value"
        found.append(Finding(NAME, ERROR,
            f"{folder} was trained on another LR schedule: {keys}. To resume it, set "
            "override_lr_scheduler: true (this config's schedule from the checkpoint's "
            "iteration) or use_checkpoint_lr_scheduler: true (the checkpoint's); a new run "
            f"needs a folder of its own ({own_folder_hint(cfg)}), or finetune: true"))  # fmt: skip
    layout = _fp32_groups_finding(folder, saved, cfg)
    return found + ([layout] if layout else [])


def _fp32_groups_finding(folder: Path, saved: Config, cfg: Config) -> Finding | None:
    """The optimizer state of `folder` has other groups than this run's (module docstring)."""
    before, now = keeps_fp32_groups(saved), keeps_fp32_groups(cfg)
    if before == now or cfg.checkpointing.no_load_optim:
        return None

    def groups(c: Config, kept: bool) -> str:
        how = "in fp32 groups of their own" if kept else "in the groups of the other weights"
        return (
            f"{c.precision.dtype}, mamba_selective_fp32_params "
            f"{str(c.model.mamba_selective_fp32_params).lower()}: A_log and D {how}"
        )

    return Finding(
        NAME,
        ERROR,
        f"{folder} holds optimizer state of other parameter groups ({groups(saved, before)}; "
        f"this config: {groups(cfg, now)}), which DeepSpeed restores group by group. Keep the "
        "checkpoint's precision and mamba_selective_fp32_params, or resume with "
        "no_load_optim: true (its weights, iteration and LR schedule, a fresh optimizer)",
    )


def finished_finding(folder: Path, cfg: Config) -> Finding | None:
    """A folder already at the config's `train_iters`: nothing would train."""
    tag = folder.name
    iters = cfg.training.train_iters
    if not tag.startswith("global_step") or not tag[11:].isdigit() or iters is None:
        return None
    iteration = int(tag[11:])
    if iteration < iters:
        return None
    return Finding(NAME, WARNING,
        f"{folder} is already at iteration {iteration} of train_iters {iters}: the run is "
        "complete and nothing will train; raise train_iters to continue it, or give a new run "
        f"a folder of its own ({own_folder_hint(cfg)})")  # fmt: skip
