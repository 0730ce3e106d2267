"""One rule for "my GPU", that of DeepSpeed (`cuda:LOCAL_RANK`), which our device agrees with.

CUDA's device count is faked; `deepspeed.init_distributed` is replaced by a recorder of the
LOCAL_RANK it would read (its process group, engine, `PipelineModule` and ZeRO-3 all place on
`cuda:LOCAL_RANK`), so the device we set can be held against the one DeepSpeed would use.
"""

from __future__ import annotations

import os

import deepspeed
import pytest
import torch
import torch.distributed as dist

from megatron.config.placement import NODE_LOCAL_RANK, node_local_rank
from megatron.launcher import WorkerEnvironmentError, init_distributed
from megatron.launcher.distributed import device_index, refuse_node_local_storage


def test_device_is_the_local_rank_when_visible_else_the_only_one():
    assert device_index(3, device_count=8) == 3
    assert device_index(3, device_count=1) == 0  # SLURM --gpus-per-task=1
    assert device_index(0, device_count=1) == 0


def test_some_but_not_all_gpus_visible_is_refused():
    with pytest.raises(WorkerEnvironmentError, match="LOCAL_RANK=3.*sees 2 GPUs"):
        device_index(3, device_count=2)


@pytest.fixture
def gpus(monkeypatch):
    """Fake `count` visible GPUs; returns the devices set and the LOCAL_RANK DeepSpeed read."""
    if dist.is_initialized():
        pytest.skip("a process group already exists in this process")
    seen = {"set_device": [], "deepspeed_local_rank": []}

    def install(count: int, local_rank: int):
        env = dict(RANK="0", LOCAL_RANK=str(local_rank), WORLD_SIZE="1")
        for name, value in {**env, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "1"}.items():
            monkeypatch.setenv(name, value)
        monkeypatch.setenv(NODE_LOCAL_RANK, "unset")  # so that teardown removes ours
        monkeypatch.delenv(NODE_LOCAL_RANK)
        monkeypatch.delenv("OMPI_COMM_WORLD_LOCAL_RANK", raising=False)
        monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
        monkeypatch.setattr(torch.cuda, "device_count", lambda: count)
        monkeypatch.setattr(torch.cuda, "set_device", seen["set_device"].append)

        def ds_init(**kwargs):
            seen["deepspeed_local_rank"].append(int(os.environ["LOCAL_RANK"]))

        monkeypatch.setattr(deepspeed, "init_distributed", ds_init)
        return seen

    return install


def test_one_visible_gpu_deepspeed_and_we_use_the_same_device(gpus):
    seen = gpus(count=1, local_rank=3)
    assert init_distributed("nccl") == "nccl"
    assert seen["set_device"] == [0]
    assert seen["deepspeed_local_rank"] == [0]  # DeepSpeed's cuda:LOCAL_RANK is ours
    assert node_local_rank() == 3  # the launcher's value, for per-node work


def test_all_gpus_visible_the_device_is_the_local_rank(gpus):
    seen = gpus(count=8, local_rank=3)
    init_distributed("nccl")
    assert seen["set_device"] == [3] and seen["deepspeed_local_rank"] == [3]
    assert node_local_rank() == 3


def test_openmpi_with_one_visible_gpu_is_refused(gpus, monkeypatch):
    gpus(count=1, local_rank=3)
    monkeypatch.setenv("OMPI_COMM_WORLD_LOCAL_RANK", "3")
    with pytest.raises(WorkerEnvironmentError, match="OMPI_COMM_WORLD_LOCAL_RANK=3"):
        init_distributed("nccl")


def test_node_local_storage_with_one_gpu_per_process_is_refused(gpus):
    gpus(count=1, local_rank=3)
    init_distributed("nccl")
    config = {"checkpoint": {"use_node_local_storage": True}}
    with pytest.raises(WorkerEnvironmentError, match="use_node_local_storage"):
        refuse_node_local_storage(config)
    refuse_node_local_storage({})


def test_node_local_storage_with_every_gpu_visible_is_left_alone(gpus):
    gpus(count=8, local_rank=3)
    init_distributed("nccl")
    refuse_node_local_storage({"checkpoint": {"use_node_local_storage": True}})
