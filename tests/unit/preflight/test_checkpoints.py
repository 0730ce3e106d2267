"""The `load` pre-flight check, on checkpoints the checkpoint tools write (real DeepSpeed-layout
files): a model of another shape is refused naming every differing key, and exactly when torch
itself would refuse the saved tensors; another tensor/pipeline layout is refused with the
reshard command; the folder read is the one the loader resumes (fresh start, `latest` naming a
missing or partial folder); a missing trainer state is refused unless `finetune`."""

from __future__ import annotations

import shutil

import pytest
import torch

from megatron.checkpoint_tools import ModelSchema, write_checkpoint
from megatron.config import config_from_dict
from megatron.model import ModelArgs
from megatron.preflight import ERROR, OK, WARNING, run_preflight
from megatron.preflight import checkpoints as check
from tests.tiny import BARE

# train_iters beyond the written checkpoints' iteration 2: a run that has steps left
TINY = dict(BARE, tokenizer_type="CharLevelTokenizer", pos_emb="rotary", pipe_parallel_size=1,
            train_iters=8)  # fmt: skip


def config(world_size=1, **keys):
    return config_from_dict({**TINY, **keys}, world_size=world_size, vocab_size=512)


def saved_state(cfg) -> dict:
    schema = ModelSchema(ModelArgs.from_config(cfg))
    return {name: torch.randn(spec.shape) for name, spec in schema.params.items()}


def write(folder, cfg, iteration=2, tp=1, pp=1):
    """A checkpoint of the model `cfg` describes under `folder` (its `latest` names it)."""
    schema = ModelSchema(ModelArgs.from_config(cfg))
    return write_checkpoint(
        folder,
        schema=schema,
        state=saved_state(cfg),
        tp=tp,
        pp=pp,
        iteration=iteration,
        config_dict=cfg.to_dict(),
    )


def torch_loads(cfg, state) -> None:
    """torch's own check: load `state` strictly into the model `cfg` describes."""
    ModelSchema(ModelArgs.from_config(cfg)).meta_model.load_state_dict(state, assign=True)


def load_findings(load, script="train.py", world_size=1, **keys):
    cfg = config(world_size, load=str(load), **keys)
    return [f for f in run_preflight(cfg, script) if f.check == "load"]


def levels(findings):
    return [f.level for f in findings]


def test_same_model_passes(tmp_path):
    folder = write(tmp_path, config())
    (found,) = load_findings(tmp_path)
    assert found.level == OK and found.message.startswith(f"{folder}: model shape matches")


def test_another_shape_names_every_key_and_torch_agrees(tmp_path):
    saved_cfg = config()
    folder = write(tmp_path, saved_cfg)
    (found,) = load_findings(tmp_path, hidden_size=128, num_layers=3)
    assert found.level == ERROR
    # a training run is told first that the folder is another model's run (no reshard advice)
    assert found.message.startswith(f"{tmp_path} holds a run of another model ({folder}:")
    assert "a folder of its own (--set save=checkpoints/" in found.message
    assert "reshard" not in found.message
    assert "num_layers 2, the config says 3" in found.message
    assert "hidden_size 64, the config says 128" in found.message
    with pytest.raises(RuntimeError, match="size mismatch|Missing key|Unexpected key"):
        torch_loads(config(hidden_size=128, num_layers=3), saved_state(saved_cfg))


def test_padded_vocabulary_and_untied_head_are_named(tmp_path):
    write(tmp_path, config())
    (found,) = load_findings(tmp_path, make_vocab_size_divisible_by=1024, no_weight_tying=True)
    assert found.level == ERROR
    assert "padded_vocab_size 512, the config says 1024" in found.message
    assert "no_weight_tying False, the config says True" in found.message


def test_a_padded_vocabulary_the_trainer_keeps_passes(tmp_path):
    """Resharded from tp 1 to tp 2, a checkpoint keeps its 520 padded rows (512 tokens, a
    multiple of 40), where the tp-2 config derives 560: the trainer builds 520 rows
    (`megatron/training/setup/resume_vocab.py`), so the shapes match."""
    keys = dict(world_size=2, model_parallel_size=2, make_vocab_size_divisible_by=40)
    saved = config(**keys).replace(padded_vocab_size=520)
    assert config(**keys).model.padded_vocab_size == 560
    write(tmp_path, saved, tp=2)
    (found,) = load_findings(tmp_path, **keys)
    assert found.level == OK, found.message


def test_a_key_that_keeps_the_shapes_warns_and_torch_loads(tmp_path):
    saved_cfg = config()
    write(tmp_path, saved_cfg)
    found = load_findings(tmp_path, activation="relu", seed=7, hidden_dropout=0.3)
    assert levels(found) == [OK, WARNING]
    assert found[1].message.endswith("saved with activation 'gelu', the config says 'relu'")
    torch_loads(config(activation="relu"), saved_state(saved_cfg))


def test_another_layout_is_refused_with_the_reshard_command(tmp_path):
    folder = write(tmp_path, config(world_size=2, model_parallel_size=2), tp=2)
    found = load_findings(tmp_path)
    assert levels(found) == [ERROR, OK]
    assert f"{folder} was saved at tp=2, pp=1" in found[0].message
    assert (
        f"python tools/reshard.py --checkpoint {folder} --output <new folder> "
        "--model-parallel-size 1 --pipe-parallel-size 1" in found[0].message
    )
    # generate.py and eval.py read any layout
    assert levels(load_findings(tmp_path, script="generate.py")) == [OK]


def test_no_checkpoint_yet_is_a_fresh_start(tmp_path):
    (found,) = load_findings(tmp_path / "missing")
    assert found.level == OK and "fresh start" in found.message
    (found,) = load_findings(tmp_path)
    assert found.level == OK and "no latest file" in found.message
    (found,) = load_findings(tmp_path / "missing", script="generate.py")
    assert found.level == ERROR and "does not exist" in found.message


def test_latest_naming_a_missing_folder(tmp_path):
    (tmp_path / "latest").write_text("global_step9")
    (found,) = load_findings(tmp_path)
    assert found.level == ERROR
    assert f"{tmp_path / 'latest'} names checkpoint 'global_step9'" in found.message
    write(tmp_path, config(), iteration=4)
    (tmp_path / "latest").write_text("global_step9")
    found = load_findings(tmp_path)
    assert levels(found) == [WARNING, OK]
    assert (
        "which is missing; resuming from the newest complete checkpoint, 'global_step4'"
        in found[0].message
    )


def test_latest_naming_a_partial_folder(tmp_path):
    write(tmp_path, config(), iteration=2)
    partial = write(tmp_path, config(), iteration=4)
    (partial / check.COMPLETE).unlink()
    found = load_findings(tmp_path)
    assert levels(found) == [WARNING, OK]
    assert "which is partial; resuming from the newest complete checkpoint, 'global_step2'" in (
        found[0].message
    )
    shutil.rmtree(tmp_path / "global_step2")
    found = load_findings(tmp_path)
    assert levels(found) == [WARNING, OK] and "the loader trusts it" in found[0].message


def test_a_folder_without_trainer_state_needs_finetune(tmp_path):
    folder = write(tmp_path, config())
    (folder / "trainer_state.pt").unlink()
    (found,) = load_findings(tmp_path)
    assert found.level == ERROR and "use finetune: true" in found.message
    assert levels(load_findings(tmp_path, finetune=True)) == [OK]


def test_a_newer_temporary_checkpoint_is_resumed_as_the_loader_does(tmp_path):
    write(tmp_path, config(), iteration=2)
    (write(tmp_path, config(), iteration=3)).rename(tmp_path / "global_step3_temporary")
    (tmp_path / "latest").write_text("global_step4")  # a crash before global_step4 was written
    found = load_findings(tmp_path)
    assert levels(found) == [WARNING, OK]
    assert "from the newest complete checkpoint, 'global_step3_temporary'" in found[0].message


def test_another_expert_parallel_size_is_refused_and_the_named_reshard_fixes_it(tmp_path):
    """Saved at moe_expert_parallel_size 2, the run at 1 (same tp/pp): refused before launch
    with a reshard command, and the folder that command writes passes."""
    from tools import reshard

    moe = dict(moe_num_experts=4, moe_top_k=2, moe_expert_interval=1)
    saved_cfg = config(world_size=2, moe_expert_parallel_size=2, **moe)
    schema = ModelSchema(ModelArgs.from_config(saved_cfg))
    state, saved = saved_state(saved_cfg), saved_cfg.to_dict()
    folder = write_checkpoint(tmp_path / "ep2", schema=schema, state=state, tp=1, pp=1,
                              iteration=2, config_dict=saved, ep=2)  # fmt: skip
    same = load_findings(tmp_path / "ep2", world_size=2, moe_expert_parallel_size=2, **moe)
    assert levels(same) == [OK]
    found = load_findings(tmp_path / "ep2", **moe)
    assert levels(found) == [ERROR, OK]
    message = found[0].message
    assert "moe_expert_parallel_size 2 ranks, the run has 1" in message
    command = message.split("run python tools/reshard.py ")[1].split(" and load")[0]
    command = command.replace("<new folder>", str(tmp_path / "ep1"))
    assert "--expert-parallel-size 1 --zero-stage 0" in command
    assert reshard.main(command.split()) == 0
    assert levels(load_findings(tmp_path / "ep1", **moe)) == [OK]
    assert str(folder) in message


def test_another_model_in_another_layout_is_another_run_not_a_reshard(tmp_path):
    write(tmp_path, config(world_size=2, model_parallel_size=2), tp=2)
    (found,) = load_findings(tmp_path, hidden_size=128)
    assert found.level == ERROR and "holds a run of another model" in found.message
    assert "reshard" not in found.message  # the layout is beside the point


def test_a_run_on_other_data_is_said_first(tmp_path):
    saved = config(data_path="data/shakespeare/shakespeare_text_document")
    folder = write(tmp_path, saved)
    found = load_findings(tmp_path, data_path="data/mine_text_document")
    assert levels(found) == [OK, WARNING]
    assert found[1].message.startswith(f"{folder} is a run on other data (data_path ")
    assert "finetune: true to start from its weights" in found[1].message
    assert levels(load_findings(tmp_path, data_path="data/mine_text_document",
                                finetune=True)) == [OK]  # fmt: skip


def test_another_lr_schedule_is_refused_before_launch_in_the_users_keys(tmp_path):
    folder = write(tmp_path, config(train_iters=8))
    found = load_findings(tmp_path, train_iters=12)
    assert levels(found) == [OK, ERROR]
    assert found[1].message.startswith(f"{folder} was trained on another LR schedule: ")
    assert "train_iters 8, the config says 12" in found[1].message
    assert "override_lr_scheduler: true" in found[1].message
    for keys in (dict(override_lr_scheduler=True), dict(use_checkpoint_lr_scheduler=True)):
        assert levels(load_findings(tmp_path, train_iters=12, **keys)) == [OK]
    # a longer run whose schedule stays the checkpoint's (an explicit decay length) resumes
    write(tmp_path / "explicit", config(train_iters=8, lr_decay_iters=8))
    assert levels(load_findings(tmp_path / "explicit", train_iters=12, lr_decay_iters=8)) == [OK]


def test_a_finished_run_says_nothing_will_train(tmp_path):
    folder = write(tmp_path, config(train_iters=2), iteration=2)
    found = load_findings(tmp_path, train_iters=2)
    assert levels(found) == [OK, WARNING]
    assert found[1].message.startswith(f"{folder} is already at iteration 2 of train_iters 2")


def test_the_new_folder_named_is_neither_this_runs_nor_one_that_exists(tmp_path, monkeypatch):
    """The journey's `make train` twice: the finished run's folder was the one advised."""
    monkeypatch.chdir(tmp_path)
    write(tmp_path / "checkpoints" / "this-run", config(train_iters=2), iteration=2)
    (tmp_path / "checkpoints" / "this-run-2").mkdir()
    found = load_findings("checkpoints/this-run", train_iters=2, save="checkpoints/this-run")
    assert found[1].message.startswith("checkpoints/this-run/global_step2 is already at")
    assert found[1].message.endswith(
        "(--set save=checkpoints/this-run-3 --set load=checkpoints/this-run-3)"
    )


MAMBA = dict(attention_config=[[["mamba"], 2]], norm="rmsnorm", pos_emb="none")


@pytest.mark.parametrize(
    "saved, now",
    [
        (dict(precision="bfloat16"), dict(precision="bfloat16", mamba_selective_fp32_params=False)),
        (dict(), dict(precision="bfloat16")),  # fp32 -> bf16, the flag at its default (true)
    ],
    ids=["flag-off", "fp32-to-bf16"],
)
def test_a_resume_whose_fp32_groups_change_is_refused_unless_no_load_optim(tmp_path, saved, now):
    """Mamba's A_log and D in fp32 optimizer groups of their own (fp16/bf16 with
    `mamba_selective_fp32_params`) or not: DeepSpeed restores the optimizer group by group."""
    folder = write(tmp_path, config(**MAMBA, **saved))
    errors = [f for f in load_findings(tmp_path, **MAMBA, **now) if f.level == ERROR]
    assert len(errors) == 1
    assert errors[0].message.startswith(f"{folder} holds optimizer state of other parameter ")
    assert "no_load_optim: true" in errors[0].message
    assert ERROR not in levels(load_findings(tmp_path, **MAMBA, **now, no_load_optim=True))
    assert ERROR not in levels(load_findings(tmp_path, **MAMBA, **saved))  # the same groups
