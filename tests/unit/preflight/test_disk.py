"""The `save` pre-flight check and the checkpoint size estimate it shares with the run: the
optimizer states counted per type are what the real optimizers keep after a step; a file in the
way or too little space refuses the launch, a little space warns; the run's check before each
save refuses the same way (rank 0 decides for every rank) and leaves `latest` alone."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from megatron.checkpoint.folders import list_checkpoints, read_latest
from megatron.checkpoint.size import checkpoint_size, format_bytes
from megatron.config import config_from_dict
from megatron.config.groups.optimizer import OPTIMIZER_TYPES
from megatron.preflight import ERROR, OK, WARNING, run_preflight
from megatron.training.checkpoint.checkpoint_io import CheckpointIO
from megatron.training.checkpoint.disk_space import CheckpointSaveError
from megatron.training.optim.optimizers import build_optimizer
from tests.distributed import run_distributed
from tests.tiny import BARE

TINY = dict(BARE, tokenizer_type="CharLevelTokenizer")
PYTHIA_160M = dict(
    num_layers=12, hidden_size=768, num_attention_heads=12, seq_length=2048,
    max_position_embeddings=2048, pos_emb="rotary", no_weight_tying=True,
    train_iters=2, train_micro_batch_size_per_gpu=2,
)  # fmt: skip
PYTHIA_160M_PARAMETERS = 162_322_944  # with the vocabulary padded to 50304


def save_findings(tmp_path, script="train.py", **keys):
    keys.setdefault("save", str(tmp_path / "ckpt"))
    cfg = config_from_dict({**TINY, **keys}, world_size=1, vocab_size=512)
    return [f for f in run_preflight(cfg, script) if f.check == "save"]


@pytest.mark.parametrize(
    "kind, params",
    [
        ("Adam", {}),
        ("AdamW", {"amsgrad": True}),
        ("CPU_torch_adam", {}),
        ("Lion", {}),
        ("SGD", {}),
        ("SGD", {"momentum": 0.9}),
        ("SM3", {"momentum": 0.9}),
        ("madgrad_wd", {}),
    ],
)
def test_state_copies_are_what_the_optimizer_keeps(kind, params):
    weight = torch.nn.Parameter(torch.randn(256, 256))  # SM3's row/column sums: 0.8 %
    optimizer = build_optimizer([{"params": [weight]}], kind, 1e-3, 0.0, dict(params))
    weight.grad = torch.randn_like(weight)
    optimizer.step()
    kept = sum(
        t.numel()
        for state in optimizer.state.values()
        for t in state.values()
        if torch.is_tensor(t) and t.is_floating_point() and t.numel() > 1
    )
    expected = OPTIMIZER_TYPES[kind].saved_states(params, 1)
    assert kept / weight.numel() == pytest.approx(expected, abs=0.01)


@pytest.mark.parametrize(
    "keys, per_parameter",
    [
        # fp32, no ZeRO: weights + Adam's two moments
        (dict(optimizer={"type": "Adam", "params": {"lr": 1e-4}}), 4 + 8),
        # bf16 weights, fp32 master copy, two moments; ZeRO-1 splits them, same total
        (dict(precision="bf16", zero_optimization={"stage": 1}), 2 + 4 + 8),
        # fp32 with ZeRO-2: ZeRO's fp32 partition is a tensor of its own
        (dict(zero_optimization={"stage": 2}, pipe_parallel_size=0), 4 + 4 + 8),
        # ZeRO-3: the weights live only in the fp32 partitions
        (dict(precision="bf16", zero_optimization={"stage": 3}, pipe_parallel_size=0), 4 + 8),
        (dict(precision="fp16", no_save_optim=True), 2),
        (dict(optimizer={"type": "Lion", "params": {"lr": 1e-4}}), 4 + 4),
    ],
)
def test_bytes_per_parameter_of_pythia_160m(keys, per_parameter):
    cfg = config_from_dict({**PYTHIA_160M, **keys}, world_size=1, vocab_size=50277)
    size = checkpoint_size(cfg)
    assert size.parameters == PYTHIA_160M_PARAMETERS
    assert size.total == PYTHIA_160M_PARAMETERS * per_parameter


def test_reports_the_estimate_and_the_free_space(tmp_path):
    (found,) = save_findings(tmp_path)
    assert found.level == OK, found.message
    assert "per checkpoint" in found.message and "free under" in found.message
    assert not (tmp_path / "ckpt").exists()  # nothing created before launch


def test_a_file_in_the_way_is_refused(tmp_path):
    (tmp_path / "ckpt").write_text("not a folder")
    (found,) = save_findings(tmp_path)
    assert found.level == ERROR
    assert f"save folder '{tmp_path / 'ckpt'}' is a file, not a folder" in found.message
    (found,) = save_findings(tmp_path, save=str(tmp_path / "ckpt" / "run1"))
    assert found.level == ERROR and f"'{tmp_path / 'ckpt'}' is a file" in found.message


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes anywhere")
def test_a_folder_without_permission_is_refused(tmp_path):
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o500)
    (found,) = save_findings(tmp_path, save=str(locked / "ckpt"))
    assert found.level == ERROR and "not writable" in found.message


@pytest.mark.parametrize(
    "checkpoints_free, keep, level",
    [(0.5, None, ERROR), (2.5, None, WARNING), (3.5, None, OK), (4.5, 5, WARNING), (6, 5, OK)],
)
def test_too_little_space_refuses_and_little_warns(
    tmp_path, monkeypatch, checkpoints_free, keep, level
):
    cfg = config_from_dict({**TINY, "save": str(tmp_path)}, world_size=1, vocab_size=512)
    one = checkpoint_size(cfg).total
    free = int(one * checkpoints_free)
    monkeypatch.setattr("megatron.preflight.disk.free_bytes_at", lambda path: free)
    (found,) = save_findings(tmp_path, keep_last_n_checkpoints=keep)
    assert found.level == level, found.message
    assert f"{format_bytes(one)} per checkpoint" in found.message
    assert f"{format_bytes(free)} free under '{tmp_path / 'ckpt'}'" in found.message
    assert f"({int(checkpoints_free)} checkpoint(s))" in found.message


def test_not_checked_for_inference_or_without_save(tmp_path):
    assert save_findings(tmp_path, script="generate.py") == []
    assert save_findings(tmp_path, save=None) == []


class Engine:
    """Stands in for DeepSpeed's engine in `CheckpointIO` (one process): one file per save."""

    optimizer = None

    def save_checkpoint(self, save_dir, tag, save_latest=True, client_state=None):
        (Path(save_dir) / tag).mkdir(parents=True, exist_ok=True)
        (Path(save_dir) / tag / "mp_rank_00_model_states.pt").write_bytes(b"w" * 100)


def test_the_run_stops_before_a_save_that_does_not_fit(tmp_path):
    free = {"bytes": 10_000}
    io = CheckpointIO(
        Engine(), str(tmp_path), needed_bytes=5_000, free_bytes=lambda path: free["bytes"]
    )
    io.save(1, {})
    free["bytes"] = 4_999
    with pytest.raises(CheckpointSaveError) as refused:
        io.save(2, {})
    message = str(refused.value)
    assert f"{tmp_path / 'global_step2'}" in message
    assert "(4,999 bytes) free" in message and "(5,000 bytes)" in message
    assert read_latest(tmp_path) == "global_step1"
    assert [it for it, _ in list_checkpoints(tmp_path)] == [1]  # nothing of step 2 written


def test_a_failed_write_stops_the_run_naming_folder_and_space(tmp_path):
    io = CheckpointIO(Engine(), str(tmp_path), needed_bytes=100, free_bytes=lambda path: 10**9)
    io.save(1, {})
    (tmp_path / "global_step2").write_text("a file in the way")
    with pytest.raises(CheckpointSaveError) as failed:
        io.save(2, {})
    message = str(failed.value)
    assert f"could not save checkpoint {tmp_path / 'global_step2'}" in message
    assert "(1,000,000,000 bytes) free" in message and "(100 bytes)" in message
    assert isinstance(failed.value.__cause__, OSError)
    assert read_latest(tmp_path) == "global_step1"


def _refused_on_every_rank(rank, world_size, save_dir):
    # Only rank 0 measures: rank 1 sees plenty of space here, and must stop all the same.
    free = 10 if rank == 0 else 10**12
    io = CheckpointIO(Engine(), save_dir, needed_bytes=1_000, free_bytes=lambda path: free)
    try:
        io.save(1, {})
    except CheckpointSaveError as err:
        return str(err)
    return None


def test_rank_0_decides_for_every_rank(tmp_path):
    messages = run_distributed(_refused_on_every_rank, 2, str(tmp_path))
    assert all(m and "10 B (10 bytes) free" in m for m in messages), messages
    assert not (tmp_path / "global_step1").exists()
