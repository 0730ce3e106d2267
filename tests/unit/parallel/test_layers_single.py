"""Tensor-parallel layers with `tp_group=None` equal nn.Linear / nn.Embedding; errors; marks."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from megatron.parallel import (
    ColumnParallelLinear,
    RowParallelLinear,
    VocabParallelEmbedding,
    allreduce_sequence_parallel_grads,
    copy_to_tensor_parallel_region,
    gather_from_sequence_parallel_region,
    gather_from_tensor_parallel_region,
    gather_full_parameter,
    is_tensor_parallel,
    reduce_from_tensor_parallel_region,
    reduce_scatter_to_sequence_parallel_region,
    register_sequence_parallel_grad_hooks,
    scatter_to_sequence_parallel_region,
    scatter_to_tensor_parallel_region,
)


@pytest.mark.parametrize("cls", [ColumnParallelLinear, RowParallelLinear])
def test_linear_without_tp_equals_nn_linear(cls):
    torch.manual_seed(0)
    layer = cls(5, 7)
    torch.manual_seed(0)
    ref = nn.Linear(5, 7)  # draws the weight first, with the same Kaiming-uniform init
    assert torch.equal(layer.weight, ref.weight)
    assert torch.equal(layer.bias, torch.zeros(7))  # our biases start at zero
    with torch.no_grad():
        layer.bias.copy_(ref.bias)
    x = torch.randn(2, 3, 5)
    assert torch.equal(layer(x), ref(x))
    out, bias = cls(5, 7, skip_bias_add=True)(x)
    assert out.shape == (2, 3, 7) and bias.shape == (7,)
    assert cls(5, 7, bias=False, skip_bias_add=True)(x)[1] is None


def test_embedding_without_tp_equals_nn_embedding():
    torch.manual_seed(1)
    emb = VocabParallelEmbedding(11, 4)
    torch.manual_seed(1)
    ref = nn.Embedding(11, 4)
    ids = torch.randint(0, 11, (3, 5))
    assert torch.equal(emb(ids), ref(ids))


def test_init_method_sees_the_full_weight_and_marks_are_set():
    shapes = []
    init = lambda t: (shapes.append(tuple(t.shape)), nn.init.constant_(t, 0.5))
    col = ColumnParallelLinear(4, 6, init_method=init)
    row = RowParallelLinear(6, 4, init_method=init)
    emb = VocabParallelEmbedding(10, 4, init_method=init)
    assert shapes == [(6, 4), (4, 6), (10, 4)]
    assert torch.all(col.weight == 0.5)
    assert [p.partition_dim for p in (col.weight, row.weight, emb.weight)] == [0, 1, 0]
    assert is_tensor_parallel(col.bias) and not is_tensor_parallel(row.bias)
    assert torch.equal(gather_full_parameter(col.weight, None), col.weight.detach())


def test_bad_arguments_raise_clear_errors():
    with pytest.raises(ValueError, match="gather_output=True cannot be combined"):
        ColumnParallelLinear(4, 4, gather_output=True, sequence_parallel=True)
    with pytest.raises(ValueError, match="sharded bias"):
        ColumnParallelLinear(4, 4, gather_output=True, skip_bias_add=True)
    with pytest.raises(ValueError, match="needs input_is_parallel=True"):
        RowParallelLinear(4, 4, input_is_parallel=False, sequence_parallel=True)
    with pytest.raises(ValueError, match="no .grad yet"):
        gather_full_parameter(ColumnParallelLinear(2, 2).weight, None, grad=True)


def test_divisibility_error_names_the_layer_and_value():
    from megatron.parallel.comm import divide

    with pytest.raises(ValueError, match="RowParallelLinear in_features = 10 is not divisible by"):
        divide(10, 4, "RowParallelLinear in_features")


def test_mappings_and_sequence_parallel_helpers_are_identities_without_tp():
    x = torch.randn(4, 2, 3)
    for fn in (
        copy_to_tensor_parallel_region,
        reduce_from_tensor_parallel_region,
        scatter_to_tensor_parallel_region,
        gather_from_tensor_parallel_region,
        scatter_to_sequence_parallel_region,
        gather_from_sequence_parallel_region,
        reduce_scatter_to_sequence_parallel_region,
    ):
        assert fn(x, None) is x
    layer = RowParallelLinear(3, 3, sequence_parallel=True)  # SP is a no-op at tp=1
    assert not layer.sequence_parallel and not hasattr(layer.bias, "sequence_parallel")
    assert register_sequence_parallel_grad_hooks(layer, None) == []
    allreduce_sequence_parallel_grads(layer, None)  # nothing to do, must not fail
