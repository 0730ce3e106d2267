"""GPT sample indexing: which tokens make up each fixed-length training sample.

Three arrays, built once from a seeded RNG and cached as `.npy` files beside the data:

* doc_idx     (int32, epochs * n_docs): the documents of every epoch, shuffled together.
* sample_idx  (int32 or int64, (n_samples + 1, 2)): where each sample starts in the token
              stream that doc_idx spells out, as (index into doc_idx, offset in document).
* shuffle_idx (uint32 or int64, n_samples): the order samples are served in.

The RNG calls match GPT-NeoX (`np.random.RandomState(seed)`, doc_idx shuffled before
shuffle_idx), so the same data, seed, sequence length and sample count give its arrays.
The padded packings (`pack_impl: pack_until_overflow | unpacked`) build the same three arrays
by the rules of `packing.py`. The files are keyed by the `pack_impl` (in the name, as GPT-NeoX
names them) and a hash of everything that shapes them, written under temporary names and
renamed, and built by one rank (per node when nodes do not share a file system) while the
others poll for them (`wait_for_index`: no collective, whose timeout a long build would hit).
The hash covers sizes, not label values (reading every label would slow every start):
relabelled data of the same sizes needs its index files deleted.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from megatron.config.placement import node_local_rank
from megatron.data.index_helpers import index_helpers
from megatron.data.packing import DocumentRules, padded_packing

logger = logging.getLogger(__name__)

# Bump when the arrays' meaning changes, so stale caches are never reused.
INDEX_FORMAT_VERSION = 1
KINDS = ("doc_idx", "sample_idx", "shuffle_idx")
# How long a rank waits for another to build an index: far beyond any build (GPT-NeoX's
# Pile index takes minutes), independent of the collective timeout.
INDEX_WAIT_LIMIT_S = 3 * 3600.0
_POLL_S = 0.5


def num_epochs_needed(tokens_per_epoch: int, seq_length: int, num_samples: int) -> int:
    """Fewest epochs whose tokens give `num_samples` samples: samples share one token with
    their successor, so E epochs give (E * tokens_per_epoch - 1) // seq_length of them."""
    return max(1, -(-(num_samples * seq_length + 1) // tokens_per_epoch))


def build_doc_idx(documents: np.ndarray, num_epochs: int, rng: np.random.RandomState):
    doc_idx = np.tile(np.asarray(documents, dtype=np.int32), num_epochs)
    rng.shuffle(doc_idx)
    return doc_idx


def build_shuffle_idx(size: int, rng: np.random.RandomState) -> np.ndarray:
    dtype = np.uint32 if size < np.iinfo(np.uint32).max - 1 else np.int64
    shuffle_idx = np.arange(size, dtype=dtype)
    rng.shuffle(shuffle_idx)
    return shuffle_idx


def _doc_sizes(sizes: np.ndarray, documents: np.ndarray) -> np.ndarray:
    """sizes[documents], without a copy when the documents are one contiguous range."""
    if documents.size and documents[-1] - documents[0] + 1 == documents.size:
        if np.all(np.diff(documents) == 1):
            return sizes[int(documents[0]) : int(documents[-1]) + 1]
    return sizes[documents]


def cache_key(
    doc_sizes, documents, num_samples: int, seq_length: int, seed: int, packing=None
) -> str:
    """Hash of everything that determines the three arrays (not the path, which may differ
    between nodes mounting the same data). `packing`: for a padded pack_impl, its settings
    (JSON-able) and the size arrays of every side."""
    h = hashlib.blake2b(digest_size=10)
    params = dict(v=INDEX_FORMAT_VERSION, n=num_samples, s=seq_length, seed=seed)
    if packing is not None:
        params["packing"] = packing[0]
    h.update(json.dumps(params, sort_keys=True).encode())
    h.update(np.ascontiguousarray(documents, dtype=np.int64).tobytes())
    h.update(np.ascontiguousarray(doc_sizes, dtype=np.int32).tobytes())
    for sizes in packing[1] if packing is not None else ():
        h.update(np.ascontiguousarray(sizes, dtype=np.int32).tobytes())
    return h.hexdigest()


@dataclass(frozen=True)
class IndexMappings:
    doc_idx: np.ndarray
    sample_idx: np.ndarray
    shuffle_idx: np.ndarray
    num_epochs: int
    paths: dict[str, Path]
    built: bool  # this process built (rather than loaded) the files


def _save_atomic(path: Path, array: np.ndarray) -> None:
    tmp = path.with_name(f"{path.name}.tmp-{os.getpid()}")
    with open(tmp, "wb") as f:
        np.save(f, array, allow_pickle=False)
    os.replace(tmp, path)


def _distributed():
    """torch.distributed when a process group is up, else None (single process)."""
    try:
        import torch.distributed as dist
    except ImportError:
        return None
    return dist if dist.is_available() and dist.is_initialized() else None


def _is_builder(dist, use_shared_fs: bool) -> bool:
    """Global rank 0, or without a shared file system the first process of each node (its
    launcher's LOCAL_RANK: `node_local_rank`, which one visible GPU per process leaves)."""
    if dist is None:
        return True
    if use_shared_fs:
        return dist.get_rank() == 0
    return node_local_rank() == 0


def wait_for_index(paths: dict[str, Path], limit_s: float | None = None) -> None:
    """Until the building rank has renamed every file into place. The file system is polled,
    not a collective barrier waited at: a first build of a large corpus may outlast the
    process group's timeout (`distributed_timeout_minutes`, 10 by default), which would end
    every rank. Logs every minute; raises TimeoutError after `limit_s` (INDEX_WAIT_LIMIT_S).
    A builder that fails ends the job through the launcher, which stops every worker."""
    limit_s = INDEX_WAIT_LIMIT_S if limit_s is None else limit_s
    start = logged = time.monotonic()
    while not all(p.is_file() for p in paths.values()):
        waited = time.monotonic() - start
        if waited > limit_s:
            raise TimeoutError(
                f"{paths['doc_idx'].name} not built by another rank within {limit_s:.0f} s. If "
                "the nodes do not share a file system, set `use_shared_fs: false` so that each "
                "node builds its own."
            )
        if time.monotonic() - logged >= 60:
            logger.info("waiting %.0f s for another rank to build %s", waited, paths["doc_idx"])
            logged = time.monotonic()
        time.sleep(_POLL_S)


def _build_and_save(paths, sizes, documents, num_epochs, tokens_per_epoch, seq_length, seed):
    start = time.perf_counter()
    paths["doc_idx"].parent.mkdir(parents=True, exist_ok=True)
    rng = np.random.RandomState(seed)
    doc_idx = build_doc_idx(documents, num_epochs, rng)
    # Every full sample the epochs hold, not only num_samples: later epochs may be used.
    total_samples = (num_epochs * tokens_per_epoch - 1) // seq_length
    sample_idx = index_helpers().build_sample_idx(sizes, doc_idx, seq_length, total_samples)
    shuffle_idx = build_shuffle_idx(sample_idx.shape[0] - 1, rng)
    for kind, array in zip(KINDS, (doc_idx, sample_idx, shuffle_idx)):
        _save_atomic(paths[kind], array)
    logger.info(
        "built %s: %d samples over %d epochs in %.2f s (%s helpers)",
        paths["doc_idx"].name, total_samples, num_epochs, time.perf_counter() - start,
        index_helpers().name,
    )  # fmt: skip


def load_index_mappings(paths: dict[str, Path]) -> dict[str, np.ndarray]:
    """The three arrays, memory-mapped from their .npy files."""
    return {kind: np.load(path, mmap_mode="r", allow_pickle=False) for kind, path in paths.items()}


def _build_padded_and_save(paths, packing, rules: DocumentRules, num_samples: int, seed: int):
    start = time.perf_counter()
    paths["doc_idx"].parent.mkdir(parents=True, exist_ok=True)
    arrays = packing.build(rules, num_samples, seed)
    for kind, array in zip(KINDS, arrays):
        _save_atomic(paths[kind], array)
    logger.info(
        "built %s: %d %s samples of %d documents in %.2f s", paths["doc_idx"].name, num_samples,
        packing.name, arrays[0].size, time.perf_counter() - start,
    )  # fmt: skip


def _index_paths(name, cache_prefix, num_samples, seq_length, seed, pack_impl, rules, key):
    # GPT-NeoX's name (with its `_{pack_impl}pi` and `_ac` parts), then our content hash.
    chopped = "_ac" if rules is None or rules.allow_chopped else ""
    base = (
        f"{cache_prefix}_{name}_indexmap_{num_samples}ns_{seq_length}sl_{seed}s_"
        f"{pack_impl}pi{chopped}_{key}"
    )
    return {kind: Path(f"{base}_{kind}.npy") for kind in KINDS}


def build_index_mappings(
    name: str,
    cache_prefix: str | Path,
    sizes: np.ndarray,
    documents: np.ndarray,
    num_samples: int,
    seq_length: int,
    seed: int,
    use_shared_fs: bool = True,
    pack_impl: str = "packed",
    rules: DocumentRules | None = None,
) -> IndexMappings:
    """Load the cached index arrays for this split, building them first when missing.

    With torch.distributed initialised one rank builds and the others wait for its files
    (`wait_for_index`), without a collective. `cache_prefix` is the data prefix (files go
    beside the data) or a path in `data_cache_path`. A padded `pack_impl` needs the split's
    `rules` (packing.py). Raises ValueError naming the split when it has too few tokens.
    """
    documents = np.asarray(documents, dtype=np.int32)
    doc_sizes = _doc_sizes(sizes, documents)
    tokens_per_epoch = int(doc_sizes.sum(dtype=np.int64))
    if tokens_per_epoch < 2:
        raise ValueError(
            f"{cache_prefix} ({name} split): {documents.size} documents hold {tokens_per_epoch} "
            "tokens; a sample needs at least 2. Give this split more documents (`split`)."
        )
    packing, hashed = None, None
    if pack_impl != "packed":
        packing = padded_packing(pack_impl, rules.pairwise)
        settings = dict(
            impl=pack_impl, chopped=rules.allow_chopped, pairwise=rules.pairwise,
            labels=rules.all_masked is not None,
        )  # fmt: skip
        hashed = (settings, [s[documents] for s in rules.sizes])
        num_epochs = 0  # documents are drawn pass after pass as needed, not by epochs
    else:
        num_epochs = num_epochs_needed(tokens_per_epoch, seq_length, num_samples)
    key = cache_key(doc_sizes, documents, num_samples, seq_length, seed, hashed)
    paths = _index_paths(name, cache_prefix, num_samples, seq_length, seed, pack_impl, rules, key)

    builder = _is_builder(_distributed(), use_shared_fs)
    built = builder and not all(p.is_file() for p in paths.values())
    if built and packing is None:
        _build_and_save(paths, sizes, documents, num_epochs, tokens_per_epoch, seq_length, seed)
    elif built:
        _build_padded_and_save(paths, packing, rules, num_samples, seed)
    elif not builder:
        wait_for_index(paths)
    arrays = load_index_mappings(paths)
    return IndexMappings(num_epochs=num_epochs, paths=paths, built=built, **arrays)
