"""Index building under torch.distributed: one rank builds, the others wait and load."""

from __future__ import annotations

import os

import numpy as np

from tests.distributed import run_distributed


def _build(rank, world_size, prefix, cache_dirs, local_rank_zero):
    if local_rank_zero:  # pretend every rank is alone on its node
        os.environ["LOCAL_RANK"] = "0"
    from megatron.data.gpt_dataset import GPTDataset
    from megatron.data.indexed_dataset import MMapIndexedDataset

    ds = MMapIndexedDataset(prefix)
    gpt = GPTDataset(
        "train", ds, np.arange(len(ds)), 200, 8, 3,
        cache_prefix=os.path.join(cache_dirs[rank], "d"), use_shared_fs=not local_rank_zero,
    )  # fmt: skip
    return gpt.index_built, gpt.shuffle_idx.tobytes(), gpt[7]["text"].tolist()


def _write(tmp_path):
    from tests.unit.data.conftest import random_documents, write_dataset

    write_dataset(tmp_path / "d", random_documents(40, seed=9))
    return str(tmp_path / "d")


def test_rank0_builds_others_load(tmp_path):
    prefix = _write(tmp_path)
    shared = [str(tmp_path / "cache")] * 2
    results = run_distributed(_build, 2, prefix, shared, False)
    assert [built for built, _, _ in results] == [True, False]
    assert results[0][1:] == results[1][1:]
    assert len(list((tmp_path / "cache").glob("*_shuffle_idx.npy"))) == 1


def test_each_node_builds_without_shared_fs(tmp_path):
    prefix = _write(tmp_path)
    per_node = [str(tmp_path / "node0"), str(tmp_path / "node1")]
    results = run_distributed(_build, 2, prefix, per_node, True)
    assert [built for built, _, _ in results] == [True, True]
    assert results[0][1:] == results[1][1:]
