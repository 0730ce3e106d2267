"""1-bit Adam pieces: sign packing, norm-preserving compression, the two stages."""

from __future__ import annotations

import pytest
import torch

from megatron.training.optim.onebit_adam import (
    OneBitAdam,
    compress,
    compressed_mean,
    pack_signs,
    unpack_signs,
)


@pytest.mark.parametrize("n", [1, 8, 13])
def test_sign_packing_round_trips(n):
    x = torch.randn(n, generator=torch.Generator().manual_seed(n))
    x[0] = 0.0  # zero counts as +
    packed = pack_signs(x)
    assert packed.dtype == torch.uint8 and packed.numel() == (n + 7) // 8
    expected = torch.where(x >= 0, 1.0, -1.0)
    assert torch.equal(unpack_signs(packed, n, torch.float32), expected)


def test_compress_keeps_the_norm_and_the_error_feeds_back():
    x = torch.tensor([3.0, -1.0, 0.0, 2.0])
    c = compress(x)
    assert c.norm().item() == pytest.approx(x.norm().item())
    assert torch.equal(c.sign(), torch.tensor([1.0, -1.0, 1.0, 1.0]))
    worker, server = torch.zeros(4), torch.zeros(4)
    out = compressed_mean(x, worker, server)  # one process: the mean is x itself
    assert torch.allclose(out + server + worker, x)


class _Engine:
    enable_backward_allreduce = True


def test_second_moment_freezes_after_warmup_and_engine_is_told():
    p = torch.nn.Parameter(torch.tensor([1.0, -1.0]))
    opt = OneBitAdam([p], lr=0.1, freeze_step=2)
    engine = _Engine()
    opt.attach_engine(engine)
    for step in range(4):
        p.grad = torch.tensor([0.5, 0.25]) * (step + 1)
        opt.step()
        if step == 1:
            v_frozen = opt.state[p]["exp_avg_sq"].clone()
            assert engine.enable_backward_allreduce is False
        if step == 0:
            assert engine.enable_backward_allreduce is True
    assert torch.equal(opt.state[p]["exp_avg_sq"], v_frozen)
    # resume: the step count travels with the state and sets the engine flag
    fresh = OneBitAdam([torch.nn.Parameter(torch.zeros(2))], lr=0.1, freeze_step=2)
    other = _Engine()
    fresh.attach_engine(other)
    fresh.load_state_dict(opt.state_dict())
    assert fresh.steps == 4 and other.enable_backward_allreduce is False


def test_steps_follow_deepspeeds_definition():
    """Warm-up: Adam without bias correction, weight decay added to the update; afterwards
    the same update with the frozen second moment and the (compressed) momentum."""
    p = torch.nn.Parameter(torch.tensor([1.0, -2.0, 0.5]))
    lr, (b1, b2), eps, wd = 0.01, (0.9, 0.999), 1e-8, 0.1
    opt = OneBitAdam([p], lr=lr, betas=(b1, b2), eps=eps, weight_decay=wd, freeze_step=2)
    expected, m, v = p.detach().clone(), torch.zeros(3), torch.zeros(3)
    for step in range(4):
        g = torch.tensor([0.3, -0.1, 0.2]) * (step + 1)
        p.grad = g.clone()
        opt.step()
        if step < 2:
            m, v = b1 * m + (1 - b1) * g, b2 * v + (1 - b2) * g * g
        else:  # the momentum the optimizer kept is the compressed one: sign × rms
            m = opt.state[p]["exp_avg"]
            assert torch.allclose(m.abs(), m.norm() / 3**0.5)
        expected -= lr * (m / (v.sqrt() + eps) + wd * expected)
        assert torch.allclose(p.detach(), expected, rtol=1e-6, atol=0), step
    assert torch.allclose(opt.state[p]["exp_avg_sq"], v, rtol=1e-6, atol=0)
