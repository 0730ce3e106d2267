"""Did-you-mean for what a newcomer types: another trainer's key name (`learning_rate`, which no
spelling match finds near `lr`) is answered with ours, and a mistyped config file name with the
files that are there. The names are the Hugging Face Trainer's own (its `TrainingArguments`
fields) and nanoGPT's/Megatron-LM's; each points at keys that exist and is itself unknown to
us, so no entry is dead or shadows a key."""

from __future__ import annotations

import re

import pytest

from megatron.config import ConfigError, load_config
from megatron.config.config import KEY_TO_GROUP
from megatron.config.loader import CONFIGS_DIR, find_config_file
from megatron.config.neox.keys import NEOX_KEYS, RENAMED
from megatron.config.other_names import OTHER_NAMES

from .conftest import MINIMAL


def _refusal(write, text: str) -> str:
    with pytest.raises(ConfigError) as err:
        load_config([write("mine.yml", MINIMAL + text)], warn=[])
    return str(err.value)


@pytest.mark.parametrize(
    ("line", "suggested"),
    [
        ("learning_rate: 0.001", "did you mean 'lr' (the peak learning rate)?"),
        ("max_steps: 100", "did you mean 'train_iters'"),
        ("per_device_train_batch_size: 4", "did you mean 'train_micro_batch_size_per_gpu'"),
        ("adam_beta2: 0.95", "did you mean 'optimizer: {params: {betas: [b1, b2]}}'"),
        ("n_embd: 64", "did you mean 'hidden_size'"),
    ],
)
def test_another_trainers_name_is_answered_with_ours(write, line, suggested):
    message = _refusal(write, line + "\n")
    assert f"unknown config key '{line.split(':')[0]}' in " in message
    assert "mine.yml" in message and suggested in message


def test_every_entry_is_unknown_to_us_and_points_at_real_keys():
    for name, (ours, _) in OTHER_NAMES.items():
        assert name not in KEY_TO_GROUP and name not in RENAMED and name not in NEOX_KEYS, name
        words = ["optimizer"] if ":" in ours else ours.split(" and ")
        assert all(w in KEY_TO_GROUP for w in words), (name, ours)


def test_the_hugging_face_names_are_trainingarguments_fields():
    transformers = pytest.importorskip("transformers")
    fields = set(transformers.TrainingArguments.__dataclass_fields__)
    ours = {"learning_rate", "max_steps", "per_device_train_batch_size", "warmup_steps",
            "max_grad_norm", "output_dir", "save_steps", "eval_steps",
            "logging_steps", "lr_scheduler_type", "adam_beta1", "adam_beta2", "adam_epsilon",
            "resume_from_checkpoint"}  # fmt: skip
    assert ours <= fields and ours <= set(OTHER_NAMES)


def test_a_spelling_mistake_still_gets_the_closest_keys(write):
    assert "did you mean 'hidden_dropout'" in _refusal(write, "hiden_dropout: 0.1\n")


@pytest.mark.parametrize(
    ("typed", "suggested"),
    [
        ("configs/smal.yml", "'configs/small.yml'"),
        ("configs/160m", "'configs/160M.yml'"),
        ("160m.yml", f"'{CONFIGS_DIR / '160M.yml'}'"),
    ],
)
def test_a_mistyped_config_file_names_the_files_like_it(typed, suggested, monkeypatch):
    monkeypatch.chdir(CONFIGS_DIR.parent)
    with pytest.raises(ConfigError) as err:
        find_config_file(typed)
    message = str(err.value)
    assert message.startswith(f"config file '{typed}' not found")
    assert re.search(r"did you mean " + re.escape(suggested), message), message
