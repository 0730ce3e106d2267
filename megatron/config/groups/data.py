"""Training data settings (`cfg.data`): where the datasets are, how documents become samples
(`pack_impl`), and the post-training data of GPT-NeoX (pairs, rewards, reference log-probs)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal


@dataclass(frozen=True)
class DataConfig:
    data_path: str | None = None
    """Prefix of one `.bin/.idx` dataset, split into train/valid/test by `split`."""

    train_data_paths: list[str] | None = None
    """Prefixes of the training datasets (instead of `data_path`)."""

    valid_data_paths: list[str] | None = None
    """Prefixes of the validation datasets."""

    test_data_paths: list[str] | None = None
    """Prefixes of the test datasets."""

    train_data_weights: list[float] | None = None
    """Blending weights of `train_data_paths` (default: equal, or by size with
    `weight_by_num_documents`)."""

    valid_data_weights: list[float] | None = None
    """Blending weights of `valid_data_paths`."""

    test_data_weights: list[float] | None = None
    """Blending weights of `test_data_paths`."""

    train_label_data_paths: list[str] | None = None
    """Per-token label datasets matching `train_data_paths` (-100 masks a token from the
    loss)."""

    valid_label_data_paths: list[str] | None = None
    """Per-token label datasets matching `valid_data_paths`."""

    test_label_data_paths: list[str] | None = None
    """Per-token label datasets matching `test_data_paths`."""

    pos_train_data_paths: list[str] | None = None
    """Prefixes of the chosen (preferred) sides of the training pairs, with `dataset_impl:
    pairwise`; document d of each is pair d."""

    neg_train_data_paths: list[str] | None = None
    """Prefixes of the rejected sides of the training pairs, one per `pos_train_data_paths`
    entry, with as many documents."""

    pos_train_label_data_paths: list[str] | None = None
    """Per-token labels of `pos_train_data_paths` (-100 where no loss, e.g. the prompt);
    given with `neg_train_label_data_paths` or not at all."""

    neg_train_label_data_paths: list[str] | None = None
    """Per-token labels of `neg_train_data_paths`."""

    train_reward_data_paths: list[str] | None = None
    """Per-token rewards of `train_data_paths` (KTO: positive for desirable completions,
    negative for undesirable), one dataset per data path."""

    pos_valid_data_paths: list[str] | None = None
    """Prefixes of the chosen (preferred) sides of the validation pairs, with `dataset_impl:
    pairwise`; document d of each is pair d."""

    neg_valid_data_paths: list[str] | None = None
    """Prefixes of the rejected sides of the validation pairs, one per `pos_valid_data_paths`
    entry, with as many documents."""

    pos_valid_label_data_paths: list[str] | None = None
    """Per-token labels of `pos_valid_data_paths` (-100 where no loss, e.g. the prompt);
    given with `neg_valid_label_data_paths` or not at all."""

    neg_valid_label_data_paths: list[str] | None = None
    """Per-token labels of `neg_valid_data_paths`."""

    valid_reward_data_paths: list[str] | None = None
    """Per-token rewards of `valid_data_paths` (KTO: positive for desirable completions,
    negative for undesirable), one dataset per data path."""

    pos_test_data_paths: list[str] | None = None
    """Prefixes of the chosen (preferred) sides of the test pairs, with `dataset_impl:
    pairwise`; document d of each is pair d."""

    neg_test_data_paths: list[str] | None = None
    """Prefixes of the rejected sides of the test pairs, one per `pos_test_data_paths`
    entry, with as many documents."""

    pos_test_label_data_paths: list[str] | None = None
    """Per-token labels of `pos_test_data_paths` (-100 where no loss, e.g. the prompt);
    given with `neg_test_label_data_paths` or not at all."""

    neg_test_label_data_paths: list[str] | None = None
    """Per-token labels of `neg_test_data_paths`."""

    test_reward_data_paths: list[str] | None = None
    """Per-token rewards of `test_data_paths` (KTO: positive for desirable completions,
    negative for undesirable), one dataset per data path."""

    dataset_impl: Literal["gpt2", "gpt", "pairwise"] = "gpt2"
    """What a sample is: `gpt2` (GPT-NeoX's default) a token sequence from `data_path` or
    `train_data_paths` (with labels, rewards, reference log-probs when given); `pairwise` a
    chosen/rejected pair from `pos_*`/`neg_*_data_paths` (DPO, reward models), which needs
    `pack_impl: unpacked` or `pack_until_overflow`. `gpt` is read as `gpt2`."""

    pack_impl: Literal["packed", "pack_until_overflow", "unpacked"] = "packed"
    """How documents become samples of `seq_length + 1` tokens (GPT-NeoX's rules): `packed`
    cuts the shuffled token stream across document boundaries (no padding); `pack_until_overflow`
    fills a sample with whole shuffled documents until the next would overflow it;
    `unpacked` gives each document its own sample. The last two pad with token 0, label -100,
    and skip documents whose labels mask all of the first sample."""

    allow_chopped: bool = True
    """With `pack_until_overflow` or `unpacked`: truncate a document longer than `seq_length
    + 1` tokens (true), or skip it (false). No effect with `packed`."""

    precompute_model_name: str | None = None
    """Read per-token reference log-probs of every data (or pos/neg) prefix from
    `{prefix}_{precompute_model_name}` (GPT-NeoX's naming), as `generate.py` with
    `text_gen_type: precompute` writes them; the samples then carry `ref` (or `pos_ref`,
    `neg_ref`)."""

    data_impl: Literal["mmap", "cached", "infer", "dummy"] = "infer"
    """Indexed dataset format: `mmap` (the Megatron/GPT-NeoX `.bin/.idx` format) is read;
    `infer` (GPT-NeoX's default) reads it too; the legacy `cached` format is refused. `dummy`
    reads no files: synthetic tokens (uniform over the padded vocabulary, fixed by `seed`)
    through the same sampler, loader and batch path, for benchmarking; no data path may be
    set with it."""

    split: str = "969,30,1"
    """Train/valid/test proportions of `data_path`, e.g. `949,50,1`."""

    weight_by_num_documents: bool = False
    """Blend datasets in proportion to their document counts (tempered by
    `weighted_sampler_alpha`)."""

    weighted_sampler_alpha: float = 1.0
    """Exponent on document counts when weighting by them (below 1 up-samples small sets)."""

    data_cache_path: str | None = None
    """Folder for the cached sample indices (default: beside the data)."""

    use_shared_fs: bool = True
    """The data folder is shared by all nodes: only global rank 0 builds indices (else one rank
    per node)."""

    mmap_warmup: bool = False
    """Read through the `.bin` files once at start to warm the page cache."""

    num_workers: int = 2
    """Data-loader worker processes per rank."""

    eod_mask_loss: bool = False
    """Mask the end-of-document token from the loss."""

    reset_position_ids: bool = False
    """Restart position ids at each document boundary."""

    reset_attention_mask: bool = False
    """Block attention across document boundaries."""
