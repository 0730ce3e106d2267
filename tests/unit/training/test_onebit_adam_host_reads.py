"""1-bit Adam's compressed mean over ranks reads no scale back to the host.

Two ranks are simulated in one process (the gather returns this rank's signs and scale and
another's); the mean must be the formula `(sign(x0) s0 + sign(x1) s1) / 2` compressed once
more, with no `.item()` per parameter per step.
"""

from __future__ import annotations

import torch

from megatron.training.optim import onebit_adam
from tests.device_costs import HostReads

N = 13


def test_compressed_mean_of_two_ranks_reads_nothing(monkeypatch):
    gen = torch.Generator().manual_seed(0)
    mine, other = torch.randn(N, generator=gen), torch.randn(N, generator=gen)
    other_scale = (other.norm() / N**0.5).reshape(1)
    gathered = {torch.uint8: onebit_adam.pack_signs(other), torch.float32: other_scale}
    monkeypatch.setattr(onebit_adam, "group_size", lambda group: 2)
    monkeypatch.setattr(onebit_adam, "all_gather_list", lambda x, g: [x, gathered[x.dtype]])
    worker, server = torch.zeros(N), torch.zeros(N)
    with HostReads() as reads:
        out = onebit_adam.compressed_mean(mine, worker, server)
    assert reads.count == 0, reads.report()

    def signs_times_rms(x):
        return torch.where(x >= 0, 1.0, -1.0) * x.norm() / N**0.5

    mean = (signs_times_rms(mine) + signs_times_rms(other)) / 2
    torch.testing.assert_close(out, signs_times_rms(mean))
    torch.testing.assert_close(server, mean - signs_times_rms(mean))
    torch.testing.assert_close(worker, mine - signs_times_rms(mine))
