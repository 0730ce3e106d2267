"""Training data settings (`cfg.data`)."""

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
