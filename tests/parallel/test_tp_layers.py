"""Tensor-parallel layers and mappings at tp=2 and tp=4 against their unsharded twins.

One spawn of 4 gloo ranks checks both sizes (tp=2 is run with dp=2 beside it, so groups that
are not the whole world are exercised). Every rank builds the sharded layer and, from the same
seed, the plain `nn.Linear`/`nn.Embedding` twin; forward outputs and full (gathered) gradients
must agree within 1e-6 relative (max-abs error / max-abs value) in fp32.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F

from megatron.parallel import (
    ColumnParallelLinear,
    ParallelTopology,
    RowParallelLinear,
    VocabParallelEmbedding,
    copy_to_tensor_parallel_region,
    gather_from_tensor_parallel_region,
    gather_full_parameter,
    reduce_from_tensor_parallel_region,
    scatter_to_tensor_parallel_region,
)
from megatron.parallel.layers import linear_default_init
from tests.distributed import run_distributed

TOL = 1e-6


def assert_close(actual, expected, what):
    err = (actual - expected).abs().max().item()
    scale = max(expected.abs().max().item(), 1e-30)
    assert actual.shape == expected.shape, f"{what}: shape {actual.shape} != {expected.shape}"
    assert err <= TOL * scale, f"{what}: max error {err:.3e} vs max value {scale:.3e}"


def chunk(x, dim, topo):
    return x.chunk(topo.tp_size, dim=dim)[topo.tp_rank]


def check_mappings(topo):
    g, tp = topo.tp_group, topo.tp_size
    x = torch.randn(3, 4 * tp, requires_grad=True)
    up = torch.randn(3, 4 * tp)  # same on every rank (common seed)
    # copy: identity forward; backward sums the (rank-dependent) upstream grads.
    y = copy_to_tensor_parallel_region(x, g)
    assert torch.equal(y, x)
    (y * up * (topo.tp_rank + 1)).sum().backward()
    assert_close(x.grad, up * sum(range(1, tp + 1)), "copy_to backward")
    # reduce: all-reduce forward, identity backward.
    x.grad = None
    y = reduce_from_tensor_parallel_region(x * (topo.tp_rank + 1), g)
    assert_close(y, x.detach() * sum(range(1, tp + 1)), "reduce_from forward")
    (y * up).sum().backward()
    assert_close(x.grad, up * (topo.tp_rank + 1), "reduce_from backward")
    # scatter/gather on the last dim are each other's adjoint.
    x.grad = None
    y = scatter_to_tensor_parallel_region(x, g)
    assert torch.equal(y, chunk(x, -1, topo))
    (y * chunk(up, -1, topo)).sum().backward()
    assert_close(x.grad, up, "scatter_to backward (gathered)")
    z = torch.randn(3, 4, requires_grad=True)
    full = gather_from_tensor_parallel_region(z * 1.0, g)
    parts = [torch.empty_like(z) for _ in range(tp)]
    dist.all_gather(parts, z.detach(), group=g)
    assert torch.equal(full, torch.cat(parts, dim=-1))
    (full * up).sum().backward()
    assert_close(z.grad, chunk(up, -1, topo), "gather_from backward")


def check_column(topo, *, gather_output, skip_bias_add, bias=True):
    torch.manual_seed(10)
    layer = ColumnParallelLinear(
        8, 4 * topo.tp_size, tp_group=topo.tp_group, bias=bias,
        gather_output=gather_output, skip_bias_add=skip_bias_add,
    )  # fmt: skip
    twin = torch.nn.Linear(8, 4 * topo.tp_size, bias=bias)
    torch.manual_seed(10)
    linear_default_init(twin.weight)  # what the layer drew for its full weight, same seed
    with torch.no_grad():
        assert_close(gather_full_parameter(layer.weight, topo.tp_group), twin.weight, "init")
        if bias:
            twin.bias.normal_()
            layer.bias.copy_(chunk(twin.bias, 0, topo))
    assert layer.weight.shape == (4, 8) and layer.weight.partition_dim == 0

    x = torch.randn(2, 3, 8)
    up = torch.randn(2, 3, 4 * topo.tp_size)
    x_tp, x_ref = x.clone().requires_grad_(), x.clone().requires_grad_()
    out = layer(x_tp)
    if skip_bias_add:
        out, b = out
        out = out + b if bias else out
    ref = twin(x_ref)
    if gather_output:
        assert_close(out, ref, "column forward (gathered output)")
        (out * up).sum().backward()
    else:
        assert_close(out, chunk(ref, -1, topo), "column forward (local columns)")
        (out * chunk(up, -1, topo)).sum().backward()
    (ref * up).sum().backward()
    assert_close(x_tp.grad, x_ref.grad, "column input grad")
    g = topo.tp_group
    assert_close(gather_full_parameter(layer.weight, g, grad=True), twin.weight.grad, "col dW")
    if bias:
        assert_close(gather_full_parameter(layer.bias, g, grad=True), twin.bias.grad, "col db")


def check_row(topo, *, input_is_parallel, skip_bias_add):
    torch.manual_seed(11)
    layer = RowParallelLinear(
        4 * topo.tp_size, 6, tp_group=topo.tp_group,
        input_is_parallel=input_is_parallel, skip_bias_add=skip_bias_add,
    )  # fmt: skip
    twin = torch.nn.Linear(4 * topo.tp_size, 6)
    torch.manual_seed(11)
    linear_default_init(twin.weight)
    with torch.no_grad():
        twin.bias.normal_()
        layer.bias.copy_(twin.bias)
    assert layer.weight.shape == (6, 4) and layer.weight.partition_dim == 1
    assert not hasattr(layer.bias, "tensor_model_parallel")  # replicated

    x = torch.randn(5, 4 * topo.tp_size)
    up = torch.randn(5, 6)
    x_in = (x if not input_is_parallel else chunk(x, -1, topo)).clone().requires_grad_()
    x_ref = x.clone().requires_grad_()
    out = layer(x_in)
    if skip_bias_add:
        out, b = out
        out = out + b
    ref = twin(x_ref)
    assert_close(out, ref, "row forward")
    (out * up).sum().backward()
    (ref * up).sum().backward()
    ref_grad = x_ref.grad if not input_is_parallel else chunk(x_ref.grad, -1, topo)
    assert_close(x_in.grad, ref_grad, "row input grad")
    g = topo.tp_group
    assert_close(gather_full_parameter(layer.weight, g, grad=True), twin.weight.grad, "row dW")
    assert_close(layer.bias.grad, twin.bias.grad, "row db")


def check_mlp(topo):
    """The real use: column -> gelu -> row, against two plain linears."""
    tp, g = topo.tp_size, topo.tp_group
    torch.manual_seed(12)
    fc1 = ColumnParallelLinear(8, 8 * tp, tp_group=g)
    fc2 = RowParallelLinear(8 * tp, 8, tp_group=g)
    ref1 = torch.nn.Linear(8, 8 * tp)
    ref2 = torch.nn.Linear(8 * tp, 8)
    with torch.no_grad():
        for ours, ref in ((fc1, ref1), (fc2, ref2)):
            ref.weight.copy_(gather_full_parameter(ours.weight, g))
            ref.bias.copy_(gather_full_parameter(ours.bias, g))
    x = torch.randn(4, 3, 8)
    x1, x2 = x.clone().requires_grad_(), x.clone().requires_grad_()
    out, ref = fc2(F.gelu(fc1(x1))), ref2(F.gelu(ref1(x2)))
    assert_close(out, ref, "mlp forward")
    out.square().sum().backward()
    ref.square().sum().backward()
    assert_close(x1.grad, x2.grad, "mlp input grad")
    for ours, twin, name in ((fc1, ref1, "fc1"), (fc2, ref2, "fc2")):
        assert_close(gather_full_parameter(ours.weight, g, grad=True), twin.weight.grad, name)
        assert_close(gather_full_parameter(ours.bias, g, grad=True), twin.bias.grad, name)


def check_embedding(topo):
    tp, g = topo.tp_size, topo.tp_group
    torch.manual_seed(13)
    emb = VocabParallelEmbedding(8 * tp, 5, tp_group=g)
    torch.manual_seed(13)
    twin = torch.nn.Embedding(8 * tp, 5)  # draws N(0, 1) for the full table, like ours
    assert_close(gather_full_parameter(emb.weight, g), twin.weight.detach(), "embedding init")
    assert emb.weight.shape == (8, 5)
    ids = torch.randint(0, 8 * tp, (3, 7))
    ids[0, :tp] = torch.arange(tp) * 8  # every rank's first row is used
    out, ref = emb(ids), twin(ids)
    assert_close(out, ref, "embedding forward")
    up = torch.randn(3, 7, 5)
    (out * up).sum().backward()
    (ref * up).sum().backward()
    assert_close(gather_full_parameter(emb.weight, g, grad=True), twin.weight.grad, "emb dW")


def check_sharding(topo):
    """Each rank holds 1/tp of every split weight; the shards add up to the full model."""
    tp, g = topo.tp_size, topo.tp_group
    model = torch.nn.ModuleList([
        VocabParallelEmbedding(16 * tp, 8, tp_group=g),
        ColumnParallelLinear(8, 12 * tp, tp_group=g),
        RowParallelLinear(12 * tp, 8, tp_group=g),
    ])  # fmt: skip
    split = sum(p.numel() for p in model.parameters() if getattr(p, "tensor_model_parallel", 0))
    replicated = sum(p.numel() for p in model.parameters()) - split
    full_split = 16 * tp * 8 + (12 * tp * 8 + 12 * tp) + 12 * tp * 8
    assert split * tp == full_split, (split, tp, full_split)
    assert replicated == 8  # the row-parallel bias
    total = torch.tensor([split])
    dist.all_reduce(total, group=g)
    assert total.item() == full_split


def _worker(rank, world_size):
    for tp in (2, 4):
        topo = ParallelTopology(tp_size=tp)
        torch.manual_seed(1234)  # same draws on every rank for inputs and upstream grads
        check_mappings(topo)
        for gather_output in (False, True):
            check_column(topo, gather_output=gather_output, skip_bias_add=False)
        check_column(topo, gather_output=False, skip_bias_add=True)
        check_column(topo, gather_output=True, skip_bias_add=False, bias=False)
        for input_is_parallel in (True, False):
            check_row(topo, input_is_parallel=input_is_parallel, skip_bias_add=False)
        check_row(topo, input_is_parallel=True, skip_bias_add=True)
        check_mlp(topo)
        check_embedding(topo)
        check_sharding(topo)
    return True


def test_tensor_parallel_layers_match_unsharded_twins_at_tp2_and_tp4():
    assert run_distributed(_worker, 4) == [True] * 4
