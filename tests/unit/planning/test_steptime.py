"""The step-time estimate's arithmetic, against formulas written out here.

- Ring collectives (Patarasuk & Yuan 2009): an all-reduce of N bytes over p ranks sends
  2(p-1)/p N per rank, a reduce-scatter (p-1)/p N, an all-gather (p-1) times its shard.
- The 1F1B pipeline idles (p-1)/(m+p-1) of the time for p stages and m micro-batches (the
  bubble of Huang et al. 2019, GPipe, which 1F1B keeps).
- Activation checkpointing makes the hardware run the layers' forward once more: torch's FLOP
  counter over one forward of the real model, without the output head (2·b·s·h·V).
"""

from __future__ import annotations

import pytest
import torch

from megatron.model import build_model
from megatron.planning.steptime import (
    CommTerm,
    Links,
    communication,
    estimate,
    ring_bytes,
    step_flops,
)
from megatron.training.objectives import build_objective
from tests.flop_counter import flop_counter
from tests.tiny import tiny_config


def test_ring_volumes():
    n, p = 1200.0, 4
    assert ring_bytes("all_reduce", n, p) == 2 * (p - 1) / p * n
    assert ring_bytes("reduce_scatter", n, p) == (p - 1) / p * n
    assert ring_bytes("all_gather", n, p) == (p - 1) * n
    assert ring_bytes("all_reduce", n, 1) == 0


def test_the_pipeline_bubble_and_the_sum():
    comm = [CommTerm("x", 2e9, "network", 25.0)]
    step = estimate(flops=8e15, tokens=1000, world=8, peak_tflops=1000.0, mfu=0.5, pp=4,
                    micro_batches=12, comm=comm)  # fmt: skip
    busy = 8e15 / (8 * 1000e12 * 0.5)
    assert step.bubble == pytest.approx(3 / (12 + 4 - 1))
    assert step.compute_s == pytest.approx(busy / (1 - 3 / 15))
    assert step.seconds == pytest.approx(step.compute_s + 2e9 / 25e9)
    assert step.dominant == "compute"


def test_links_and_the_data_parallel_exchange():
    links = Links(nvlink=300.0, network=25.0, gpus_per_node=8)
    terms = communication(tp=2, dp=8, pp=2, ep=1, micro_batches=4,
                          traffic={"tensor_all_reduce": 1000}, boundary_bytes=500,
                          dp_bytes=4000, wrapper="BF16_Optimizer", links=links)  # fmt: skip
    by_name = {t.name: t for t in terms}
    tp = by_name["tensor-parallel all-reduce"]
    assert (tp.link, tp.bytes) == ("NVLink", 4 * 2 * (2 - 1) / 2 * 1000)  # within a node
    pp = by_name["pipeline send/recv"]
    assert (pp.link, pp.bytes) == ("network", 2 * 500 * 4)  # forward and backward, 32 ranks
    dp = by_name["data-parallel gradients and weights"]
    assert (dp.link, dp.bytes) == ("network", 2 * 7 / 8 * 4000)  # dp spans 16 > 8 GPUs


def test_checkpointing_adds_the_layers_forward():
    cfg = tiny_config(pipe_parallel_size=0)
    ckpt = tiny_config(pipe_parallel_size=0, checkpoint_activations=True)
    objective = build_objective(cfg)
    plain, tokens = step_flops(cfg, objective)
    recomputed, _ = step_flops(ckpt, objective)
    model = build_model(cfg.replace(loss_chunk_tokens=0)).eval()  # the forward with its head
    b, s = cfg.training.train_micro_batch_size_per_gpu, cfg.model.seq_length
    ids = torch.randint(0, 100, (b, s))
    with flop_counter() as counter, torch.no_grad():
        model(ids, torch.arange(s).expand(b, s))
    head = 2 * b * s * cfg.model.hidden_size * cfg.model.padded_vocab_size
    per_token = (counter.get_total_flops() - head) / (b * s)
    assert (recomputed - plain) / tokens == pytest.approx(per_token, rel=1e-6)
