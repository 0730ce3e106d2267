"""Checkpoints: when to save, what to save beside DeepSpeed's states, `latest`, pruning, load.

Layout of `{save}/global_step{N}/`:

    DeepSpeed's files         model (and, unless ZeRO, optimizer) states; ZeRO optimizer shards
    trainer_state.pt          iteration, consumed samples, LR scheduler, skipped-step counts
    rng_state_rank{R}.pt      Python, NumPy, torch (CPU and its own CUDA device) and
                              tensor-parallel RNG of every global rank R (a folder GPT-NeoX
                              saved has none: its engine-state files hold its streams, which
                              a resume restores)
    optimizer_rank_state_{R}.pt   an optimizer's per-rank state (Distro's local momenta),
                              which DeepSpeed's rank-0 optimizer file cannot hold
    expert_states_pp{P}_ep{E}.pt  the experts (and their optimizer state) of expert-parallel
                              rank E > 0, which DeepSpeed's rank-0 files cannot hold
                              (`experts.py`)
    config.json               the resolved config of the run
    permanent                 only in a `checkpoint_keep` tier checkpoint: never deleted
    complete                  written last, once every rank's files are on disk

Folder names, `latest`, completion markers, resume choice and pruning:
`megatron/checkpoint/folders.py`. Every file is loaded weights-only (`safe_load.py`): a checkpoint
cannot run code.
"""

from __future__ import annotations

import contextlib
import logging
import pickle
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from megatron.checkpoint.folders import (
    COMPLETE,
    CONFIG_FILE,
    LATEST,
    PERMANENT,
    TRAINER_STATE,
    UNIVERSAL_STATE,
    mark_complete,
    prune_checkpoints,
    resume_tag,
    tag_for,
    write_latest,
)
from megatron.checkpoint.neox_layout import config_json
from megatron.checkpoint.neox_resume import is_neox_checkpoint
from megatron.checkpoint.safe_load import load_file, refusal, use_safe_loading, weights_only_loading
from megatron.checkpoint.size import free_bytes_at
from megatron.config.placement import node_local_rank
from megatron.config.verbosity import quiet_deepspeed
from megatron.training.checkpoint.disk_space import ensure_room, stop_on_failure
from megatron.training.checkpoint.load_checks import check_model_files, neox_resume_state
from megatron.training.checkpoint.neox_files import (
    client_state,
    is_plain,
    load_module,
    rng_from_client_state,
    sequential_module_names,
)
from megatron.training.optim.distro import load_rank_state, save_rank_state
from megatron.training.step.fp16_scaler import keep_configured_scaler

log = logging.getLogger(__name__)


@contextlib.contextmanager
def _universal_loading(engine, on: bool):
    """Within: DeepSpeed's `load_universal` on when `on`. A universal checkpoint
    (`tools/reshard.py --zero-stage 1/2`) holds weights and optimizer state in its `zero/`
    folder, which DeepSpeed reads only so; weights alone come from its ordinary model files."""
    if not on:
        yield
        return
    config = engine._config
    configured = config.load_universal_checkpoint
    config.load_universal_checkpoint = True
    try:
        yield
    finally:
        config.load_universal_checkpoint = configured


def _fix_zero3_universal_load(engine, folder: Path) -> None:
    """Undo two slips of DeepSpeed 0.19.8's ZeRO-3 universal load. It gives every parameter
    group the first group's hyperparameters (the no-decay group would be decayed): each group
    gets its own back, saved in the same order (`megatron/checkpoint_tools/universal.py`). It
    gives every sub-group one shared `step` tensor, which torch's Adam increments in place
    once per sub-group per step (a wrong bias correction): each gets its own copy."""
    for state in engine.optimizer.optimizer.state.values():
        if torch.is_tensor(state.get("step")):
            state["step"] = state["step"].clone()
    saved = load_file(folder / UNIVERSAL_STATE)["param_groups"]
    groups = engine.optimizer.optimizer.param_groups
    if len(saved) != len(groups):
        raise ValueError(
            f"{folder / UNIVERSAL_STATE} has {len(saved)} parameter groups, the optimizer "
            f"{len(groups)}: it was written for another model"
        )
    for group, own in zip(groups, saved):
        group.update({key: value for key, value in own.items() if key != "params"})


def rng_state(tracker=None) -> dict[str, Any]:
    """Every random stream of this process (`tracker`: the tensor-parallel RNG tracker). The
    CUDA stream is that of this process's device alone: the only one it draws from, and one
    that loads where a process sees fewer devices than at save."""
    state = {
        "python": random.getstate(),
        "numpy": np.random.get_state(),
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state() if torch.cuda.is_available() else None,
        "tracker": tracker.get_states() if tracker is not None else None,
    }
    return state


def set_rng_state(state: dict[str, Any], tracker=None) -> None:
    """Restore `rng_state`'s streams; the CUDA one onto this process's device, whatever
    devices it sees (one per process under SLURM's `--gpus-per-task=1`)."""
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if state.get("cuda") is not None and torch.cuda.is_available():
        torch.cuda.set_rng_state(_own_cuda_state(state["cuda"]))
    if tracker is not None and state.get("tracker") is not None:
        tracker.set_states(state["tracker"])


def _own_cuda_state(saved: torch.Tensor | list[torch.Tensor]) -> torch.Tensor:
    """The saving process's own device state. Checkpoints from before held a list, one state
    per device the process saw (`get_rng_state_all`): the process drew on one of them only,
    so every other entry still holds the state `torch.manual_seed` gave all devices. The one
    entry that differs from the rest is the drawn one; when none or several stand out (all
    identical: any is right; two devices: both differ), the entry of the device the old code
    chose, `LOCAL_RANK % device_count`, with this process's node-local rank."""
    if torch.is_tensor(saved):
        return saved
    odd = [s for s in saved if sum(torch.equal(s, other) for other in saved) == 1]
    if len(odd) == 1:
        return odd[0]
    return saved[node_local_rank() % len(saved)]


def _rank() -> int:
    return dist.get_rank() if dist.is_initialized() else 0


def _barrier() -> None:
    if dist.is_initialized():
        dist.barrier()


@dataclass
class CheckpointIO:
    """Saves and loads run checkpoints through a DeepSpeed engine (one per run)."""

    engine: Any
    save_dir: str | None
    config_dict: dict | None = None
    keep_last_n: int | None = None
    save_rng: bool = True
    save_optim: bool = True
    tracker: Any = None
    needed_bytes: int | None = None
    """Bytes one checkpoint needs (`checkpoint_size(cfg).total`); None: not checked."""
    free_bytes: Callable[[Path], int] = free_bytes_at
    experts: Any = None
    """`moe_checkpoint.ExpertCheckpoint`: the expert slices DeepSpeed's files lack (ep > 1)."""
    pinned: list[Path] = field(default_factory=list)
    """Checkpoint folders `keep_last_n` never deletes (a reference model's starting weights)."""

    def _engine_save(self, tag: str, iteration: int, rng: dict | None) -> None:
        """DeepSpeed's save, with GPT-NeoX's entries (`neox_files.py`; `rng` this rank's
        `rng_state`, None when not saved); with `save_optim` off, its optimizer states are left
        out (the weights of ZeRO 1/2 and of the plain engine are in the module states)."""
        engine = self.engine
        extra = {"client_state": client_state(self.config_dict, iteration, rng)}
        if self.save_optim:
            with sequential_module_names(engine):
                engine.save_checkpoint(self.save_dir, tag=tag, save_latest=False, **extra)
            return
        if engine.zero_optimization_partition_weights():
            raise ValueError(
                "no_save_optim with ZeRO stage 3 would save no weights (they live in the "
                "partitioned optimizer files); set no_save_optim: false"
            )
        saved_flag, optimizer = engine.save_zero_checkpoint, engine.optimizer
        engine.save_zero_checkpoint = False
        optimizer.state_dict = lambda: None  # shadows the method for this one save
        try:
            with sequential_module_names(engine):
                engine.save_checkpoint(self.save_dir, tag=tag, save_latest=False, **extra)
        finally:
            engine.save_zero_checkpoint = saved_flag
            del optimizer.state_dict

    def save(self, iteration: int, trainer_state: dict[str, Any], kind: str = "step") -> Path:
        """Collective: every rank must call it with the same iteration and `kind` (SAVE_KINDS;
        `permanent` marks the folder so that no pruning deletes it). Without room for one
        checkpoint (`needed_bytes`), or when a write fails, it raises `CheckpointSaveError`
        and `latest` stays on the last complete checkpoint (`disk_space.py`)."""
        tag = tag_for(iteration, kind)
        ensure_room(self.save_dir, tag, self.needed_bytes, self.free_bytes)
        with stop_on_failure(self.save_dir, tag, self.needed_bytes, self.free_bytes):
            return self._save_files(iteration, trainer_state, kind)

    def _save_files(self, iteration: int, trainer_state: dict[str, Any], kind: str) -> Path:
        if not self.save_dir:
            raise ValueError("no checkpoint folder: set `save` to save checkpoints")
        tag, rank = tag_for(iteration, kind), _rank()
        folder = Path(self.save_dir) / tag
        if rank == 0:
            (folder / COMPLETE).unlink(missing_ok=True)  # an old save's markers
            (folder / PERMANENT).unlink(missing_ok=True)
        _barrier()
        rng = rng_state(self.tracker) if self.save_rng else None
        self._engine_save(tag, iteration, rng)
        if self.experts is not None:
            self.experts.save(folder, self.save_optim)
        if rng is not None:
            torch.save(rng, folder / f"rng_state_rank{rank}.pt")
        if self.save_optim:
            save_rank_state(self.engine.optimizer, folder, rank)
        if rank == 0:
            extra = {"iteration": iteration, "optimizer_saved": self.save_optim}
            torch.save({**trainer_state, **extra}, folder / TRAINER_STATE)
            if self.config_dict is not None:
                (folder / CONFIG_FILE).write_text(config_json(self.config_dict))
            if kind == "permanent":
                (folder / PERMANENT).write_text(tag)
        _barrier()  # every rank's files are on disk
        if rank == 0:
            mark_complete(folder, tag)
            write_latest(self.save_dir, tag)
            prune_checkpoints(self.save_dir, self.keep_last_n, self.pinned)
        _barrier()
        return folder

    def load(
        self,
        load_dir: str | None,
        *,
        finetune: bool = False,
        load_optim: bool = True,
        load_rng: bool = True,
    ) -> dict[str, Any] | None:
        """Restore the newest checkpoint under `load_dir`; returns its trainer state (None when
        there is none; only the weights, and None, with `finetune`), with the folder it read
        (`folder`).

        This rank's RNG state comes back as `state["rng_state"]` (None when not loaded), for
        `restore_rng` once the data iterators exist: creating a DataLoader iterator draws from
        torch's generator, and a resumed run must draw the same numbers as an unbroken one.
        """
        if not load_dir:
            return None
        tag = resume_tag(load_dir)
        if tag is None:
            log.info("no checkpoint under %s (no '%s' file): starting afresh", load_dir, LATEST)
            return None
        folder = Path(load_dir) / tag
        check_model_files(self.engine, folder)
        if not finetune and is_neox_checkpoint(folder):  # a run GPT-NeoX saved
            tied = self.engine.module.args.tied_embeddings
            state = neox_resume_state(self.engine, folder, load_optim, tied)
        else:
            state = self._trainer_state(folder, required=not finetune)
        if load_optim and not finetune and not state.get("optimizer_saved", True):
            log.warning("%s was saved without optimizer states (no_save_optim)", folder)
            load_optim = False
        if self.experts is not None:
            self.experts.check(folder)
        path, client = self._engine_load(load_dir, tag, load_optim and not finetune, finetune)
        if path is None:
            raise FileNotFoundError(
                f"DeepSpeed could not load checkpoint '{tag}' from {load_dir}; the folder is "
                "incomplete or was written by a different parallel layout"
            )
        if self.experts is not None:
            self.experts.load(folder, load_optim and not finetune)
        if finetune:
            return None
        if load_optim:
            load_rank_state(self.engine.optimizer, folder, _rank())
        state["rng_state"] = self._rng_state(folder, client) if load_rng else None
        state["folder"] = str(folder)
        return state

    @staticmethod
    def _rng_state(folder: Path, client: dict | None) -> dict[str, Any] | None:
        """This rank's RNG state: our `rng_state_rank{R}.pt`, else the streams GPT-NeoX keeps
        in the engine-state file (`neox_files.rng_from_client_state`), else None (warned)."""
        rng_file = folder / f"rng_state_rank{_rank()}.pt"
        if rng_file.is_file():
            return load_file(rng_file)
        from_neox = rng_from_client_state(client)
        if from_neox is None:
            log.warning("%s has no RNG state for rank %d; RNG not restored", folder, _rank())
        return from_neox

    def _engine_load(self, load_dir, tag: str, load_optim: bool, module_only: bool):
        """DeepSpeed's load, every file weights-only (see `safe_load.py`)."""
        use_safe_loading(self.engine)
        universal = (Path(load_dir) / tag / UNIVERSAL_STATE).is_file()
        on = universal and load_optim and not module_only
        try:
            # quiet: its bf16 optimizer prints `_load_legacy_checkpoint ...` on every resume
            with weights_only_loading(), _universal_loading(self.engine, on), quiet_deepspeed():
                path, client = self.engine.load_checkpoint(
                    load_dir,
                    tag=tag,
                    load_optimizer_states=load_optim,
                    load_lr_scheduler_states=False,
                    load_module_only=module_only,
                    custom_load_fn=load_module if is_plain(self.engine) else None,
                )
        except pickle.UnpicklingError as err:
            raise refusal(Path(load_dir) / tag, err) from err
        if on and self.engine.zero_optimization_partition_weights():
            _fix_zero3_universal_load(self.engine, Path(load_dir) / tag)
        if load_optim and not module_only:
            keep_configured_scaler(self.engine)
        return path, client

    @staticmethod
    def _trainer_state(folder: Path, required: bool) -> dict[str, Any]:
        path = folder / TRAINER_STATE
        if path.is_file():
            return load_file(path)
        if required:
            raise FileNotFoundError(
                f"{path} is missing: {folder} is not a checkpoint of this trainer (or is "
                "incomplete); use finetune: true to load its weights only"
            )
        return {}

    def restore_rng(self, state: dict[str, Any] | None) -> None:
        """Apply the RNG state `load` returned (nothing when there is none)."""
        if state and state.get("rng_state") is not None:
            set_rng_state(state["rng_state"], self.tracker)
