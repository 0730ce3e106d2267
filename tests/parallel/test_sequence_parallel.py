"""Sequence parallelism at tp=2 and tp=4 equals the plain tensor-parallel and unsharded results.

One spawn of 4 gloo ranks. A pre-norm MLP block `LayerNorm -> column -> gelu -> row` runs with
activations sharded along the sequence, `(s/tp, b, h)`, between blocks; output and full
gradients (norm and row-bias grads summed over tp by `allreduce_sequence_parallel_grads` or by
the backward hooks) must equal the non-SP tensor-parallel block and the single-process twin
within 1e-6 relative.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from megatron.parallel import (
    ColumnParallelLinear,
    ParallelTopology,
    RowParallelLinear,
    allreduce_sequence_parallel_grads,
    gather_from_sequence_parallel_region,
    gather_full_parameter,
    mark_sequence_parallel,
    reduce_scatter_to_sequence_parallel_region,
    register_sequence_parallel_grad_hooks,
    scatter_to_sequence_parallel_region,
)
from tests.distributed import run_distributed

TOL = 1e-6
SEQ, BATCH, HIDDEN = 8, 2, 6


def assert_close(actual, expected, what):
    assert actual.shape == expected.shape, f"{what}: shape {actual.shape} != {expected.shape}"
    err = (actual - expected).abs().max().item()
    scale = max(expected.abs().max().item(), 1e-30)
    assert err <= TOL * scale, f"{what}: max error {err:.3e} vs max value {scale:.3e}"


def seq_chunk(x, topo):
    return x.chunk(topo.tp_size, dim=0)[topo.tp_rank]


def check_sp_mappings(topo):
    g, tp = topo.tp_group, topo.tp_size
    x = torch.randn(SEQ, BATCH, HIDDEN, requires_grad=True)
    up = torch.randn(SEQ, BATCH, HIDDEN)
    # scatter: keep my sequence chunk; backward all-gathers the chunks' grads.
    y = scatter_to_sequence_parallel_region(x, g)
    assert torch.equal(y, seq_chunk(x, topo))
    (y * seq_chunk(up, topo)).sum().backward()
    assert_close(x.grad, up, "scatter_to_sequence backward")
    # reduce-scatter: sum of ranks' tensors, my chunk; backward all-gathers.
    x.grad = None
    y = reduce_scatter_to_sequence_parallel_region(x * (topo.tp_rank + 1), g)
    assert_close(y, seq_chunk(x.detach(), topo) * sum(range(1, tp + 1)), "reduce_scatter fwd")
    (y * seq_chunk(up, topo)).sum().backward()
    assert_close(x.grad, up * (topo.tp_rank + 1), "reduce_scatter backward")
    # gather: the inverse of scatter; backward reduce-scatters (or splits).
    for tp_output_grad in (True, False):
        part = seq_chunk(x.detach(), topo).clone().requires_grad_()
        full = gather_from_sequence_parallel_region(part, g, tp_output_grad)
        assert torch.equal(full, x.detach())
        (full * up * (topo.tp_rank + 1)).sum().backward()
        factor = sum(range(1, tp + 1)) if tp_output_grad else topo.tp_rank + 1
        assert_close(part.grad, seq_chunk(up, topo) * factor, f"gather backward {tp_output_grad}")


class Block(torch.nn.Module):
    """Pre-norm MLP block; under SP its input and output are (s/tp, b, h) sequence shards."""

    def __init__(self, topo, sequence_parallel):
        super().__init__()
        g = topo.tp_group
        self.norm = torch.nn.LayerNorm(HIDDEN)
        self.fc1 = ColumnParallelLinear(
            HIDDEN, 4 * topo.tp_size, tp_group=g, sequence_parallel=sequence_parallel
        )
        self.fc2 = RowParallelLinear(
            4 * topo.tp_size, HIDDEN, tp_group=g, sequence_parallel=sequence_parallel
        )
        if sequence_parallel:
            for p in self.norm.parameters():
                mark_sequence_parallel(p)

    def forward(self, x):
        return x + self.fc2(F.gelu(self.fc1(self.norm(x))))


def twin_of(block, topo):
    """The unsharded block with the same (gathered) weights."""
    g, tp = topo.tp_group, topo.tp_size
    twin = torch.nn.ModuleDict({
        "norm": torch.nn.LayerNorm(HIDDEN),
        "fc1": torch.nn.Linear(HIDDEN, 4 * tp),
        "fc2": torch.nn.Linear(4 * tp, HIDDEN),
    })  # fmt: skip
    with torch.no_grad():
        for name, p in twin.named_parameters():
            p.copy_(gather_full_parameter(block.get_parameter(name), g))
    return twin


def run_block(topo, block, x, up, sequence_parallel, sync):
    x = x.clone().requires_grad_()
    h = scatter_to_sequence_parallel_region(x, topo.tp_group) if sequence_parallel else x
    out = block(h)
    if sequence_parallel:  # only for comparing: every rank computes the same full loss
        out = gather_from_sequence_parallel_region(out, topo.tp_group, False)
    (out * up).sum().backward()
    sync(block)
    grads = {
        n: gather_full_parameter(p, topo.tp_group, grad=True) for n, p in block.named_parameters()
    }
    return out.detach(), x.grad, grads


def check_block(topo):
    g = topo.tp_group
    torch.manual_seed(21)
    block = Block(topo, sequence_parallel=True)
    torch.manual_seed(21)
    plain = Block(topo, sequence_parallel=False)  # same weights, no SP
    with torch.no_grad():
        for p in list(block.norm.parameters()) + [block.fc1.bias, block.fc2.bias]:
            p.normal_()  # non-trivial norm affine and biases
        plain.load_state_dict(block.state_dict())
    assert block.fc2.bias.sequence_parallel and not hasattr(plain.fc2.bias, "sequence_parallel")
    twin = twin_of(block, topo)
    x = torch.randn(SEQ, BATCH, HIDDEN)
    up = torch.randn(SEQ, BATCH, HIDDEN)

    ref_x = x.clone().requires_grad_()
    ref = ref_x + twin.fc2(F.gelu(twin.fc1(twin.norm(ref_x))))
    (ref * up).sum().backward()
    ref_grads = {n: p.grad for n, p in twin.named_parameters()}

    sync_after = lambda m: allreduce_sequence_parallel_grads(m, g)
    no_sync = lambda m: None
    out_plain, dx_plain, grads_plain = run_block(topo, plain, x, up, False, no_sync)
    out_sp, dx_sp, grads_sp = run_block(topo, block, x, up, True, sync_after)
    block.zero_grad(set_to_none=True)
    handles = register_sequence_parallel_grad_hooks(block, g)
    assert len(handles) == 3  # norm weight and bias, row-parallel bias
    _, _, grads_hooked = run_block(topo, block, x, up, True, no_sync)
    for h in handles:
        h.remove()

    for name, (out, dx, grads) in {
        "tensor parallel": (out_plain, dx_plain, grads_plain),
        "sequence parallel": (out_sp, dx_sp, grads_sp),
    }.items():
        assert_close(out, ref.detach(), f"{name} output")
        assert_close(out, out_plain, f"{name} output vs non-SP")
        assert_close(dx, ref_x.grad, f"{name} input grad")
        for n, grad in grads.items():
            assert_close(grad, ref_grads[n], f"{name} grad {n}")
    for n, grad in grads_hooked.items():
        assert_close(grad, ref_grads[n], f"hooked sequence-parallel grad {n}")


def _worker(rank, world_size):
    for tp in (2, 4):
        topo = ParallelTopology(tp_size=tp)
        torch.manual_seed(99)
        check_sp_mappings(topo)
        check_block(topo)
    return True


def test_sequence_parallel_equals_tensor_parallel_and_unsharded_at_tp2_and_tp4():
    assert run_distributed(_worker, 4) == [True] * 4
