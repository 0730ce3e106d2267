"""A GPT-NeoX ZeRO-1 folder, resharded by `tools/reshard.py` to tensor-parallel size 2, goes on
training where it stopped (issue 'Faithful in the corners', item 9).

The folder is made as `test_neox_zero1_resume.py` makes one (`to_neox_folder`): a real
DeepSpeed run of the plain engine (tied embedding, tp 1, dp 2, ZeRO-1, fp32) trains 3 steps
and saves, and its folder is turned into GPT-NeoX's form: GPT-NeoX's sequential names and
current MLP names (`sequential.{index}.`, `mlp.linear1`/`linear2`) in the module and in
DeepSpeed's `param_shapes`, GPT-NeoX's `iteration`, `args` and `AnnealingLR` state in the
engine-state file, its ZeRO partitions as DeeperSpeed writes them, and neither our
`trainer_state.pt` nor our `config.json`. The tool converts it as a user runs it (its `main`,
given the run's config file, since the folder holds none) to tp 2 with ZeRO-1, in DeepSpeed's
universal layout. Two gloo ranks at (tp 2, dp 1), gradient accumulation doubled so that the
global batch stays 8, resume from the new folder through `pretrain`.

Checked against the unbroken 6-step run at (tp 1, dp 2), which reads no checkpoint: the
resumed run's losses equal its steps 4-6 within 1e-5. The resumed config asks for another peak
LR with `use_checkpoint_lr_scheduler: true`, so the LR schedule must come from GPT-NeoX's
entries through the tool; the data position (3 x 8 samples) and the Adam moments and fp32
master weights read from GPT-NeoX's partitions by its names show in the losses as well. The
tool's report says the optimizer state was converted, not dropped.
"""

from __future__ import annotations

import contextlib
import io
import shutil
from pathlib import Path

import pytest

from tests.distributed import run_distributed
from tests.parallel.test_neox_zero1_resume import (
    ITERS,
    LAYOUTS,
    LR,
    STOP,
    _settings,
    to_neox_folder,
)
from tests.tiny import resolve, write_config

pytestmark = pytest.mark.slow

LAYOUT = LAYOUTS["plain_tied"]  # GPT-NeoX's sequential names and its MLP names
TP2 = dict(model_parallel_size=2, gradient_accumulation_steps=4)  # global batch 8 on dp 1


def _reshard(source: Path, output: Path, config: Path) -> str:
    """`tools/reshard.py` as a user runs it; its report."""
    from tools import reshard as tool

    argv = ["--checkpoint", str(source), "--output", str(output), "--config", str(config)]
    argv += ["--model-parallel-size", "2", "--pipe-parallel-size", "0", "--zero-stage", "1"]
    report = io.StringIO()
    with contextlib.redirect_stdout(report):
        assert tool.main(argv) == 0
    return report.getvalue()


def _worker(rank, world_size, root: Path):
    import torch.distributed as dist

    from megatron.training import pretrain

    unbroken = pretrain(resolve(_settings(root / "unbroken", save=None, load=None, **LAYOUT), 2))
    neox = _settings(root / "neox", exit_interval=STOP, **LAYOUT)
    pretrain(resolve(neox, 2))
    report = ""
    if rank == 0:
        saved = root / "neox" / "ckpt" / f"global_step{STOP}"
        to_neox_folder(saved, plain=True, tied=True)
        config = write_config(root / "neox", _settings(root / "neox", **LAYOUT))
        report = _reshard(saved, root / "tp2" / "ckpt", config)
    dist.barrier()
    other = _settings(root / "tp2", lr=5 * LR, use_checkpoint_lr_scheduler=True, save=None)
    resumed = pretrain(resolve({**other, **LAYOUT, **TP2}, 2))
    return dict(unbroken=unbroken.losses, resumed=resumed.losses, report=report)


def test_a_neox_zero1_folder_resharded_to_tp2_resumes_exactly(tmp_path):
    out = run_distributed(_worker, 2, tmp_path, timeout=900)[0]
    assert "-> tp=2, pp=0, ZeRO stage 1" in out["report"], out["report"]
    assert "optimizer state: converted from ZeRO stage 1" in out["report"], out["report"]
    assert len(out["unbroken"]) == ITERS
    assert len(out["resumed"]) == ITERS - STOP
    worst = max(abs(a - b) for a, b in zip(out["resumed"], out["unbroken"][STOP:]))
    print(f"max loss difference after the reshard to tp 2: {worst:.2e}")
    assert out["resumed"] == pytest.approx(out["unbroken"][STOP:], abs=1e-5)
    shutil.rmtree(tmp_path, ignore_errors=True)
