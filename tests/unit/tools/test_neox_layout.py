"""Our checkpoint files are laid out as GPT-NeoX lays out its own (issue 27).

GPT-NeoX's `GPT2ModelPipe.init_specs` numbers its pipeline specs, and DeepSpeed names each
module's file `layer_{index:02d}-model_{tp:02d}-model_states.pt` by that number. Written out
here from GPT-NeoX's definition, not from our code: with L transformer layers,

    0         the embedding (EmbeddingPipe: `word_embeddings.weight`, and
              `position_embeddings.weight` with learned positions)
    1         `_pre_transformer_block`, a plain function: no file
    2 .. L+1  the transformer layers
    L+2       `_post_transformer_block`, a plain function: no file
    L+3       the final norm (NormPipe: `norm.*`)
    L+4       the untied head (`final_linear.weight`); tied, the head is the embedding
              module again, whose table DeepSpeed saves once, in layer 0's file

Without a pipeline (`pipe_parallel_size: 0`) GPT-NeoX trains `to_sequential()`, whose
`mp_rank_XX_model_states.pt` `module` names every tensor `sequential.{index}.{name}` with the
same indices (its converter reads those keys).
"""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch

from megatron.checkpoint_tools import CheckpointReader, ModelSchema, write_checkpoint
from megatron.config import config_from_dict
from megatron.model import ModelArgs, build_gpt, full_state_dict

BASE = dict(
    num_layers=3,
    hidden_size=32,
    num_attention_heads=4,
    seq_length=16,
    max_position_embeddings=16,
    pos_emb="rotary",
    train_micro_batch_size_per_gpu=1,
    lr=1.0e-3,
)
ARCHITECTURES = {
    "pythia_untied": dict(gpt_j_residual=True, rotary_pct=0.25, no_weight_tying=True),
    "pythia_tied": dict(gpt_j_residual=True, no_weight_tying=False),
    "sequential_residual": dict(gpt_j_residual=False, no_weight_tying=True),
    "learned_positions_tied": dict(pos_emb="learned", no_weight_tying=False),
    "llama": dict(
        norm="rmsnorm",
        activation="swiglu",
        num_kv_heads=2,
        use_bias_in_norms=False,
        use_bias_in_attn_linear=False,
        use_bias_in_mlp=False,
        no_weight_tying=True,
    ),
}


def config(arch: str, tp: int, pp: int):
    settings = {**BASE, **ARCHITECTURES[arch], "model_parallel_size": tp}
    return config_from_dict(
        {**settings, "pipe_parallel_size": pp}, world_size=tp * max(1, pp), vocab_size=100
    )


def neox_layer_files(layers: int, tied: bool, tp: int) -> set[str]:
    """GPT-NeoX's per-layer files (module docstring)."""
    indices = [0, *range(2, layers + 2), layers + 3] + ([] if tied else [layers + 4])
    return {f"layer_{i:02d}-model_{t:02d}-model_states.pt" for i in indices for t in range(tp)}


def neox_outer_keys(layers: int, tied: bool, learned: bool, norm_bias: bool) -> dict:
    """`{layer index: tensor names}` of GPT-NeoX's files outside the transformer layers."""
    embedding = {"word_embeddings.weight"} | ({"position_embeddings.weight"} if learned else set())
    keys = {0: embedding, layers + 3: {"norm.weight"} | ({"norm.bias"} if norm_bias else set())}
    if not tied:
        keys[layers + 4] = {"final_linear.weight"}
    return keys


def _write(tmp_path, arch: str, tp: int, pp: int):
    cfg = config(arch, tp, pp)
    args = ModelArgs.from_config(cfg)
    state = full_state_dict(build_gpt(dataclasses.replace(args, pipe_parallel_size=0)))
    folder = write_checkpoint(
        tmp_path, schema=ModelSchema(args), state=state, tp=tp, pp=pp, iteration=1,
        config_dict=cfg.to_dict(),
    )  # fmt: skip
    return cfg, state, folder


@pytest.mark.parametrize("arch", sorted(ARCHITECTURES))
@pytest.mark.parametrize("tp, pp", [(1, 1), (2, 2), (2, 4)])
def test_pipeline_files_carry_neox_layer_indices(tmp_path, arch, tp, pp):
    cfg, state, folder = _write(tmp_path, arch, tp, pp)
    m = cfg.model
    tied, layers = not m.no_weight_tying, m.num_layers
    files = {p.name for p in folder.glob("layer_*")}
    assert files == neox_layer_files(layers, tied, tp)
    outer = neox_outer_keys(layers, tied, m.pos_emb == "learned", m.norm != "rmsnorm")
    for index, keys in outer.items():
        for t in range(tp):
            saved = torch.load(folder / f"layer_{index:02d}-model_{t:02d}-model_states.pt")
            assert set(saved) == keys, index
    back = CheckpointReader(tmp_path).state_dict()
    assert back.keys() == state.keys()
    assert all(torch.equal(back[name], state[name]) for name in state)


@pytest.mark.parametrize("arch", sorted(ARCHITECTURES))
@pytest.mark.parametrize("tp", [1, 2])
def test_plain_module_entries_carry_neox_sequential_names(tmp_path, arch, tp):
    cfg, state, folder = _write(tmp_path, arch, tp, 0)
    m = cfg.model
    tied, layers = not m.no_weight_tying, m.num_layers
    outer = neox_outer_keys(layers, tied, m.pos_emb == "learned", m.norm != "rmsnorm")
    for t in range(tp):
        module = torch.load(folder / f"mp_rank_{t:02d}_model_states.pt")["module"]
        indices = {int(name.split(".")[1]) for name in module}
        assert all(name.startswith("sequential.") for name in module)
        assert indices == {0, *range(2, layers + 2), layers + 3} | (set() if tied else {layers + 4})
        for index, keys in outer.items():
            prefix = f"sequential.{index}."
            assert {n[len(prefix) :] for n in module if n.startswith(prefix)} == keys, index
    back = CheckpointReader(tmp_path).state_dict()
    assert back.keys() == state.keys()
    assert all(torch.equal(back[name], state[name]) for name in state)


def test_mp_rank_files_and_config_hold_what_neox_reads(tmp_path):
    """GPT-NeoX's loader reads `iteration` and `args` (eight config values) from every
    mp_rank file; its converter reads `config.json` with PyYAML (YAML 1.1) and builds its
    Hugging Face config from `intermediate_size` (default 4 × hidden), so the file must hold
    the number and read the same as YAML as it does as JSON."""
    yaml = pytest.importorskip("yaml")
    cfg, _, folder = _write(tmp_path, "pythia_untied", 2, 2)
    as_json = json.loads((folder / "config.json").read_text())
    as_yaml = yaml.safe_load((folder / "config.json").read_text())
    assert as_yaml == as_json
    assert as_json["intermediate_size"] == 4 * as_json["hidden_size"]
    assert isinstance(as_yaml["layernorm_epsilon"], float)
    args = {
        "num_layers": 3, "hidden_size": 32, "num_attention_heads": 4,
        "max_position_embeddings": 16, "make_vocab_size_divisible_by": 128,
        "padded_vocab_size": 256, "tokenizer_type": "GPT2BPETokenizer",
        "model_parallel_size": 2,
    }  # fmt: skip
    for m in range(4):
        saved = torch.load(folder / f"mp_rank_{m:02d}_model_states.pt", weights_only=True)
        assert saved["iteration"] == 1 and saved["args"] == args
