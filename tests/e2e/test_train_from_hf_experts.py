"""Training starts from a Mixtral imported at `moe_expert_parallel_size: 2` (issue 13).

A tiny random `transformers` Mixtral (4 experts) goes through `tools/convert_from_hf.py
--expert-parallel-size 2`; `deepy.py train.py` with its `hf_import.yml` (`finetune: true`) on
2 CPU ranks (data-parallel 2 = expert-parallel 2) runs 2 iterations at learning rate 0 and
saves. Every tensor of the saved checkpoint equals the imported one: each expert-parallel rank
loaded its own experts (rank 1 with rank 0's would save experts 0-1 twice) and training saves
them back in the same files. The losses are finite.
"""

from __future__ import annotations

import json
import math

import pytest
import torch

from megatron.checkpoint_tools import CheckpointReader
from tests.e2e.test_train_deepy import _deepy, _finish, _train_losses, _write_config

transformers = pytest.importorskip("transformers")

pytestmark = pytest.mark.slow


def test_training_from_an_imported_ep2_mixtral_loads_each_ranks_experts(tmp_path):
    from tools import convert_from_hf

    config = transformers.MixtralConfig(
        vocab_size=512,  # the character tokenizer's (tests/tiny.py)
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        intermediate_size=48,
        max_position_embeddings=32,
        num_local_experts=4,
        num_experts_per_tok=2,
    )
    torch.manual_seed(0)
    transformers.MixtralForCausalLM(config).save_pretrained(tmp_path / "hf")
    imported = tmp_path / "imported"
    argv = ["--hf", str(tmp_path / "hf"), "--output", str(imported),
            "--model-parallel-size", "1", "--pipe-parallel-size", "1",
            "--expert-parallel-size", "2"]  # fmt: skip
    assert convert_from_hf.main(argv) == 0
    keys = json.loads((imported / "hf_import.yml").read_text())  # JSON is YAML
    assert keys["moe_expert_parallel_size"] == 2 and keys["finetune"] is True

    run = tmp_path / "run"
    frozen = {"type": "AdamW", "params": {"lr": 0.0, "betas": [0.9, 0.95]}}
    settings = dict(keys, num_gpus=2, train_iters=2, checkpoint_factor=2, eval_interval=100,
                    hidden_dropout=0.0, attention_dropout=0.0, optimizer=frozen, min_lr=0.0,
                    lr_decay_style="constant", warmup=0.0)  # fmt: skip
    out = _finish(_deepy(_write_config(run, **settings)))
    losses = _train_losses(run)
    assert sorted(losses) == [1, 2], out[-3000:]
    assert all(math.isfinite(v) for v in losses.values())

    saved = CheckpointReader(run / "ckpt")
    assert saved.layout.iteration == 2
    assert sorted(p.name for p in saved.folder.glob("expert_states_*")) == [
        "expert_states_pp0_ep1.pt"
    ]
    expected, actual = CheckpointReader(imported).state_dict(), saved.state_dict()
    assert sorted(actual) == sorted(expected)
    for name, tensor in expected.items():
        assert torch.equal(actual[name], tensor), name
