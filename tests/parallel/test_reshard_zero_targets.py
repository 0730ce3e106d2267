"""Elastic resume onto ZeRO 1/2 (issue 16; gloo, 4 ranks, fp32, dropout 0): a run trained 4
steps at (pp2, dp2) ZeRO-1 is converted by `tools/reshard.py --zero-stage` into DeepSpeed's
universal layout for (tp1, plain engine, dp4) ZeRO-2 and (tp2, pp1, dp2) ZeRO-1, and resumed
there through DeepSpeed's own `load_universal` path for 4 more steps.

- The losses equal resuming the same checkpoint at the source layout (1e-5 relative); the
  global batch stays 8 (micro batch 2 x accumulation x dp).
- Inside each target engine, right after `CheckpointIO.load`, every parameter's Adam moments,
  fp32 master weight and step, read back through DeepSpeed's `safe_get_full_*` accessors
  (which gather the rank's ZeRO fragments), equal the source checkpoint's element for
  element, cut to that rank's tensor-parallel shard.

One spawn runs it all (start-up is the expensive part).
"""

from __future__ import annotations

import pytest
import torch

from tests.distributed import run_distributed
from tests.unit.training.tiny_run import resolve, tiny_settings

pytestmark = pytest.mark.slow

RUN = dict(hidden_dropout=0.0, attention_dropout=0.0, eval_interval=1000, train_iters=8)
SOURCE = dict(pipe_parallel_size=2, zero_optimization={"stage": 1}, gradient_accumulation_steps=2)
# name: target layout on 4 ranks, with the accumulation that keeps the global batch at 8.
TARGETS = {
    "plain_dp4_zero2": dict(
        pipe_parallel_size=0, zero_optimization={"stage": 2}, gradient_accumulation_steps=1
    ),
    "tp2_pp1_dp2_zero1": dict(
        model_parallel_size=2,
        pipe_parallel_size=1,
        zero_optimization={"stage": 1},
        gradient_accumulation_steps=2,
    ),
}


def _settings(tmp, name, **changes):
    return tiny_settings(tmp / name, **RUN, **changes)


def _convert(tmp, name) -> None:
    """The product's command line."""
    from tools import reshard as tool

    layout = {**tiny_settings(tmp), **TARGETS[name]}
    argv = ["--checkpoint", str(tmp / "source" / "ckpt"), "--output", str(tmp / name / "ckpt")]
    argv += ["--model-parallel-size", str(layout["model_parallel_size"])]
    argv += ["--pipe-parallel-size", str(layout["pipe_parallel_size"])]
    assert tool.main(argv + ["--zero-stage", str(layout["zero_optimization"]["stage"])]) == 0


def _engine_state_matches(cfg, source_folder) -> int:
    """Build the target engine as `pretrain` does, load the converted checkpoint through
    `CheckpointIO.load`, and compare what DeepSpeed holds with the source checkpoint's state;
    returns the number of values compared on this rank."""
    from deepspeed.utils import safe_get_full_fp32_param, safe_get_full_optimizer_state

    from megatron.checkpoint_tools.optimizer_state import read_optimizer_state
    from megatron.checkpoint_tools.reader import CheckpointReader
    from megatron.checkpoint_tools.schema import resize_vocab
    from megatron.training.checkpointing import CheckpointIO
    from megatron.training.engine_setup import build_engine
    from megatron.training.initialize import initialize_distributed, seed_everything

    topology = initialize_distributed(cfg)
    seed_everything(cfg.training.seed + 1)  # other initial weights than the saved ones
    engine = build_engine(cfg, topology, cfg.training.train_iters).engine
    assert CheckpointIO(engine, None).load(cfg.checkpointing.load)["iteration"] == 4
    reader = CheckpointReader(source_folder)
    original, why = read_optimizer_state(reader)
    assert original is not None, why
    weights = reader.state_dict()
    tp, rank = cfg.parallel.model_parallel_size, topology.tp_rank
    compared = 0
    for name, param in engine.module.named_parameters():
        spec = reader.schema.spec(name)
        saved = {**original.per_param[name], "fp32": weights[name]}
        for key in ("fp32", "exp_avg", "exp_avg_sq"):
            full = saved[key]
            if spec.is_vocab_table:  # the target pads its vocabulary for its own tp
                full = resize_vocab(full, param.shape[0] * tp)
            dim = spec.partition_dim
            want = full if dim is None else full.chunk(tp, dim)[rank]
            if key == "fp32":
                got = safe_get_full_fp32_param(param)
            else:
                got = safe_get_full_optimizer_state(param, key)
            assert torch.equal(got.cpu(), want), (name, key)
            compared += got.numel()
    steps = {float(s["step"]) for s in engine.optimizer.optimizer.state.values()}
    assert steps == {4.0}, steps
    return compared


def _run(rank, world_size, tmp):
    import torch.distributed as dist

    from megatron.training import pretrain

    pretrain(resolve(_settings(tmp, "source", exit_interval=4, **SOURCE), 4))
    losses = {}
    reference = _settings(tmp, "reference", **SOURCE, load=str(tmp / "source" / "ckpt"), save=None)
    losses["reference"] = pretrain(resolve(reference, 4)).losses
    compared = {}
    for name, layout in TARGETS.items():
        if rank == 0:
            _convert(tmp, name)
        dist.barrier()
        cfg = resolve(_settings(tmp, name, **layout, save=None), 4)
        compared[name] = _engine_state_matches(cfg, tmp / "source" / "ckpt")
        losses[name] = pretrain(cfg).losses
    return {"losses": losses, "compared": compared}


def test_resume_converted_checkpoint_with_zero_1_and_2_at_another_layout(tmp_path):
    results = run_distributed(_run, 4, tmp_path, timeout=1500)
    reference = results[0]["losses"]["reference"]
    assert len(reference) == 4
    for name in TARGETS:
        losses = results[0]["losses"][name]
        worst = max(abs(a - b) / abs(b) for a, b in zip(losses, reference))
        print(f"{name}: max relative loss difference {worst:.2e}")
        assert losses == pytest.approx(reference, rel=1e-5), name
        assert all(r["compared"][name] > 0 for r in results), name
