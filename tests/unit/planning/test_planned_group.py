"""A `PlannedGroup`: a tensor-parallel rank's shapes and collectives in one process, on `meta`.

Megatron-LM's tensor-parallel layer (Shoeybi et al. 2019, section 3) communicates twice in the
forward and twice in the backward, each an all-reduce of the `(s, b, h)` activations; under
sequence parallelism (Korthikanti et al. 2022, section 4.2.2) each all-reduce becomes an
all-gather of the `(s/t, b, h)` shard and a reduce-scatter of the whole `(s, b, h)`. The
planned group's traffic of one traced layer is held to those counts, written out here.
"""

from __future__ import annotations

import pytest
import torch

from megatron.model.args import ModelArgs
from megatron.model.transformer import TransformerLayer
from megatron.parallel import comm
from megatron.parallel.planned import PlannedGroup
from megatron.planning.parts import trace_part

S, B, H, HEADS, TP = 128, 2, 64, 4, 2
BF16 = 2


def test_collectives_give_the_real_shapes_and_count_bytes():
    group = PlannedGroup(TP, rank=1)
    x = torch.empty(8, 3, 16, device="meta")
    assert (comm.group_size(group), comm.group_rank(group)) == (TP, 1)
    assert comm.all_reduce(x, group) is x
    assert comm.all_gather_along(x, -1, group).shape == (8, 3, 32)
    assert comm.all_gather_along(x, 0, group).shape == (16, 3, 16)
    assert comm.reduce_scatter_dim0(x, group).shape == (4, 3, 16)
    assert comm.split_along(x, -1, group).shape == (8, 3, 8)
    assert [t.shape for t in comm.all_gather_list(x, group)] == [x.shape, x.shape]
    handed = x.numel() * 4
    assert group.traffic == {"all_reduce": handed, "all_gather": 3 * handed,
                             "reduce_scatter": handed}  # fmt: skip
    assert group.calls == {"all_reduce": 1, "all_gather": 3, "reduce_scatter": 1}


def test_a_planned_group_takes_no_real_tensors():
    with pytest.raises(RuntimeError, match="meta device only"):
        comm.all_reduce(torch.zeros(3), PlannedGroup(2))


@pytest.mark.parametrize("sequence_parallel", [False, True])
def test_a_layer_communicates_as_megatron_counts(sequence_parallel):
    args = ModelArgs(num_layers=1, hidden_size=H, num_attention_heads=HEADS, vocab_size=128,
                     seq_length=S, layer_attention_types=("flash",),
                     sequence_parallel=sequence_parallel)  # fmt: skip
    group = PlannedGroup(TP)
    with torch.device("meta"):
        layer = TransformerLayer(args, 0, group).to(torch.bfloat16)
    seq = S // TP if sequence_parallel else S
    x = (torch.empty(seq, B, H, device="meta", dtype=torch.bfloat16),
         torch.zeros(B, S, dtype=torch.long, device="meta"))  # fmt: skip
    trace = trace_part(layer, x, layer.parameters(), groups=[group])
    activation = S * B * H * BF16
    if sequence_parallel:
        expected = {"tensor_all_gather": 4 * activation // TP,
                    "tensor_reduce_scatter": 4 * activation}  # fmt: skip
    else:
        expected = {"tensor_all_reduce": 4 * activation}
    assert trace.traffic == expected
    forward = {k: v // 2 for k, v in expected.items()}  # the recomputation's share
    assert trace.forward_traffic == forward
