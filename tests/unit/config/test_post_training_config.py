"""`train_impl` and the DPO/KTO keys: GPT-NeoX's defaults, and refusals naming the key."""

from __future__ import annotations

import pytest

from megatron.config import load_config
from megatron.config.schema import ConfigError
from tests.unit.config.conftest import MINIMAL

PAIRS = """
dataset_impl: pairwise
pack_impl: unpacked
pos_train_data_paths: [{d}/pos]
neg_train_data_paths: [{d}/neg]
"""


def _load(write, text):
    files = [write("run.yml", MINIMAL + text)]
    return load_config(files, warn=[], vocab_size=100, world_size=2)


def test_dpo_runs_on_pairs_with_gpt_neox_defaults(write, tmp_path):
    cfg = _load(write, "train_impl: dpo\n" + PAIRS.format(d=tmp_path))
    p = cfg.post_training
    assert (p.dpo_beta, p.dpo_fp32, p.dpo_reference_free) == (0.1, True, False)


@pytest.mark.parametrize(
    "text, message",
    [
        ("train_impl: dpo\n", r"train_impl: dpo \(in .*run.yml\) needs dataset_impl: pairwise"),
        ("train_impl: kto\n", r"train_impl: kto .*set train_reward_data_paths"),
        (
            "train_impl: kto\ntrain_data_paths: [a]\ntrain_reward_data_paths: [b]\n"
            "pack_impl: unpacked\ntrain_micro_batch_size_per_gpu: 3\n",
            r"train_micro_batch_size_per_gpu must be even",
        ),
        ("train_impl: dpo\nz_loss: 0.1\n", r"z_loss \(in .*run.yml\) .*set z_loss: 0"),
        ("dpo_reference_free: true\n", r"dpo_reference_free .*applies to train_impl: dpo only"),
        ("train_impl: ppo\n", r"train_impl"),
        (
            "train_impl: kto\ntrain_data_paths: [a]\ntrain_reward_data_paths: [b]\n"
            "pack_impl: unpacked\nmoe_num_experts: 4\nmoe_expert_parallel_size: 2\nnum_gpus: 2\n",
            r"moe_expert_parallel_size > 1 is not built",
        ),
    ],
)
def test_objectives_without_what_they_need_are_refused(write, text, message):
    with pytest.raises(ConfigError, match=message):
        _load(write, text)


KTO = "train_impl: kto\ntrain_data_paths: [a]\ntrain_reward_data_paths: [b]\n"
RM = "train_impl: rm\npos_train_label_data_paths: [{d}/pl]\nneg_train_label_data_paths: [{d}/nl]\n"


@pytest.mark.parametrize(
    "objective, pack_impl, message",
    [
        (
            KTO,
            None,
            r"train_impl: kto .*pack_impl: packed \(the default\):.*set pack_impl: unpacked",
        ),
        (
            KTO,
            "pack_until_overflow",
            r"train_impl: kto .*pack_impl: pack_until_overflow \(in .*run.yml\).*rewards averaged"
            r".*set pack_impl: unpacked",
        ),
        (
            RM,
            "pack_until_overflow",
            r"train_impl: rm .*pack_impl: pack_until_overflow \(in .*run.yml\).*every earlier "
            r"pair would be dropped; set pack_impl: unpacked",
        ),
    ],
    ids=["kto-packed", "kto-pack_until_overflow", "rm-pack_until_overflow"],
)
def test_rows_of_several_documents_are_refused_where_one_value_is_read_per_row(
    write, tmp_path, objective, pack_impl, message
):
    """GPT-NeoX reads reward data only unpacked; a KTO row mixing desirable and undesirable
    documents, or a reward-model row of several pairs scored once, changes the objective."""
    text = objective.format(d=tmp_path)
    if objective is RM:
        text += PAIRS.format(d=tmp_path)
    if pack_impl:
        text = text.replace("pack_impl: unpacked\n", "") + f"pack_impl: {pack_impl}\n"
    with pytest.raises(ConfigError, match=message):
        _load(write, text)
    unpacked = _load(write, text.replace(f"pack_impl: {pack_impl}\n", "") + "pack_impl: unpacked\n")
    assert unpacked.data.pack_impl == "unpacked"


def test_the_small_sft_and_dpo_examples_resolve():
    from pathlib import Path

    root = Path(__file__).resolve().parents[3]
    sft = load_config([root / "configs/sft-small.yml"], warn=[])
    dpo = load_config([root / "configs/dpo-small.yml"], warn=[])
    assert sft.data.train_label_data_paths and sft.post_training.train_impl == "normal"
    assert dpo.post_training.train_impl == "dpo" and dpo.checkpointing.finetune
    assert dpo.checkpointing.load == sft.checkpointing.save  # DPO starts from the SFT run
