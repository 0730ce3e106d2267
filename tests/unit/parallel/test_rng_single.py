"""Model-parallel RNG in one process: seed scheme, fork, and DeepSpeed checkpoint replay."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from deepspeed.runtime.activation_checkpointing import checkpointing

from megatron.parallel import (
    MODEL_PARALLEL_RNG,
    ParallelTopology,
    get_rng_tracker,
    model_parallel_seed,
    tensor_parallel_rng,
)
from megatron.parallel.random import rng_seeds


def test_seeds_are_shared_by_tp_peers_only_and_all_distinct():
    for tp, pp, world in [(2, 2, 8), (1, 1, 4), (4, 1, 8), (1, 2, 4)]:
        topos = [ParallelTopology(tp, pp, world, rank=r) for r in range(world)]
        seeds = [rng_seeds(7, t) for t in topos]
        for t, s in zip(topos, seeds):
            peers = [seeds[r] for r in t.tp_ranks]
            assert all(p.default == s.default for p in peers)
        defaults = {s.default for s in seeds}
        tp_seeds = [s.tensor_parallel for s in seeds]
        assert len(defaults) == world // tp  # one per (dp, pp) replica slot
        assert len(set(tp_seeds)) == world and not defaults & set(tp_seeds)


def _needs(device):
    """Skip unless DeepSpeed's accelerator is `device`: the tracker forks only its generator."""
    if device == "cuda" and not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    from deepspeed.accelerator import get_accelerator

    accelerator = get_accelerator().device_name()
    if accelerator != device:
        pytest.skip(f"DeepSpeed's accelerator is {accelerator!r}, not {device!r}")
    return device


DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)]


@pytest.mark.parametrize("device", DEVICES)
def test_rank0_default_stream_is_plain_manual_seed_and_fork_restores_it(device):
    device = _needs(device)
    seeds = model_parallel_seed(5, ParallelTopology())
    assert seeds.default == 5 and seeds.tensor_parallel == 5 + 2718
    a = torch.rand(4, device=device)
    with tensor_parallel_rng():
        b = torch.rand(4, device=device)
    c = torch.rand(4, device=device)
    torch.manual_seed(5)
    assert torch.equal(a, torch.rand(4, device=device))
    assert torch.equal(c, torch.rand(4, device=device))
    torch.manual_seed(5 + 2718)
    assert torch.equal(b, torch.rand(4, device=device))
    assert get_rng_tracker() is checkpointing.get_cuda_rng_tracker()
    assert MODEL_PARALLEL_RNG in get_rng_tracker().get_states()
    # DeepSpeed's default fork() name, so model code may call fork() without a name.
    assert MODEL_PARALLEL_RNG == checkpointing._MODEL_PARALLEL_RNG_TRACKER_NAME


def test_bad_seed():
    with pytest.raises(ValueError, match="seed must be a non-negative integer"):
        model_parallel_seed(-1, ParallelTopology())


@pytest.mark.parametrize("device", DEVICES)
def test_deepspeed_checkpoint_replays_both_dropout_streams(device):
    device = _needs(device)
    torch.manual_seed(0)
    lin = torch.nn.Linear(6, 6).to(device)

    def block(x):
        with tensor_parallel_rng():
            x = F.dropout(lin(x), p=0.5, training=True)
        return F.dropout(x, p=0.5, training=True)

    def run(checkpointed):
        lin.zero_grad(set_to_none=True)
        model_parallel_seed(11, ParallelTopology())
        x = torch.randn(5, 6, device=device, requires_grad=True)
        out = checkpointing.checkpoint(block, x) if checkpointed else block(x)
        out.square().sum().backward()
        return out.detach(), x.grad, lin.weight.grad

    plain, ckpt = run(False), run(True)
    assert (plain[0] == 0).any()  # dropout really drew masks
    for a, b in zip(plain, ckpt):
        assert torch.equal(a, b)
