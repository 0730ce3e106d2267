"""`data_impl: dummy`: a config with no data files resolves, and the trainer's own data path
(`data_setup.build_datasets` → `BatchFactory`: sampler, loader, `ModelBatches`) yields model
inputs of synthetic tokens, the same for a seed, different across seeds and splits, disjoint
across data-parallel ranks; paths or epochs beside it are refused."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from megatron.config import ConfigError, load_config
from megatron.training.setup.batches import BatchSettings
from megatron.training.setup.data import BatchFactory, build_datasets, resolve_train_iters

RUN = """
num_layers: 2
hidden_size: 64
num_attention_heads: 4
seq_length: 16
train_micro_batch_size_per_gpu: 2
gradient_accumulation_steps: 1
optimizer: {type: Adam, params: {lr: 0.001}}
train_iters: 5
eval_interval: 5
eval_iters: 2
tokenizer_type: CharLevelTokenizer
num_workers: 0
data_impl: dummy
"""


def _load(tmp_path, text: str, world_size: int = 1):
    path = tmp_path / "run.yml"
    path.write_text(text)
    return load_config([path], world_size=world_size, vocab_size=300, warn=[])


def _inputs(cfg, split: int, dp_rank: int = 0, dp_size: int = 1, take: int = 3):
    datasets = build_datasets(cfg, resolve_train_iters(cfg))
    topology = SimpleNamespace(dp_rank=dp_rank, dp_size=dp_size)
    factory = BatchFactory(cfg, topology, BatchSettings.from_config(cfg, eod_token=0))
    batches = factory(datasets[split], 0)
    return datasets, [next(batches) for _ in range(take)]


def test_dummy_data_needs_no_files_and_feeds_the_model_path(tmp_path):
    cfg = _load(tmp_path, RUN)
    assert cfg.data.data_impl == "dummy" and cfg.data.data_path is None
    datasets, inputs = _inputs(cfg, 0)
    # every sample the run reads: 5 steps of 2; 2 evaluations of 2 batches; one test of 2
    assert [len(d) for d in datasets] == [10, 8, 4]
    # tokens below the tokenizer's 300, never in the padding up to 384: the loss leaves those
    # logit columns out, and a label there indexes past them (on a GPU, a device-side assert)
    vocab = cfg.model.true_vocab_size
    assert vocab == 300 < cfg.model.padded_vocab_size
    seen = set()
    for (tokens, positions), (labels, mask) in inputs:
        assert tokens.shape == positions.shape == labels.shape == mask.shape == (2, 16)
        assert tokens.dtype == labels.dtype == torch.int64
        assert 0 <= int(tokens.min()) and int(tokens.max()) < vocab
        assert torch.equal(tokens[:, 1:], labels[:, :-1])  # next-token targets
        assert torch.equal(positions[0], torch.arange(16)) and bool(mask.all())
        seen.update(tokens.flatten().tolist())
    assert len(seen) > 48  # 96 draws spread over the vocabulary, not a fixed pattern


def test_dummy_tokens_follow_the_seed_split_and_rank(tmp_path):
    cfg = _load(tmp_path, RUN)
    _, first = _inputs(cfg, 0)
    _, again = _inputs(cfg, 0)
    assert all(torch.equal(a[0][0], b[0][0]) for a, b in zip(first, again))
    _, other_seed = _inputs(_load(tmp_path, RUN + "seed: 7\n"), 0)
    assert not torch.equal(first[0][0][0], other_seed[0][0][0])
    _, valid = _inputs(cfg, 1, take=1)
    assert not torch.equal(first[0][0][0], valid[0][0][0])
    rank0 = _inputs(_load(tmp_path, RUN, 2), 0, dp_rank=0, dp_size=2, take=1)[1][0][0][0]
    rank1 = _inputs(_load(tmp_path, RUN, 2), 0, dp_rank=1, dp_size=2, take=1)[1][0][0][0]
    assert not torch.equal(rank0, rank1)


@pytest.mark.parametrize(
    "extra, key",
    [
        ("data_path: /data/pile_text_document\n", "data_path"),
        ("train_data_paths: [/data/a]\n", "train_data_paths"),
        ("train_epochs: 1\n", "train_epochs"),
    ],
)
def test_dummy_data_refuses_what_it_would_ignore(tmp_path, extra, key):
    with pytest.raises(ConfigError, match=f"{key}.*dummy|dummy.*{key}"):
        _load(tmp_path, RUN + extra)
