"""Train/valid/test datasets from the `data` group (`DataConfig`) and the few run values
outside it; the dataset kind (`gpt2`, `pairwise`, `dummy`) picks how (`kinds.py`).

    datasets = build_train_valid_test_datasets(cfg, num_samples_from_config(cfg))
    train, valid, test = datasets  # GPTDataset, PairwiseDataset, BlendableDataset, DummyDataset
    # without a whole config: the group and the run's values
    datasets = build_datasets(data, [800, 80, 8], seq_length=2048, seed=1234)
"""

from __future__ import annotations

import math

from megatron.config.groups.data import DataConfig
from megatron.data.kinds import dataset_kind


def build_datasets(
    data: DataConfig,
    train_valid_test_num_samples,
    *,
    seq_length: int,
    seed: int,
    vocab_size: int | None = None,
):
    """(train, valid, test) datasets; a split with no data or no requested samples is None.
    `vocab_size`: the tokenizer's vocabulary, below the padded table's (read by `data_impl:
    dummy` only: its tokens are drawn below it, as a tokenizer's would be). Collective under
    torch.distributed (index files are built by one rank)."""
    kind = dataset_kind(data, seq_length=seq_length, seed=seed, vocab_size=vocab_size)
    return kind.build([int(n) for n in train_valid_test_num_samples])


def run_values(cfg) -> dict:
    """What dataset building reads outside `cfg.data` in the resolved config `cfg`
    (duck-typed: cfg.model, cfg.training): `build_datasets`' keyword arguments."""
    return {
        "seq_length": cfg.model.seq_length,
        "seed": cfg.training.seed,
        # the tokenizer's: ids from it up to the padded size are no tokens (the loss leaves
        # their logit columns out), so synthetic data must not draw them
        "vocab_size": getattr(cfg.model, "true_vocab_size", None) or cfg.model.padded_vocab_size,
    }


def build_train_valid_test_datasets(cfg, train_valid_test_num_samples):
    """(train, valid, test) for the resolved config `cfg`; see `build_datasets`."""
    return build_datasets(cfg.data, train_valid_test_num_samples, **run_values(cfg))


def train_valid_test_num_samples(
    train_iters: int, eval_interval: int, eval_iters: int, global_batch_size: int
) -> list[int]:
    """Samples each split must supply: every train step, every evaluation (one per
    `eval_interval` and one at the end) and the final test evaluation."""
    evaluations = train_iters // eval_interval + 1 if eval_interval else 1
    return [
        train_iters * global_batch_size,
        evaluations * eval_iters * global_batch_size,
        eval_iters * global_batch_size,
    ]


def num_samples_from_config(cfg) -> list[int]:
    t = cfg.training
    if t.train_iters is None:
        raise ValueError("train_iters is not set; set it (or train_epochs, which derives it)")
    return train_valid_test_num_samples(
        t.train_iters, t.eval_interval, t.eval_iters, t.train_batch_size
    )


def train_samples_per_epoch(cfg) -> int:
    """Training samples in one pass over the training data (to turn `train_epochs` into
    `train_iters`): for blended data, the sum over the datasets."""
    return dataset_kind(cfg.data, **run_values(cfg)).samples_per_epoch()


def iters_for_epochs(train_epochs: int, samples_per_epoch: int, global_batch_size: int) -> int:
    return math.ceil(train_epochs * samples_per_epoch / global_batch_size)
