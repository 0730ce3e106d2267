"""An index build longer than the collective timeout does not end the run.

GPT-NeoX-sized corpora take minutes to index the first time, and `distributed_timeout_minutes`
(10 by default) bounds every collective: the waiting ranks must not wait in one. Here the
process group's timeout is 3 s and rank 0's build takes 8 s; rank 1 still loads its index.
"""

from __future__ import annotations

import os
import time
from datetime import timedelta
from pathlib import Path

import numpy as np
import pytest

from tests.distributed import free_port, run_distributed

TIMEOUT_S = 3
BUILD_S = 8


def _slow_build(rank, world_size, port, prefix, cache):
    import torch.distributed as dist

    from megatron.data import index_mapping
    from megatron.data.gpt_dataset import GPTDataset
    from megatron.data.indexed_dataset import MMapIndexedDataset

    dist.destroy_process_group()  # the same group with a short timeout
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world_size,
        timeout=timedelta(seconds=TIMEOUT_S),
    )  # fmt: skip
    build = index_mapping._build_and_save

    def slow(*args):
        time.sleep(BUILD_S)
        build(*args)

    index_mapping._build_and_save = slow
    ds = MMapIndexedDataset(prefix)
    gpt = GPTDataset(
        "train", ds, np.arange(len(ds)), 200, 8, 3, cache_prefix=os.path.join(cache, "d")
    )
    dist.barrier()  # the group still works once both ranks are past the index
    return gpt.index_built, gpt.shuffle_idx.tobytes()


def test_index_build_longer_than_the_collective_timeout(tmp_path):
    from tests.unit.data.conftest import random_documents, write_dataset

    write_dataset(tmp_path / "d", random_documents(40, seed=9))
    results = run_distributed(_slow_build, 2, free_port(), str(tmp_path / "d"), str(tmp_path))
    assert [built for built, _ in results] == [True, False]
    assert results[0][1] == results[1][1]


def test_a_waiting_rank_gives_up_after_its_own_limit(tmp_path):
    from megatron.data.index_mapping import KINDS, wait_for_index

    paths = {kind: Path(tmp_path / f"never_{kind}.npy") for kind in KINDS}
    with pytest.raises(TimeoutError, match="use_shared_fs: false"):
        wait_for_index(paths, limit_s=0.2)
