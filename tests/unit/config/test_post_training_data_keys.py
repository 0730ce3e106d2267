"""`dataset_impl`, `pack_impl`, `allow_chopped`, the pos/neg/reward paths and
`precompute_model_name`: GPT-NeoX's values load, and every inconsistent use is refused naming
the key, the file and what would do."""

import pytest

from megatron.config import ConfigError, load_config

from .conftest import MINIMAL

PAIRS = (
    "dataset_impl: pairwise\npack_impl: unpacked\n"
    "pos_train_data_paths: [d/pos]\nneg_train_data_paths: [d/neg]\n"
)


def _load(write, text):
    return load_config([write("post.yml", MINIMAL + text)], warn=[])


def test_neox_values_load(write):
    cfg = _load(write, PAIRS + "allow_chopped: false\nprecompute_model_name: sft\n")
    d = cfg.data
    assert (d.dataset_impl, d.pack_impl, d.allow_chopped) == ("pairwise", "unpacked", False)
    assert d.pos_train_data_paths == ["d/pos"] and d.precompute_model_name == "sft"
    defaults = _load(write, "").data
    assert (defaults.dataset_impl, defaults.pack_impl, defaults.allow_chopped) == (
        "gpt2", "packed", True,
    )  # fmt: skip
    text = (
        "train_data_paths: [d/t]\ntrain_reward_data_paths: [d/r]\npack_impl: pack_until_overflow\n"
    )
    assert _load(write, text).data.train_reward_data_paths == ["d/r"]


def test_the_issue_spelling_gpt_reads_as_gpt2(write):
    from megatron.data.kinds import kind_name

    cfg = _load(write, "dataset_impl: gpt\n")
    assert kind_name(cfg.data) == "gpt2"


@pytest.mark.parametrize(
    "text, words",
    [
        ("dataset_impl: pairwise\npack_impl: unpacked\n", "needs pos_train_data_paths"),
        (PAIRS.replace("pack_impl: unpacked\n", ""), "cannot use pack_impl: packed"),
        (PAIRS + "data_path: d/x\n", "post.yml) not read with dataset_impl: pairwise"),
        (PAIRS.replace("neg_train_data_paths: [d/neg]\n", ""), "neg_train_data_paths is not"),
        (PAIRS + "pos_valid_data_paths: [a, b]\nneg_valid_data_paths: [a]\n", "have 2 and 1"),
        (PAIRS + "pos_train_label_data_paths: [l]\n", "neg_train_label_data_paths is not"),
        (PAIRS + "train_data_weights: [1, 2]\n", "pos_train_data_paths has 1 paths"),
        ("pos_train_data_paths: [p]\nneg_train_data_paths: [n]\n", "only with dataset_impl:"),
        ("train_data_paths: [a]\ntrain_reward_data_paths: [r, s]\n", "one reward dataset per"),
        (
            "train_data_paths: [a]\nvalid_data_paths: [b]\ntrain_reward_data_paths: [r]\n",
            "valid_reward_data_paths missing",
        ),
        ("pack_impl: unpacked\ntrain_epochs: 1\ntrain_iters: null\n", "needs pack_impl: packed"),
        ("pack_impl: padded\n", "'pack_until_overflow'"),
        ("data_impl: dummy\nprecompute_model_name: m\n", "reads no files"),
    ],
)
def test_inconsistent_post_training_data_is_refused(write, text, words):
    with pytest.raises(ConfigError) as err:
        _load(write, text)
    assert words in str(err.value)
