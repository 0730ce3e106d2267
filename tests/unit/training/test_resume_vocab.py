"""The padded vocabulary a run builds: GPT-NeoX's rule (a multiple of
`make_vocab_size_divisible_by` × tensor-parallel size) for a fresh run, and for a resumed run
the checkpoint's padded size where the new layout can hold it (a multiple of
`make_vocab_size_divisible_by` and of the tensor-parallel size, with room for the tokens),
since the padding logits are masked out of the loss; `tools/reshard.py` keeps it by the same
rule. GPT-2's 50257 tokens are padded to 50304 rows at tp 1 and 50432 at tp 2."""

from __future__ import annotations

import json

import pytest

from megatron.checkpoint.folders import CONFIG_FILE, write_latest
from megatron.config import kept_padded_vocab
from megatron.training.setup.resume_vocab import with_checkpoint_vocab
from tests.tiny import tiny_config


def neox_padding(vocab: int, divisible_by: int, tp: int) -> int:
    """GPT-NeoX's `_vocab_size_with_padding`: round up to a multiple of divisible_by × tp."""
    multiple = divisible_by * tp
    after = vocab
    while after % multiple:
        after += 1
    return after


@pytest.mark.parametrize(
    ("saved", "divisible_by", "tp", "expected"),
    [
        (50304, 128, 2, 50304),  # tp 1's padding holds at tp 2: kept
        (50304, 128, 8, 50304),
        (50432, 128, 1, 50432),  # tp 2's at tp 1: kept too
        (50304, 128, 5, neox_padding(50257, 128, 5)),  # 5 does not divide 50304
        (50304, 1024, 1, neox_padding(50257, 1024, 1)),  # not a multiple of the new setting
        (50176, 128, 1, neox_padding(50257, 128, 1)),  # fewer rows than tokens
        (None, 128, 2, neox_padding(50257, 128, 2)),  # no checkpoint
    ],
)
def test_a_checkpoints_padding_is_kept_where_the_layout_holds_it(saved, divisible_by, tp, expected):
    assert kept_padded_vocab(saved, 50257, divisible_by, tp) == expected


def config(tmp_path, tp: int, **keys):
    changes = {"model_parallel_size": tp, "load": str(tmp_path), **keys}
    return tiny_config(world_size=tp, vocab_size=50257, **changes)


def save_config(tmp_path, cfg, tag="global_step3"):
    (tmp_path / tag).mkdir()
    (tmp_path / tag / CONFIG_FILE).write_text(json.dumps(cfg.to_dict()))
    write_latest(tmp_path, tag)


def test_resolution_records_the_tokenizers_vocabulary(tmp_path):
    for tp in (1, 2):
        m = config(tmp_path, tp).model
        assert (m.true_vocab_size, m.padded_vocab_size) == (50257, neox_padding(50257, 128, tp))


def test_a_resumed_run_keeps_the_checkpoints_padded_vocabulary(tmp_path):
    fresh = config(tmp_path, tp=2)
    assert with_checkpoint_vocab(fresh) is fresh  # nothing to resume
    save_config(tmp_path, config(tmp_path, tp=1))  # saved with 50304 rows
    resumed = with_checkpoint_vocab(fresh)
    assert fresh.model.padded_vocab_size == 50432
    assert resumed.model.padded_vocab_size == 50304
    assert resumed.replace(padded_vocab_size=50432) == fresh  # nothing else changes
    coarser = config(tmp_path, tp=2, make_vocab_size_divisible_by=1024)  # 50304 is no multiple
    assert with_checkpoint_vocab(coarser) is coarser


def test_reshard_keeps_the_padded_vocabulary_where_its_target_holds_it(tmp_path):
    from megatron.checkpoint_tools.reshard import target_config

    saved = config(tmp_path, tp=1)  # 50304 rows; the tokenizer's files are not here
    for tp, rows in ((2, 50304), (4, 50304), (1, 50304)):
        m = target_config(saved, tp=tp, pp=1).model
        assert (m.padded_vocab_size, m.true_vocab_size) == (rows, 50257)
    coarse = saved.replace(make_vocab_size_divisible_by=1024)
    assert target_config(coarse, tp=2, pp=1).model.padded_vocab_size == 51200
