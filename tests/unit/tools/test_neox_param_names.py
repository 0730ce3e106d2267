"""GPT-NeoX's parameter names where DeepSpeed saves names alone (`param_shapes`, which name the
ZeRO partitions and the optimizer groups) read as ours by the one rule both their readers use,
`neox_layout.our_param_name` (the resume's group check, `neox_resume.saved_groups`, and the
checkpoint tools' `CheckpointReader.current_name`), issue 'Faithful in the corners', item 9.

GPT-NeoX's names are written out from its source: its plain engine trains
`GPT2ModelPipe.to_sequential()`, an `nn.Sequential` called `sequential` over the pipeline's
specs (the tied embedding is spec 0); `ParallelMLP.linear1`/`linear2`; `RMSNorm.scale`;
`ParallelSelfAttention.rpe` (T5's relative bias). Where renaming is not enough (a gated
`linear1` holds up and gate projections in one tensor, grouped-query rows are ordered
otherwise) the ZeRO reader refuses the optimizer state, naming the file and the tensor.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from megatron.checkpoint.neox_layout import our_param_name
from megatron.checkpoint.neox_resume import saved_groups
from megatron.checkpoint_tools.layout import CheckpointLayout
from megatron.checkpoint_tools.schema import ModelSchema
from megatron.checkpoint_tools.zero_state import read_zero_optimizer_state
from megatron.model import ModelArgs
from megatron.model.neox_names import reordered_by_neox
from tests.tiny import tiny_config

NAMES = [  # (GPT-NeoX's, tied embedding, ours)
    ("sequential.0.word_embeddings.weight", True, "tied_modules.embed.word_embeddings.weight"),
    ("sequential.0.word_embeddings.weight", False, "0.word_embeddings.weight"),
    ("sequential.2.mlp.linear1.weight", True, "2.mlp.dense_h_to_4h.weight"),
    ("sequential.3.attention.query_key_value.bias", True, "3.attention.query_key_value.bias"),
    ("3.mlp.linear2.bias", False, "3.mlp.dense_4h_to_h.bias"),  # the pipeline engine's
    ("sequential.3.input_layernorm.scale", False, "3.input_layernorm.weight"),
    ("5.norm.scale", False, "5.norm.weight"),
    ("2.attention.rpe.weight", False, "2.attention.positions.weight"),
]
OURS = [
    "tied_modules.embed.word_embeddings.weight",
    "2.mlp.dense_h_to_4h.weight",
    "2.mlp.dense_h_to_4h_gate.weight",
    "3.post_attention_layernorm.weight",
    "2.attention.positions.weight",
]


@pytest.mark.parametrize("saved, tied, ours", NAMES)
def test_gpt_neox_parameter_names_read_as_ours(saved, tied, ours):
    assert our_param_name(saved, tied) == ours


@pytest.mark.parametrize("name", OURS)
def test_our_own_names_stay(name):
    assert our_param_name(name, tied=True) == name


def test_the_resume_reads_gpt_neox_groups_by_the_same_rule():
    shapes = [{saved: (4,) for saved, tied, _ in NAMES if tied}, {"5.norm.scale": (4,)}]
    assert saved_groups({"param_shapes": shapes}, tied=True) == [
        [ours for _, tied, ours in NAMES if tied],
        ["5.norm.weight"],
    ]


def _args(**changes) -> ModelArgs:
    return ModelArgs.from_config(tiny_config(**changes))


SWIGLU = dict(activation="swiglu", intermediate_size=128)


def test_tensors_renaming_cannot_place_are_told():
    current = ["sequential.2.attention.query_key_value.weight", "sequential.2.mlp.linear1.weight"]
    assert "mlp.linear1" in reordered_by_neox(current, _args(**SWIGLU))
    assert "query_key_value" in reordered_by_neox(current, _args(num_kv_heads=2))
    assert reordered_by_neox(current, _args()) == ""  # renamed, element for element ours
    ours = ["2.mlp.dense_h_to_4h.weight", "2.mlp.dense_h_to_4h_gate.weight"]
    assert reordered_by_neox(ours, _args(**SWIGLU, num_kv_heads=2)) == ""


def test_zero_state_of_a_gated_gpt_neox_model_is_refused_naming_the_file(tmp_path):
    shapes = [{"sequential.2.mlp.linear1.weight": (256, 64)}, {"sequential.3.norm.scale": (64,)}]
    torch.save({"param_shapes": shapes}, tmp_path / "mp_rank_00_model_states.pt")
    optim = {"optimizer_state_dict": {"zero_stage": 1}}
    torch.save(optim, tmp_path / "zero_pp_rank_0_mp_rank_00_optim_states.pt")
    args = _args(**SWIGLU)
    layout = CheckpointLayout(tmp_path, tp=1, pp=0)
    reader = SimpleNamespace(folder=tmp_path, layout=layout, args=args, schema=ModelSchema(args))
    state, why = read_zero_optimizer_state(reader)
    assert state is None
    assert str(tmp_path / "mp_rank_00_model_states.pt") in why
    assert "mlp.linear1" in why
