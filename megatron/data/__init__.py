"""Data pipeline: tokenizers, the `.bin/.idx` mmap format, GPT sample indexing, blending,
samplers and loaders. What the training loop calls::

    from megatron.data import (build_tokenizer, pad_vocab_size, num_samples_from_config,
                               build_train_valid_test_datasets, build_data_iterator)
    tokenizer = build_tokenizer(cfg)
    train, valid, test = build_train_valid_test_datasets(cfg, num_samples_from_config(cfg))
    batches = build_data_iterator(train, consumed_samples, micro_batch_size, dp_rank, dp_size)

Nothing here imports torch at module load except the loaders, when called.
"""

from megatron.data.blendable_dataset import BlendableDataset, weights_by_num_docs
from megatron.data.builders import (
    build_datasets,
    build_train_valid_test_datasets,
    iters_for_epochs,
    num_samples_from_config,
    train_samples_per_epoch,
    train_valid_test_num_samples,
)
from megatron.data.data_loaders import build_data_iterator, build_data_loader
from megatron.data.gpt_dataset import GPTDataset
from megatron.data.indexed_dataset import MMapIndexedDataset
from megatron.data.indexed_format import IndexedDatasetError, best_fitting_dtype
from megatron.data.indexed_writer import IndexedDatasetWriter
from megatron.data.kinds import DATASET_KINDS, DatasetKind, parse_split
from megatron.data.pairwise_dataset import PairwiseDataset
from megatron.data.samplers import PretrainingSampler
from megatron.data.tokenizers import Tokenizer, build_tokenizer, make_tokenizer, pad_vocab_size

__all__ = [
    "BlendableDataset",
    "DATASET_KINDS",
    "DatasetKind",
    "GPTDataset",
    "IndexedDatasetError",
    "IndexedDatasetWriter",
    "MMapIndexedDataset",
    "PairwiseDataset",
    "PretrainingSampler",
    "Tokenizer",
    "best_fitting_dtype",
    "build_data_iterator",
    "build_data_loader",
    "build_datasets",
    "build_tokenizer",
    "build_train_valid_test_datasets",
    "iters_for_epochs",
    "make_tokenizer",
    "num_samples_from_config",
    "pad_vocab_size",
    "parse_split",
    "train_samples_per_epoch",
    "train_valid_test_num_samples",
    "weights_by_num_docs",
]
