"""Scoring on the device: lm-eval's loglikelihoods and the precomputed reference log-probs take
the target tokens' log-probs (and the greedy check) from the logits where they are, without a
`(b, s, V)` log-softmax: no copy of it to the host, no buffer of the logits' size, one host
read per batch. The values equal torch's fp64 log-softmax of the plain model's logits over the
real vocabulary (500 of 512 rows)."""

from __future__ import annotations

import types

import numpy as np
import pytest
import torch

pytest.importorskip("lm_eval", reason="the eval extra (requirements-eval.txt) is not installed")

from megatron.evaluation.adapter import MegatronLM  # noqa: E402 - needs lm_eval
from megatron.inference import InferenceModel  # noqa: E402
from megatron.inference.precompute import score_rows  # noqa: E402
from megatron.model import build_gpt  # noqa: E402
from megatron.parallel import ParallelTopology, cross_entropy  # noqa: E402
from tests.device_costs import HostReads  # noqa: E402
from tests.unit.model.tiny import neox_args  # noqa: E402
from tests.unit.parallel.test_cross_entropy_single import NewLargeTensors  # noqa: E402

VOCAB, PADDED = 500, 512


@pytest.fixture(scope="module")
def module():
    torch.manual_seed(0)
    model = build_gpt(neox_args(vocab_size=PADDED, seq_length=32)).eval()
    with torch.no_grad():  # larger weights than the init: logits far from uniform
        for p in model.parameters():
            p.mul_(3.0)
    return model


@pytest.fixture
def host_copies(monkeypatch):
    """The sizes of the tensors copied to the host with `.cpu()` (a device-to-host transfer and
    a wait on a GPU; on a CPU nothing else shows it)."""
    sizes, original = [], torch.Tensor.cpu

    def cpu(self, *args, **kwargs):
        sizes.append(self.numel())
        return original(self, *args, **kwargs)

    monkeypatch.setattr(torch.Tensor, "cpu", cpu)
    return sizes


def reference_logprobs(module, tokens: list[int]) -> torch.Tensor:
    """fp64 log-softmax over the real vocabulary of the plain model: `(len - 1, VOCAB)`."""
    x = torch.tensor([tokens[:-1]])
    with torch.no_grad():
        logits = module(x, torch.arange(x.shape[1])[None])[0, :, :VOCAB]
    return logits.double().log_softmax(-1)


def test_loglikelihoods_read_two_values_per_request_once_per_batch(module, host_copies):
    topology = ParallelTopology(1, 1, world_size=1)
    model = InferenceModel(module, module.args, topology, torch.device("cpu"), torch.float32, VOCAB)
    lm = MegatronLM(model, types.SimpleNamespace(eod=0), batch_size=3)
    pairs = [([5, 6, 7], [8, 9]), ([11], [12, 13, 14]), ([20, 21, 22, 23, 24], [25])]
    with HostReads() as reads:
        scored = lm._score_batch(pairs)
    assert reads.count == 1, reads.report()
    assert max(host_copies, default=0) <= 2 * len(pairs), host_copies  # was (b, s, V)
    for (context, continuation), (logprob, greedy) in zip(pairs, scored):
        picked = reference_logprobs(module, context + continuation)[-len(continuation) :]
        target = torch.tensor(continuation)
        assert logprob == pytest.approx(picked.gather(-1, target[:, None]).sum().item(), abs=1e-4)
        assert greedy == bool((picked.argmax(-1) == target).all())


class LastStage:
    """The last stage of a one-stage model: fixed logits, the broadcast a no-op."""

    def __init__(self, logits):
        self.logits = logits

    def forward(self, tokens, positions):
        return self.logits

    def broadcast_from_last_stage(self, tensor, shape, dtype):
        return tensor.to(dtype)


def test_reference_logprobs_need_no_logits_sized_buffer(module, monkeypatch):
    rows = [np.array(r) for r in ([5, 17, 230, 41, 99] * 6, [61, 7, 7, 12, 300, 2])]
    width = max(len(r) for r in rows)
    tokens = torch.zeros((len(rows), width), dtype=torch.long)
    for i, r in enumerate(rows):
        tokens[i, : len(r)] = torch.as_tensor(r)
    with torch.no_grad():
        padded = module(tokens, torch.arange(width).expand_as(tokens))
    logits = padded[..., :VOCAB]  # as InferenceModel returns them: the real rows, a view
    monkeypatch.setitem(cross_entropy.CHUNK_BYTES, "cpu", 8 * VOCAB * 4)  # 8 of 60 rows
    with NewLargeTensors(logits.numel() // 4) as counted, HostReads() as reads:
        scored = score_rows(LastStage(logits), rows, pad=0)
    assert counted.ops == [], counted.ops  # was the (b, s, V) fp32 log-softmax
    assert reads.count == 1, reads.report()
    for row, values in zip(rows, scored):
        logp = reference_logprobs(module, row.tolist())
        expected = logp.gather(-1, torch.as_tensor(row[1:])[:, None]).squeeze(-1).numpy()
        np.testing.assert_allclose(values, expected, rtol=1e-5, atol=1e-5)
