"""Token choice: greedy, top-k, top-p filtering, temperature sampling, setting checks."""

from __future__ import annotations

import math

import pytest
import torch

from megatron.inference import SamplingSettings, filter_logits, sample


def test_greedy_takes_the_first_maximum():
    logits = torch.tensor([[0.1, 2.0, 2.0, -1.0], [3.0, 0.0, 1.0, 2.9]])
    assert sample(logits, SamplingSettings()).tolist() == [1, 0]


def test_top_k_keeps_the_k_largest():
    logits = torch.tensor([[1.0, 4.0, 3.0, 2.0]])
    kept = filter_logits(logits, top_k=2)
    assert torch.isfinite(kept).tolist() == [[False, True, True, False]]


def test_top_p_keeps_the_smallest_set_reaching_p():
    logits = torch.tensor([[0.5, 0.3, 0.15, 0.05]]).log()

    def kept(p):
        return torch.isfinite(filter_logits(logits, top_p=p))[0].tolist()

    assert kept(0.7) == [True, True, False, False]
    assert kept(0.5) == [True, False, False, False]
    assert kept(0.81) == [True, True, True, False]
    assert kept(0.01) == [True, False, False, False]  # the most likely token always stays


def test_sampling_follows_the_tempered_distribution_and_the_generator():
    logits = torch.tensor([[0.0, math.log(3.0)]]).expand(4000, 2)
    settings = SamplingSettings(temperature=1.0)
    draws = sample(logits, settings, torch.Generator().manual_seed(0))
    assert 0.72 < draws.float().mean().item() < 0.78  # P(token 1) = 3/4
    again = sample(logits, settings, torch.Generator().manual_seed(0))
    assert torch.equal(draws, again)
    hot = sample(logits, SamplingSettings(temperature=100.0), torch.Generator().manual_seed(0))
    assert 0.45 < hot.float().mean().item() < 0.55  # a high temperature flattens it
    only_top = sample(logits, SamplingSettings(temperature=1.0, top_k=1))
    assert only_top.eq(1).all()


@pytest.mark.parametrize(
    "bad", [dict(temperature=-1.0), dict(top_k=-2), dict(top_p=1.5), dict(maximum_tokens=0)]
)
def test_invalid_settings_name_the_key(bad):
    key = next(iter(bad))
    with pytest.raises(ValueError, match=key):
        SamplingSettings(**bad)
