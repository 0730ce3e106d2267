"""Where a checkpoint is and how it is laid out, read from its files (no DeepSpeed engine).

A run saves `{save}/global_step{N}/` (see `megatron/training/checkpoint/checkpoint_io.py`)
in DeepSpeed's layout, which depends on the engine:

| engine (`pipe_parallel_size`) | model weights                                                 |
| ----------------------------- | ------------------------------------------------------------- |
| pipeline (>= 1)               | `layer_{i:02d}-model_{t:02d}-model_states.pt`: layer `i`'s    |
|                               | state dict at tensor-parallel rank `t` (written once per dp)  |
| plain (0), ZeRO 0-2           | `mp_rank_{t:02d}_model_states.pt` key `module`                |
| plain, ZeRO 3                 | fp32 partitions in `zero_pp_rank_{d}_mp_rank_{t:02d}_optim_*` |

Beside them, `mp_rank_{m:02d}_model_states.pt` (one per model-parallel rank `m = stage * tp +
t`) holds DeepSpeed's engine state and, without ZeRO, the optimizer state; with ZeRO it is in
`zero_pp_rank_{d}_mp_rank_{m:02d}_optim_states.pt`. The tensor- and pipeline-parallel sizes
are read from the file names (`megatron/checkpoint/deepspeed_files.py`), so they are right even
when the config was edited since.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from megatron.checkpoint.deepspeed_files import LAYER_FILE, MP_RANK_FILE, ZERO_MODEL_FILE
from megatron.checkpoint.folders import (  # noqa: F401 (COMPLETE, resume_tag: re-exported)
    COMPLETE,
    CONFIG_FILE,
    LATEST,
    TAG,
    TRAINER_STATE,
    read_latest,
    resume_tag,
)


class CheckpointError(ValueError):
    """A checkpoint folder that cannot be read, with what is wrong and what would be valid."""


def locate(path: str | Path) -> Path:
    """The `global_step{N}` folder `path` means: the folder itself, or what `{path}/latest`
    names."""
    path = Path(path)
    if not path.exists():
        raise CheckpointError(
            f"checkpoint '{path}' does not exist; pass the save folder of a trained run (it "
            f"holds '{LATEST}') or one of its global_step folders"
        )
    if not path.is_dir():
        raise CheckpointError(f"checkpoint '{path}' is a file, not a checkpoint folder")
    if (path / LATEST).is_file():
        return path / read_latest(path)
    if any(MP_RANK_FILE.match(f.name) or ZERO_MODEL_FILE.match(f.name) for f in path.iterdir()):
        return path
    steps = sorted(p.name for p in path.iterdir() if TAG.match(p.name))
    hint = f"; it holds {', '.join(steps)} (pass one of them)" if steps else ""
    raise CheckpointError(
        f"checkpoint '{path}' has no '{LATEST}' file and no DeepSpeed model files; pass a "
        f"save folder with '{LATEST}' or a global_step folder{hint}"
    )


@dataclass(frozen=True)
class CheckpointLayout:
    """The parallel layout of one checkpoint folder."""

    folder: Path
    tp: int
    pp: int
    """`pipe_parallel_size` of the run: stages of the pipeline engine, 0 for the plain one."""
    zero3: bool = False

    @property
    def pipeline(self) -> bool:
        return self.pp >= 1

    @property
    def stages(self) -> int:
        return max(1, self.pp)

    @property
    def tag(self) -> str:
        return self.folder.name

    @property
    def iteration(self) -> int | None:
        match = TAG.match(self.folder.name)
        return int(match.group(1)) if match else None

    @property
    def config_file(self) -> Path:
        return self.folder / CONFIG_FILE

    @property
    def trainer_state_file(self) -> Path:
        return self.folder / TRAINER_STATE

    def describe(self) -> str:
        engine = f"pipeline engine, {self.pp} stage(s)" if self.pipeline else "plain engine"
        return f"tp={self.tp}, pp={self.pp} ({engine}{', ZeRO-3' if self.zero3 else ''})"


def read_layout(path: str | Path) -> CheckpointLayout:
    """Find the checkpoint folder (see `locate`) and read its layout from the file names."""
    folder = locate(path)
    names = [f.name for f in folder.iterdir()]
    layer_ranks = {int(m.group(2)) for n in names if (m := LAYER_FILE.match(n))}
    mp_ranks = {int(m.group(1)) for n in names if (m := MP_RANK_FILE.match(n))}
    zero3 = {int(m.group(2)) for n in names if (m := ZERO_MODEL_FILE.match(n))}
    if layer_ranks:
        tp = len(layer_ranks)
        if not mp_ranks or len(mp_ranks) % tp:
            raise CheckpointError(
                f"checkpoint '{folder}' has layer files for {tp} tensor-parallel rank(s) but "
                f"{len(mp_ranks)} mp_rank_*_model_states.pt files (expected stages x {tp}); "
                "the folder is incomplete"
            )
        return CheckpointLayout(folder, tp=tp, pp=len(mp_ranks) // tp)
    if mp_ranks:
        return CheckpointLayout(folder, tp=len(mp_ranks), pp=0)
    if zero3:
        return CheckpointLayout(folder, tp=len(zero3), pp=0, zero3=True)
    raise CheckpointError(
        f"checkpoint '{folder}' holds no DeepSpeed model files (layer_*-model_states.pt or "
        "mp_rank_*_model_states.pt)"
    )
