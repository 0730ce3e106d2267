"""Checkpoint files are loaded weights-only: a pickled object that would run code is refused,
with a message naming the file, by every loader (the trainer's resume, DeepSpeed's checkpoint
engine, the checkpoint tools' reader); what our checkpoints really hold still loads."""

from __future__ import annotations

import os
import pickle
import random
from pathlib import Path

import numpy as np
import pytest
import torch

from megatron.checkpoint.folders import TRAINER_STATE, write_latest
from megatron.checkpoint.safe_load import (
    FORCE_WEIGHTS_ONLY,
    UnsafeCheckpointError,
    load_file,
    use_safe_loading,
    weights_only_loading,
)
from megatron.checkpoint_tools import CheckpointReader
from megatron.training.checkpoint.checkpoint_io import CheckpointIO, rng_state
from tests.tiny import tiny_config
from tests.unit.training.test_checkpointing import FakeEngine


class Exploit:
    """Unpickling it runs a shell command (here: one that leaves a file behind)."""

    def __init__(self, flag: Path):
        self.flag = flag

    def __reduce__(self):
        return (os.system, (f"touch {self.flag}",))


def _plant(path: Path, flag: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save({"iteration": 4, "weights": torch.ones(2), "payload": Exploit(flag)}, path)


def test_trainer_resume_refuses_code_in_a_checkpoint(tmp_path):
    flag = tmp_path / "pwned"
    io = CheckpointIO(FakeEngine(), str(tmp_path / "ckpt"))
    io.save(4, {"consumed_samples": 32})
    _plant(tmp_path / "ckpt" / "global_step4" / TRAINER_STATE, flag)
    with pytest.raises(UnsafeCheckpointError, match=r"trainer_state\.pt.*system.*run arbitrary"):
        CheckpointIO(FakeEngine(), None).load(str(tmp_path / "ckpt"))
    assert not flag.exists()
    assert pickle.loads(pickle.dumps(Exploit(flag))) == 0 and flag.exists()  # it really runs


def test_checkpoint_tools_reader_refuses_code(tmp_path):
    flag = tmp_path / "pwned"
    folder = tmp_path / "ckpt" / "global_step4"
    _plant(folder / "mp_rank_00_model_states.pt", flag)
    _plant(folder / TRAINER_STATE, flag)
    write_latest(tmp_path / "ckpt", "global_step4")
    reader = CheckpointReader(tmp_path / "ckpt", cfg=tiny_config())
    with pytest.raises(UnsafeCheckpointError, match="mp_rank_00_model_states.pt"):
        reader.engine_state()
    with pytest.raises(UnsafeCheckpointError, match=TRAINER_STATE):
        reader.trainer_state()
    assert not flag.exists()


def test_deepspeed_loads_go_through_the_allow_list(tmp_path):
    """DeepSpeed's checkpoint engine (what engine.load_checkpoint reads every file with) and
    its direct `torch.load(weights_only=False)` calls."""
    from types import SimpleNamespace

    from deepspeed.runtime.checkpoint_engine import TorchCheckpointEngine

    flag = tmp_path / "pwned"
    _plant(tmp_path / "bad.pt", flag)
    engine = SimpleNamespace(checkpoint_engine=TorchCheckpointEngine())
    use_safe_loading(engine)
    with pytest.raises(UnsafeCheckpointError, match=r"bad\.pt"):
        engine.checkpoint_engine.load(str(tmp_path / "bad.pt"), map_location="cpu")
    with weights_only_loading(), pytest.raises(pickle.UnpicklingError):
        torch.load(tmp_path / "bad.pt", weights_only=False)
    assert FORCE_WEIGHTS_ONLY not in os.environ  # restored on leaving
    assert not flag.exists()


def test_what_our_checkpoints_hold_loads(tmp_path):
    from deepspeed.runtime.fp16.loss_scaler import DynamicLossScaler
    from deepspeed.runtime.zero.config import ZeroStageEnum

    random.random()
    state = {
        "rng": rng_state(),  # NumPy's RNG state is an ndarray
        "loss_scaler": DynamicLossScaler(2.0**16, 1000, 1.0, 2, False),
        "zero_stage": ZeroStageEnum.gradients,
        "moments": [torch.zeros(3)],
    }
    torch.save(state, tmp_path / "ok.pt")
    loaded = load_file(tmp_path / "ok.pt")
    assert np.array_equal(loaded["rng"]["numpy"][1], state["rng"]["numpy"][1])
    assert loaded["loss_scaler"].cur_scale == 2.0**16
    assert loaded["zero_stage"] == ZeroStageEnum.gradients
