"""`log_grad_norm` and `log_param_norm` read nothing during the step, one transfer per log.

The per-parameter norms stay on the device: a backward pass with the gradient recorder on
makes no host read (it used to read one norm per parameter per micro-batch, on rank 0 only, so
every other rank waited), and the log step reads all of them at once. The values are the
Frobenius norms of the accumulated gradients and of the parameters, checked against
`torch.linalg.vector_norm` of copies taken here.
"""

from __future__ import annotations

import torch

from megatron.training.metrics.norms import GradNormRecorder, parameter_norms
from tests.device_costs import HostReads

MICRO_BATCHES = 3


def _model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.GELU(), torch.nn.Linear(5, 2))


def test_the_backward_reads_nothing_and_the_log_reads_once():
    model = _model()
    recorder = GradNormRecorder(model)
    with HostReads() as backward:
        for i in range(MICRO_BATCHES):  # gradient accumulation over micro-batches
            model(torch.randn(4, 6, generator=torch.Generator().manual_seed(i))).sum().backward()
    assert backward.count == 0, backward.report()
    expected = {
        f"grad_norm/{name}": torch.linalg.vector_norm(p.grad.clone()).item()
        for name, p in model.named_parameters()
    }
    with HostReads() as log:
        norms = recorder.collect()
    assert log.count == 1, log.report()
    assert norms.keys() == expected.keys()
    for name, value in expected.items():
        assert norms[name] == value, name  # the same float32 norm, read back exactly
    assert recorder.collect() == {}  # only what was seen since the last call
    recorder.remove()


def test_parameter_norms_are_read_in_one_transfer():
    model = _model()
    with HostReads() as reads:
        norms = parameter_norms(model)
    assert reads.count == 1, reads.report()
    assert norms == {
        f"param_norm/{name}": torch.linalg.vector_norm(p.detach().clone()).item()
        for name, p in model.named_parameters()
    }
