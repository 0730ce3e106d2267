"""`tools/reshard.py --zero-stage 1/2` writes DeepSpeed's universal layout
(`megatron/checkpoint_tools/universal.py`):

- DeepSpeed's own per-parameter reader (`universal_checkpoint.load_hp_checkpoint_state`, what
  its ZeRO 1/2 optimizers call under `load_universal`) takes from our files exactly each
  tensor-parallel rank's shard of the weights and Adam moments, also for a ZeRO fragment that
  starts inside the parameter, and the step count;
- `zero/optimizer_state.pt` holds the groups in the target optimizer's order with their own
  hyperparameters, loadable weights-only;
- targets DeepSpeed cannot restore (ZeRO 3 at tp > 1, ZeRO 2 on the pipeline engine), a
  ZeRO-3 target without Adam's states, and a scalar state other than the step are refused,
  naming why;
- the pre-flight resumes the universal checkpoint with ZeRO 1 at any data-parallel size,
  refuses ZeRO 0 there, and names `--zero-stage` in the reshard command it prints;
  `inspect_checkpoint --resume-at` says direct / reshard / cannot (ZeRO 3 at tp 2) by the
  same rule;
- a ZeRO-3 target at tp 1 gets what DeepSpeed's ZeRO-3 universal loader reads (the step in
  `optimizer_state_dict`, `zero_pp_rank_0_mp_rank_00_model_states.pt`), and the pre-flight
  resumes it with ZeRO 3 at any dp, but not its weights alone (`finetune`).
"""

from __future__ import annotations

import pytest
import torch

from tests.tiny import resolve, tiny_settings


def _optimizer_state(schema):
    from megatron.checkpoint_tools.optimizer_state import FullOptimizerState

    gen = torch.Generator().manual_seed(1)
    full = FullOptimizerState()
    for name, spec in schema.params.items():
        full.per_param[name] = {
            "step": torch.tensor(4.0),
            "exp_avg": torch.randn(spec.shape, generator=gen),
            "exp_avg_sq": torch.rand(spec.shape, generator=gen),
        }
    common = {"lr": 1e-3, "betas": (0.9, 0.95), "eps": 1e-8}
    full.groups = {
        "decay": {**common, "weight_decay": 0.1, "name": "decay"},
        "no_decay": {**common, "weight_decay": 0.0, "name": "no_decay"},
    }
    return full


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    """A ZeRO-0 checkpoint at tp=1, pp=1, converted to tp=2, pp=1 for ZeRO 1."""
    from megatron.checkpoint_tools import ModelSchema, reshard_checkpoint, write_checkpoint
    from megatron.model import ModelArgs

    folder = tmp_path_factory.mktemp("universal")
    cfg = resolve(tiny_settings(folder), 1)
    schema = ModelSchema(ModelArgs.from_config(cfg))
    gen = torch.Generator().manual_seed(0)
    state = {n: torch.randn(s.shape, generator=gen) for n, s in schema.params.items()}
    optimizer = _optimizer_state(schema)
    write_checkpoint(
        folder / "ckpt",
        schema=schema,
        state=state,
        tp=1,
        pp=1,
        iteration=4,
        config_dict=cfg.to_dict(),
        optimizer=optimizer,
        trainer_state={"iteration": 4, "consumed_samples": 32},
    )
    result = reshard_checkpoint(folder / "ckpt", folder / "out", tp=2, pp=1, zero_stage=1)
    return {"folder": folder, "result": result, "state": state, "optimizer": optimizer}


def _deepspeed_reads(param_dir, shape, tp, tp_rank, start, numel):
    """What DeepSpeed's universal reader puts into a ZeRO fragment `[start, start + numel)` of
    the flattened shard of rank `tp_rank`: (fp32 fragment, {state: fragment}, step)."""
    from deepspeed.checkpoint.universal_checkpoint import load_hp_checkpoint_state
    from deepspeed.utils.tensor_fragment import fragment_address, tensor_fragment

    lp = torch.nn.Parameter(torch.zeros(shape))
    lp._hp_mapping = tensor_fragment(
        lp_fragment=lp.detach().view(-1).narrow(0, start, numel),
        lp_fragment_address=fragment_address(numel=numel, start=start),
        hp_fragment=torch.zeros(numel),
        hp_fragment_address=fragment_address(numel=numel, start=0),
        gradient_dict={},
        offload_gradient_dict={},
        use_offload=False,
        param_group_index=0,
    )
    step = load_hp_checkpoint_state(lp, str(param_dir), tp_rank, tp)
    return lp._hp_mapping.hp_fragment, lp._hp_mapping.optim_fragment, step


def test_deepspeed_reads_each_ranks_shard_from_the_written_files(converted):
    from megatron.checkpoint_tools import ModelSchema
    from megatron.checkpoint_tools.reader import CheckpointReader
    from megatron.checkpoint_tools.schema import resize_vocab

    out = converted["result"].folder
    schema = ModelSchema(CheckpointReader(out).args)  # the target's (padded for tp=2)
    tp, compared = 2, 0
    for name, spec in schema.params.items():
        saved = {**converted["optimizer"].per_param[name], "fp32": converted["state"][name]}
        for rank in range(tp):
            shard_shape = list(spec.shape)
            if spec.partition_dim is not None:
                shard_shape[spec.partition_dim] //= tp
            total = int(torch.Size(shard_shape).numel())
            start = total // 3  # a ZeRO fragment that starts inside the parameter
            fp32, moments, step = _deepspeed_reads(
                out / "zero" / name, shard_shape, tp, rank, start, total - start
            )
            assert float(step) == 4.0
            for key, got in (("fp32", fp32), *moments.items()):
                full = saved[key]
                full = resize_vocab(full, spec.shape[0]) if spec.is_vocab_table else full
                want = schema.shard(name, full, tp, rank).flatten()[start:]
                assert torch.equal(got, want), (name, key, rank)
                compared += 1
            assert sorted(moments) == ["exp_avg", "exp_avg_sq"]
    assert compared == 3 * tp * len(schema.params)


def test_optimizer_state_file_has_the_target_groups(converted):
    from megatron.checkpoint.safe_load import load_file

    out = converted["result"].folder
    saved = load_file(out / "zero" / "optimizer_state.pt")  # weights-only
    groups = saved["param_groups"]
    assert [g["name"] for g in groups] == ["decay", "no_decay"]
    assert [g["weight_decay"] for g in groups] == [0.1, 0.0] and saved["ds_version"]
    report = converted["result"].report()
    assert "ZeRO stage 1" in report and "universal layout" in report
    assert load_file(out / "mp_rank_00_model_states.pt")["optimizer"] is None


def test_targets_deepspeed_cannot_restore_are_refused(converted, tmp_path):
    from megatron.checkpoint_tools import ModelSchema, reshard_checkpoint
    from megatron.checkpoint_tools.layout import CheckpointError
    from megatron.checkpoint_tools.reader import CheckpointReader
    from megatron.checkpoint_tools.universal import write_universal_state

    source = converted["folder"] / "ckpt"
    with pytest.raises(ValueError, match="ZeRO-3 universal loader does not split"):
        reshard_checkpoint(source, tmp_path / "z3", tp=2, pp=0, zero_stage=3)
    with pytest.raises(ValueError, match="pipeline engine runs ZeRO stage 0 or 1 only"):
        reshard_checkpoint(source, tmp_path / "z2", tp=1, pp=1, zero_stage=2)
    schema = ModelSchema(CheckpointReader(source).args)
    optimizer = _optimizer_state(schema)
    first = next(iter(schema.params))
    optimizer.per_param[first]["k"] = 3  # a scalar DeepSpeed would load as a tensor state
    with pytest.raises(CheckpointError, match="restores Adam's"):
        write_universal_state(
            tmp_path,
            schema=schema,
            weights=converted["state"],
            optimizer=optimizer,
            stages=1,
            tp=1,
            zero_stage=3,
        )
    with pytest.raises(CheckpointError, match=f"'k' of '{first}' is a scalar"):
        write_universal_state(
            tmp_path, schema=schema, weights=converted["state"], optimizer=optimizer, stages=1, tp=1
        )


def _load_findings(load, world_size, **keys):
    from megatron.preflight import run_preflight

    settings = tiny_settings(load.parent, load=str(load), **keys)
    cfg = resolve(settings, world_size)
    return [f for f in run_preflight(cfg, "train.py") if f.check == "load"]


def test_preflight_resumes_it_with_zero1_at_any_dp_and_names_the_stage(converted):
    from megatron.preflight import ERROR

    out = converted["result"].folder.parent
    tp2 = dict(model_parallel_size=2, pipe_parallel_size=1)
    for world in (2, 4):  # dp 1 and 2
        found = _load_findings(out, world, zero_optimization={"stage": 1}, **tp2)
        assert ERROR not in [f.level for f in found], found
    (zero0, *_) = _load_findings(out, 2, zero_optimization={"stage": 0}, **tp2)
    assert zero0.level == ERROR and "a ZeRO-0 engine restores nothing" in zero0.message
    assert "--zero-stage 0 and load the new folder with zero_optimization stage 0" in zero0.message
    source = converted["folder"] / "ckpt"
    (z1, *_) = _load_findings(source, 2, zero_optimization={"stage": 1}, **tp2)
    assert "--pipe-parallel-size 1 --zero-stage 1 and load" in z1.message
    plain = dict(model_parallel_size=2, pipe_parallel_size=0)
    (z3, *_) = _load_findings(source, 2, zero_optimization={"stage": 3}, **plain)
    assert "--zero-stage 0 and load the new folder with zero_optimization stage 0" in z3.message
    assert "(ZeRO stage 3 cannot restore a converted optimizer state" in z3.message


def _verdict(checkpoint, target: str) -> dict:
    from megatron.checkpoint_tools.reader import CheckpointReader
    from tools.inspect_checkpoint import parse_resume_at, resume_verdict

    return resume_verdict(CheckpointReader(checkpoint), parse_resume_at(target))


def test_inspect_resume_at_follows_the_same_rule(converted):
    out, source = converted["result"].folder, converted["folder"] / "ckpt"
    assert _verdict(out, "tp=2,pp=1,dp=2,zero=1")["verdict"] == "direct"
    assert _verdict(out, "tp=2,pp=1,dp=2,zero=0")["verdict"] == "reshard"
    to_zero1 = _verdict(source, "tp=2,pp=1,dp=1,zero=1")
    assert to_zero1["verdict"] == "reshard" and "--zero-stage 1" in to_zero1["reason"]
    assert _verdict(source, "tp=1,pp=0,dp=2,zero=3")["verdict"] == "reshard"
    to_zero3 = _verdict(source, "tp=2,pp=0,dp=2,zero=3")
    assert to_zero3["verdict"] == "cannot" and "ZeRO-3 universal loader" in to_zero3["reason"]


def test_bf16_zero_state_moves_only_to_zero_1_and_2():
    from types import SimpleNamespace

    from megatron.checkpoint_tools.optimizer_read import unmovable_reason

    def cfg(dtype, stage):
        return SimpleNamespace(
            parallel=SimpleNamespace(zero_stage=stage),
            optimizer=SimpleNamespace(optimizer_type="AdamW"),
            precision=SimpleNamespace(dtype=dtype),
        )

    assert unmovable_reason(cfg("bf16", 2), 1) == unmovable_reason(cfg("bf16", 1), 2) == ""
    assert "only to a ZeRO 1/2 run" in unmovable_reason(cfg("bf16", 1), 0)
    assert "fp16 would lose its loss scale" in unmovable_reason(cfg("fp16", 1), 1)
    assert "ZeRO-3 bf16 is not verified" in unmovable_reason(cfg("bf16", 3), 1)


def test_load_universal_set_by_hand_on_an_ordinary_checkpoint_is_refused(converted):
    from megatron.preflight import ERROR

    source, out = converted["folder"] / "ckpt", converted["result"].folder.parent
    by_hand = dict(checkpoint={"load_universal": True})
    found = _load_findings(source, 1, **by_hand)
    assert [f.level for f in found].count(ERROR) == 1
    assert "checkpoint.load_universal is true" in next(f for f in found if f.level == ERROR).message
    tp2 = dict(model_parallel_size=2, pipe_parallel_size=1, zero_optimization={"stage": 1})
    assert ERROR not in [f.level for f in _load_findings(out, 2, **tp2, **by_hand)]


def test_zero3_target_at_tp1(converted, tmp_path):
    from megatron.checkpoint.safe_load import load_file
    from megatron.checkpoint_tools import reshard_checkpoint
    from megatron.preflight import ERROR

    source = converted["folder"] / "ckpt"
    folder = reshard_checkpoint(source, tmp_path / "ckpt", tp=1, pp=0, zero_stage=3).folder
    saved = load_file(folder / "zero" / "optimizer_state.pt")["optimizer_state_dict"]
    assert float(saved["state"][0]["step"]) == 4.0  # where DeepSpeed's ZeRO-3 loader reads it
    assert (folder / "zero_pp_rank_0_mp_rank_00_model_states.pt").is_file()
    z3 = dict(model_parallel_size=1, pipe_parallel_size=0, zero_optimization={"stage": 3})
    for world in (1, 2):
        assert ERROR not in [f.level for f in _load_findings(tmp_path / "ckpt", world, **z3)]
    # its weights alone: a ZeRO-3 engine would look for partition files
    (weights_only, *_) = _load_findings(tmp_path / "ckpt", 2, **z3, finetune=True)
    assert weights_only.level == ERROR and "(and ZeRO-3 or not)" in weights_only.message
