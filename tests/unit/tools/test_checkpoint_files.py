"""Our checkpoint files without an engine: written at one layout, read back at any; layout
detection from file names; stage bounds and optimizer numbering; errors that say what is
wrong."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from megatron.checkpoint.deepspeed_files import (
    LAYER_FILE,
    MP_RANK_FILE,
    ZERO_MODEL_FILE,
    ZERO_OPTIM_FILE,
    layer_file,
    mp_rank_file,
    zero_model_file,
)
from megatron.checkpoint_tools import (
    CheckpointError,
    CheckpointReader,
    ModelSchema,
    read_layout,
    write_checkpoint,
)
from megatron.checkpoint_tools.stages import optimizer_parameter_names, stage_bounds
from megatron.config import config_from_dict
from megatron.model import ModelArgs, build_gpt, full_state_dict

MODEL = dict(
    num_layers=4,
    hidden_size=32,
    num_attention_heads=4,
    num_kv_heads=2,
    seq_length=16,
    pos_emb="rotary",
    norm="rmsnorm",
    activation="swiglu",
    no_weight_tying=True,
    train_micro_batch_size_per_gpu=1,
    lr=1.0e-3,
)


def config(tp: int, pp: int, **changes):
    return config_from_dict(
        {**MODEL, "model_parallel_size": tp, "pipe_parallel_size": pp, **changes},
        world_size=tp * max(1, pp),
        vocab_size=200,
    )


@pytest.fixture(scope="module")
def model_state():
    args = ModelArgs.from_config(config(1, 0))
    return ModelSchema(args), full_state_dict(build_gpt(args))


@pytest.mark.parametrize("tp, pp", [(2, 2), (1, 0), (2, 0), (1, 1), (2, 4)])
def test_written_checkpoints_read_back_at_every_layout(tmp_path, model_state, tp, pp):
    schema, state = model_state
    folder = write_checkpoint(
        tmp_path, schema=schema, state=state, tp=tp, pp=pp, iteration=7,
        config_dict=config(tp, pp).to_dict(),
    )  # fmt: skip
    assert folder == tmp_path / "global_step7" and (tmp_path / "latest").read_text() == folder.name
    layout = read_layout(tmp_path)
    assert (layout.tp, layout.pp, layout.iteration) == (tp, pp, 7)
    reader = CheckpointReader(tmp_path)
    back = reader.state_dict()
    assert back.keys() == state.keys()
    assert all(torch.equal(back[name], state[name]) for name in state)
    assert reader.trainer_state()["iteration"] == 7
    some = ["3.attention.dense.weight", "8.final_linear.weight"]  # GPT-NeoX's head: L + 4
    assert reader.state_dict(some).keys() == set(some)
    if pp:
        qkv = torch.load(folder / f"layer_02-model_{tp - 1:02d}-model_states.pt")
        rows = state["2.attention.query_key_value.weight"].shape[0]
        assert qkv["attention.query_key_value.weight"].shape[0] == rows // tp


def test_tied_head_has_no_layer_file_and_reads_from_the_embedding(tmp_path):
    cfg = config(2, 2, no_weight_tying=False)
    args = ModelArgs.from_config(cfg)
    state = full_state_dict(build_gpt(ModelArgs.from_config(config(1, 0, no_weight_tying=False))))
    write_checkpoint(
        tmp_path, schema=ModelSchema(args), state=state, tp=2, pp=2, iteration=1,
        config_dict=cfg.to_dict(),
    )  # fmt: skip
    names = sorted(p.name for p in (tmp_path / "global_step1").glob("layer_08-*"))
    assert names == []  # DeepSpeed saves the tied module once, with layer 0
    back = CheckpointReader(tmp_path).state_dict()
    assert torch.equal(back["tied_modules.embed.word_embeddings.weight"], state[
        "tied_modules.embed.word_embeddings.weight"
    ])  # fmt: skip


def test_a_config_that_does_not_describe_the_checkpoint_is_named(tmp_path, model_state):
    schema, state = model_state
    write_checkpoint(
        tmp_path, schema=schema, state=state, tp=1, pp=1, iteration=1,
        config_dict=config(1, 1).to_dict(),
    )  # fmt: skip
    with pytest.raises(CheckpointError, match="2.attention.query_key_value.weight"):
        CheckpointReader(tmp_path, config(1, 1, num_kv_heads=4)).state_dict()
    with pytest.raises(CheckpointError, match="already exists"):
        write_checkpoint(
            tmp_path, schema=schema, state=state, tp=1, pp=1, iteration=1,
            config_dict={},
        )  # fmt: skip


def test_locating_checkpoints_explains_what_it_found(tmp_path):
    (tmp_path / "global_step5").mkdir()
    with pytest.raises(CheckpointError, match="global_step5"):
        read_layout(tmp_path)
    with pytest.raises(CheckpointError, match="does not exist"):
        read_layout(tmp_path / "nowhere")
    (tmp_path / "latest").write_text("global_step9")
    with pytest.raises(FileNotFoundError, match="global_step9"):
        read_layout(tmp_path)


def test_layout_checks_name_what_does_not_divide(model_state):
    schema, _ = model_state
    with pytest.raises(ValueError, match="num_kv_heads 2"):
        schema.check_tp(4)
    schema.check_tp(2)


def test_stage_bounds_follow_the_partition_method(model_state):
    from deepspeed.runtime.utils import partition_balanced

    schema, _ = model_state
    # GPT-NeoX's list: 0 EmbeddingPipe, 1 _pre_transformer_block, 2-5 transformer layers,
    # 6 _post_transformer_block, 7 NormPipe, 8 ParallelLinearPipe; its default
    # `type:transformer|mlp` matches the layers and both functions' names.
    neox = [0, 1, 1, 1, 1, 1, 1, 0, 0]
    for stages in (2, 4):
        want = [int(b) for b in partition_balanced(weights=neox, num_parts=stages)]
        assert stage_bounds(schema, stages) == want
    assert stage_bounds(schema, 4) == [0, 3, 5, 6, 9]
    uniform = ModelSchema(ModelArgs.from_config(config(1, 2, pipe_partition_method="uniform")))
    assert stage_bounds(uniform, 2) == [0, 5, 9]  # nine entries
    bad = ModelSchema(ModelArgs.from_config(config(1, 2, pipe_partition_method="type:conv")))
    with pytest.raises(ValueError, match="matches no layer class"):
        stage_bounds(bad, 2)


def test_optimizer_numbering_puts_matrices_first_in_module_order(model_state):
    schema, _ = model_state
    bounds = stage_bounds(schema, 2)
    first = optimizer_parameter_names(schema, bounds, 0)
    matrices = [n for n in first if len(schema.params[n].shape) == 2]
    assert first[: len(matrices)] == matrices and first[0] == "0.word_embeddings.weight"
    last = optimizer_parameter_names(schema, bounds, 1)
    assert "8.final_linear.weight" in last and last[-1].startswith("7.norm.")
    assert sorted(first + last) == sorted(schema.params)


def test_file_names_are_those_deepspeed_writes():
    from deepspeed.runtime.engine import DeepSpeedEngine as Engine
    from deepspeed.runtime.pipe.module import PipelineModule
    from deepspeed.runtime.pipe.topology import PipeModelDataParallelTopology

    def engine(zero3: bool):  # what DeepSpeed's naming methods read of the engine
        e = SimpleNamespace(zero_optimization_partition_weights=lambda: zero3)
        e.checkpoint_mp_rank = 3
        e._get_zero_ckpt_prefix = lambda dp, bf16_mode: Engine._get_zero_ckpt_prefix(
            e, dp, bf16_mode
        )
        return e

    def name(path) -> str:
        return Path(path).name

    assert name(Engine._get_ckpt_name(engine(False), "save", "tag")) == mp_rank_file(3)
    zero3 = Engine._get_ckpt_name(engine(True), "save", "tag", pp_placeholder=2)
    assert name(zero3) == zero_model_file(3, dp_rank=2)
    for bf16 in (False, True):
        optim = name(Engine._get_rank_zero_ckpt_name(engine(True), "save", "tag", 3, 2, bf16))
        assert ZERO_OPTIM_FILE.match(optim).groups() == ("2", "03")
    topology = PipeModelDataParallelTopology(num_pp=1, num_mp=4, num_dp=1)
    stage = SimpleNamespace(_local_start=5, _grid=SimpleNamespace(_topo=topology), global_rank=3)
    assert name(PipelineModule.ckpt_layer_path(stage, "folder", 2)) == layer_file(7, 3)
    assert LAYER_FILE.match(layer_file(7, 3)).groups() == ("07", "03")
    assert MP_RANK_FILE.match(mp_rank_file(3)).groups() == ("03",)
    assert ZERO_MODEL_FILE.match(zero_model_file(3, 2)).groups() == ("2", "03")
