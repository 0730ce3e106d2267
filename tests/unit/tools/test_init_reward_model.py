"""`tools/init_reward_model.py`: a language model's checkpoint -> a reward model's start.

The written checkpoint, read back at its (tp=2, pp=2) layout, holds the language model's body
unchanged, not its vocabulary head, and the value head a fresh reward-model run of the same
config builds; a config of another architecture is refused naming the tensor, writing nothing.
"""

from __future__ import annotations

import dataclasses

import torch
import yaml

from megatron.checkpoint_tools import CheckpointReader, ModelSchema, write_checkpoint
from megatron.checkpoint_tools.hf_import import RECORD_DEFAULTS
from megatron.config import config_from_dict
from megatron.model import ModelArgs, build_gpt
from tests.tiny import HF_TOKENIZER, HF_VOCAB
from tests.unit.tools.test_hf_export import random_state

LM_KEYS = dict(
    num_layers=2,
    hidden_size=32,
    num_attention_heads=4,
    seq_length=16,
    pos_emb="rotary",
    norm="rmsnorm",
    activation="swiglu",
    no_weight_tying=True,
    tokenizer_type="HFTokenizer",
    vocab_file=str(HF_TOKENIZER),
    seed=3,
    **RECORD_DEFAULTS,
)
RM_KEYS = dict(
    train_impl="rm",
    dataset_impl="pairwise",
    pack_impl="unpacked",
    pos_train_data_paths=["prefs_text_pos_document"],
    neg_train_data_paths=["prefs_text_neg_document"],
    pos_train_label_data_paths=["prefs_text_pos_label_document"],
    neg_train_label_data_paths=["prefs_text_neg_label_document"],
    model_parallel_size=2,
    pipe_parallel_size=2,
)


def lm_checkpoint(folder):
    cfg = config_from_dict(LM_KEYS, vocab_size=HF_VOCAB)
    args = ModelArgs.from_config(cfg)
    state = random_state(args)
    write_checkpoint(
        folder,
        schema=ModelSchema(args),
        state=state,
        tp=1,
        pp=1,
        iteration=7,
        config_dict=cfg.to_dict(),
    )
    return state


def rm_config_file(folder, **changes):
    path = folder / "rm.yml"
    path.write_text(yaml.safe_dump({**LM_KEYS, **RM_KEYS, **changes}))
    return path


def test_reward_model_starts_from_the_language_model(tmp_path, capsys):
    from tools import init_reward_model as tool

    lm_state = lm_checkpoint(tmp_path / "lm")
    config = rm_config_file(tmp_path)
    out = tmp_path / "rm"
    argv = ["--checkpoint", str(tmp_path / "lm"), "--config", str(config), "--output", str(out)]
    assert tool.main(argv) == 0
    assert "left out: 6.final_linear.weight" in capsys.readouterr().out  # L + 4, L = 2

    reader = CheckpointReader(out)
    assert (reader.layout.tp, reader.layout.pp) == (2, 2)
    assert reader.args.value_head
    state = reader.state_dict()
    fresh_args = dataclasses.replace(reader.args, pipe_parallel_size=0)
    fresh = build_gpt(fresh_args).state_dict()  # what a fresh run of the config draws
    assert set(state) == set(lm_state) - {"6.final_linear.weight"} | {"6.score.weight"}
    assert torch.equal(state["6.score.weight"], fresh["6.score.weight"])
    for name, tensor in state.items():
        if name != "6.score.weight":
            assert torch.equal(tensor, lm_state[name]), name


def test_another_architecture_is_refused(tmp_path, capsys):
    from tools import init_reward_model as tool

    lm_checkpoint(tmp_path / "lm")
    config = rm_config_file(tmp_path, hidden_size=64)
    out = tmp_path / "rm"
    argv = ["--checkpoint", str(tmp_path / "lm"), "--config", str(config), "--output", str(out)]
    assert tool.main(argv) == 2
    err = capsys.readouterr().err
    assert "word_embeddings.weight" in err and "the architectures differ" in err
    assert not out.exists()


def test_a_config_without_train_impl_rm_is_refused(tmp_path, capsys):
    from tools import init_reward_model as tool

    lm_checkpoint(tmp_path / "lm")
    path = tmp_path / "lm.yml"
    path.write_text(yaml.safe_dump(LM_KEYS))
    argv = ["--checkpoint", str(tmp_path / "lm"), "--config", str(path), "--output", "x"]
    assert tool.main(argv) == 2
    assert "set train_impl: rm" in capsys.readouterr().err
