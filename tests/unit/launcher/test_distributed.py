"""init_distributed: backend choice and errors (the real gloo init runs in tests/e2e)."""

import os

import pytest
import torch

from megatron.launcher import WorkerEnvironmentError
from megatron.launcher.distributed import choose_backend
from tests.distributed import free_port, run_distributed


def test_choose_backend():
    assert choose_backend(None, cuda_available=True) == "nccl"
    assert choose_backend(None, cuda_available=False) == "gloo"
    assert choose_backend("NCCL", cuda_available=True) == "nccl"
    assert choose_backend("gloo", cuda_available=True) == "gloo"


def test_nccl_without_cuda_falls_back_to_gloo_saying_so_only_with_verbose(caplog):
    import logging

    with caplog.at_level(logging.WARNING):  # a worker's level without --verbose
        assert choose_backend("nccl", cuda_available=False) == "gloo"
    assert caplog.text == ""  # GPT-NeoX's default: not worth a warning on every run
    with caplog.at_level(logging.INFO):  # --verbose
        assert choose_backend("nccl", cuda_available=False) == "gloo"
    assert "nccl needs CUDA" in caplog.text


def test_unknown_backend_names_the_key():
    with pytest.raises(WorkerEnvironmentError, match="distributed_backend: 'tcp'.*valid: nccl"):
        choose_backend("tcp", cuda_available=False)


def test_init_distributed_without_environment_says_what_to_call(monkeypatch):
    import torch.distributed as dist

    if dist.is_initialized():
        pytest.skip("a process group already exists in this process")
    if not torch.cuda.is_available():
        monkeypatch.setenv("DS_ACCELERATOR", "cpu")  # init_distributed would set it for good
    for name in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(name, raising=False)
    from megatron.launcher import init_distributed

    with pytest.raises(WorkerEnvironmentError, match="setup_distributed_env"):
        init_distributed()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_init_distributed_uses_nccl_and_pins_the_device():
    results = run_distributed(_nccl_init, 1, free_port())
    assert results == [("nccl", 0, 1.0)]


def _nccl_init(rank, world_size, port):
    import torch.distributed as dist

    from megatron.launcher import init_distributed, setup_distributed_env

    dist.destroy_process_group()
    os.environ["MASTER_PORT"] = str(port)
    setup_distributed_env({})
    backend = init_distributed()
    value = torch.ones(1, device="cuda")
    dist.all_reduce(value)
    return backend, torch.cuda.current_device(), value.item()
