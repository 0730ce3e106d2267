"""Hugging Face export: what each target class cannot express is refused before anything is
written; what it can express exports faithfully (checked by `transformers` itself).

- Every model option is classified for both architectures (a new one must be decided).
- Inexpressible options (QK-norm, other norms, activations, positions, biases, tied norms,
  GQA for GPT-NeoX, partial rotary for Llama, an unknown option) are refused naming the option
  and its value; the output folder is not created, and an existing one with `overwrite` is
  left untouched.
- Options claimed expressible are exported from a randomised model and verified: the
  `transformers` model's logits equal ours.
"""

from __future__ import annotations

import dataclasses
import os
import re
import stat

import pytest
import torch

from megatron.checkpoint_tools import export_hf, verify_export
from megatron.model import build_gpt, full_state_dict
from megatron.model.activations import ACTIVATIONS
from megatron.model.hf_config import HF_CONFIGS, unclassified
from tests.unit.model.tiny import llama_args, neox_args

pytest.importorskip("transformers")


def random_state(args) -> dict[str, torch.Tensor]:
    """Full weights of `args`' model, every parameter random (norms around 1)."""
    model = build_gpt(args)
    gen = torch.Generator().manual_seed(5)
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = 0.1 * torch.randn(p.shape, generator=gen)
            p.copy_(1.0 + noise if "norm" in name and name.endswith("weight") else noise)
    return full_state_dict(model)


@pytest.mark.parametrize("arch", sorted(HF_CONFIGS))
def test_every_model_option_is_classified(arch):
    assert unclassified(HF_CONFIGS[arch]) == []


INEXPRESSIBLE = [
    ("gpt_neox", neox_args(use_qk_layernorm=True), "use_qk_layernorm=True"),
    ("llama", llama_args(use_qk_layernorm=True), "use_qk_layernorm=True"),
    ("gpt_neox", neox_args(pos_emb="learned"), "pos_emb='learned'"),
    ("gpt_neox", neox_args(pos_emb="alibi"), "pos_emb='alibi'"),
    ("gpt_neox", neox_args(pos_emb="sinusoidal"), "pos_emb='sinusoidal'"),
    ("gpt_neox", neox_args(pos_emb="none"), "pos_emb='none'"),
    ("llama", llama_args(pos_emb="alibi"), "pos_emb='alibi'"),
    ("gpt_neox", neox_args(norm="scalenorm"), "norm='scalenorm'"),
    ("gpt_neox", neox_args(norm="non_parametric_layernorm"), "norm='non_parametric_layernorm'"),
    ("llama", llama_args(norm="layernorm", use_bias_in_norms=True), "norm='layernorm'"),
    ("gpt_neox", neox_args(use_bias_in_norms=False), "use_bias_in_norms=False"),
    ("llama", llama_args(use_bias_in_norms=True), "use_bias_in_norms=True"),
    ("gpt_neox", neox_args(activation="swiglu"), "activation='swiglu'"),
    ("llama", llama_args(activation="gelu"), "activation='gelu'"),
    ("gpt_neox", neox_args(use_bias_in_mlp=False), "use_bias_in_mlp=False"),
    ("gpt_neox", neox_args(gpt_j_tied=True), "gpt_j_tied=True"),
    ("gpt_neox", neox_args(num_kv_heads=2), "num_kv_heads=2"),
    ("llama", llama_args(rotary_pct=0.5), "rotary_pct=0.5"),
    ("llama", llama_args(gpt_j_residual=True), "gpt_j_residual=True"),
]


@pytest.mark.parametrize("arch, args, named", INEXPRESSIBLE)
def test_inexpressible_options_are_refused_before_writing(arch, args, named, tmp_path):
    state = random_state(args)
    out = tmp_path / "hf"
    with pytest.raises(ValueError, match=re.escape(named)) as refused:
        export_hf(state, args, out, architecture=arch)
    assert HF_CONFIGS[arch].hf_class in str(refused.value)
    assert not out.exists()
    # A folder to be overwritten is only emptied once the export is known to be possible.
    out.mkdir()
    (out / "keep.txt").write_text("an earlier export")
    with pytest.raises(ValueError, match=re.escape(named)):
        export_hf(state, args, out, architecture=arch, overwrite=True)
    assert [p.name for p in out.iterdir()] == ["keep.txt"]


def test_an_option_the_exporter_does_not_know_is_refused_unless_default(tmp_path):
    base = type(neox_args())
    extended = dataclasses.make_dataclass(
        "ExtendedArgs",
        [("use_mup", bool, dataclasses.field(default=False))],
        bases=(base,),
        frozen=True,
    )
    plain = extended(**dataclasses.asdict(neox_args()))
    mup = dataclasses.replace(plain, use_mup=True)
    state = random_state(neox_args())
    with pytest.raises(ValueError, match="use_mup=True"):
        export_hf(state, mup, tmp_path / "mup", architecture="gpt_neox")
    assert not (tmp_path / "mup").exists()
    export_hf(state, plain, tmp_path / "plain", architecture="gpt_neox")


def test_a_weight_without_a_hugging_face_name_is_refused(tmp_path):
    args = neox_args()
    state = {**random_state(args), "2.attention.extra_scale.weight": torch.ones(8)}
    with pytest.raises(ValueError, match="extra_scale"):
        export_hf(state, args, tmp_path / "hf")
    assert not (tmp_path / "hf").exists()


EXPRESSIBLE = [
    ("gpt_neox", neox_args(gpt_j_residual=False, rotary_pct=0.25)),
    ("gpt_neox", neox_args(use_bias_in_attn_linear=False, layernorm_epsilon=1e-3)),
    ("gpt_neox", neox_args(no_weight_tying=True, rotary_emb_base=500)),
    ("gpt_neox", neox_args(activation="relu_squared", intermediate_size=80)),
    ("gpt_neox", neox_args(activation="silu", layer_attention_types=("sdpa", "global") * 2)),
    ("gpt_neox", neox_args(apply_query_key_layer_scaling=True, attention_softmax_in_fp32=True)),
    ("llama", llama_args(activation="geglu", use_bias_in_attn_linear=True)),
    ("llama", llama_args(activation="reglu", use_bias_in_mlp=True, num_kv_heads=1)),
    ("llama", llama_args(no_weight_tying=False, rms_norm_epsilon=1e-5, mlp_multiple_of=16)),
]
if "gelu_tanh" in ACTIVATIONS:
    EXPRESSIBLE.append(("gpt_neox", neox_args(activation="gelu_tanh")))


@pytest.mark.parametrize("arch, args", EXPRESSIBLE)
def test_expressible_options_export_faithfully(arch, args, tmp_path):
    state = random_state(args)
    export_hf(state, args, tmp_path / "hf", architecture=arch)
    check = verify_export(tmp_path / "hf", args, state)
    assert check.ok and check.max_difference < 1e-5, check.report()


@pytest.mark.parametrize("umask", [0o022, 0o027])
def test_exported_files_get_the_users_usual_permissions(tmp_path, umask):
    """safetensors writes through a private temporary file: model.safetensors came out 0600,
    where the group sharing the model (and a container's other user) could not read it."""
    args = neox_args()
    old = os.umask(umask)
    try:
        result = export_hf(random_state(args), args, tmp_path / "hf", max_shard_size="50KB")
    finally:
        os.umask(old)
    assert any(name.endswith(".safetensors") for name in result.files)
    modes = {p.name: stat.S_IMODE(p.stat().st_mode) for p in (tmp_path / "hf").iterdir()}
    assert modes == dict.fromkeys(modes, 0o666 & ~umask)
