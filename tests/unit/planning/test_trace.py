"""The plan's counters on real CPU tensors, whose sizes the test writes out itself.

`LiveBytes` must see what is made and when it is freed (views share their storage, a freed
storage's address may come back as a new one), and `SavedBytes` what autograd keeps for a
backward; the plan's activation figures are these counts made on `meta`.
"""

from __future__ import annotations

import torch

from megatron.planning.trace import LiveBytes, SavedBytes

F32 = 4


def test_live_bytes_follow_allocations_views_and_frees():
    with LiveBytes("cpu") as live:
        a = torch.empty(1000, 250)  # 1,000,000 B
        view = a[:10]  # no new memory
        b = torch.ones(500, 500)  # 1,000,000 B
        assert live.live() == 2 * 1000 * 250 * F32
        del a  # the view keeps its storage
        assert live.live() == 2 * 1000 * 250 * F32
        del view, b
        c = torch.zeros(100)
    assert live.peak() == 2 * 1000 * 250 * F32
    assert live.live() == 100 * F32
    assert live.peak(since=live.ops - 1) == 100 * F32  # only c was made in the last op
    del c


def test_a_reused_address_is_a_new_allocation():
    with LiveBytes("cpu") as live:
        for _ in range(3):  # the allocator hands the same block back each time
            t = torch.empty(4096)
            del t
        kept = torch.empty(4096)
    assert len(live.allocations) == 4
    assert live.live() == 4096 * F32 and live.peak() == 4096 * F32
    del kept


def test_meta_tensors_hold_no_memory_in_a_real_count():
    with LiveBytes("cpu") as live:
        shape_only = torch.empty(10**9, device="meta")
        real = torch.empty(10)
    assert live.live() == 10 * F32
    with LiveBytes() as planned:  # the plan's own count: meta storages
        more = torch.empty(10**9, device="meta")
    assert planned.live() == 10**9 * F32
    del shape_only, real, more


def test_saved_bytes_of_a_matmul_and_a_sigmoid():
    w = torch.randn(64, 32, requires_grad=True)
    x = torch.randn(16, 64, requires_grad=True)
    with SavedBytes(exclude=[w]) as saved:
        h = x @ w  # saves x (and w, a parameter: left out)
        y = torch.sigmoid(h)  # saves its output
        z = y * 2.0  # a scalar multiply saves nothing
    assert saved.bytes == (16 * 64 + 16 * 32) * F32
    z.sum().backward()


def test_alive_finds_the_allocations_of_given_tensors():
    with LiveBytes("cpu") as live:
        grad = torch.empty(256)
        other = torch.empty(1024)
    found = live.alive([grad, None])
    assert [a.nbytes for a in found] == [256 * F32]
    assert live.peak(exclude=found) == 1024 * F32
    del grad, other
