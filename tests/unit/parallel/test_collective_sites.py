"""Only `megatron/parallel/comm.py` and `host_values.py` call `torch.distributed` collectives.

An NCCL group reduces CUDA tensors only, and a CPU gloo run cannot tell a host tensor handed
to a collective from a device one. So the structure rules the mistake out: every collective
goes through one of two helpers (device tensors through `comm.py`, which refuses a host
tensor on an NCCL group; host values through `host_values.py`, which moves them to the
group's device), and this test fails when any other module of the product calls one.
Barriers and the object collectives (`all_gather_object`, `broadcast_object_list`) take no
tensor of the caller's and are not counted.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
import torch

from megatron.parallel import comm
from megatron.parallel.host_values import _exact_dtype, collective_device, reduce_host

ROOT = Path(__file__).resolve().parents[3]
ALLOWED = {"megatron/parallel/comm.py", "megatron/parallel/host_values.py"}
TENSOR_COLLECTIVES = {
    "all_reduce", "broadcast", "all_gather", "all_gather_into_tensor", "all_gather_single",
    "reduce_scatter", "reduce_scatter_tensor", "reduce_scatter_single", "reduce", "gather",
    "scatter", "all_to_all", "all_to_all_single", "send", "recv", "isend", "irecv",
    "batch_isend_irecv", "all_reduce_coalesced", "all_gather_coalesced",
}  # fmt: skip
DIST_MODULES = {"torch.distributed", "deepspeed.comm"}


def _aliases(tree: ast.AST) -> tuple[set[str], set[str]]:
    """Names bound to a distributed module, and collectives imported by name."""
    modules, functions = set(), set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.name in DIST_MODULES:
                    modules.add(a.asname or a.name)
        elif isinstance(node, ast.ImportFrom) and node.module:
            for a in node.names:
                if f"{node.module}.{a.name}" in DIST_MODULES:
                    modules.add(a.asname or a.name)
                elif node.module in DIST_MODULES and a.name in TENSOR_COLLECTIVES:
                    functions.add(a.asname or a.name)
    return modules, functions


def collective_calls(source: str) -> list[tuple[int, str]]:
    """(line, call) of every tensor collective of `torch.distributed`/`deepspeed.comm`."""
    tree = ast.parse(source)
    modules, functions = _aliases(tree)
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        if isinstance(func, ast.Name) and func.id in functions:
            found.append((node.lineno, func.id))
        elif isinstance(func, ast.Attribute) and func.attr in TENSOR_COLLECTIVES:
            owner = ast.unparse(func.value)
            if owner in modules or owner in DIST_MODULES:
                found.append((node.lineno, f"{owner}.{func.attr}"))
    return found


def _product_files():
    yield from sorted((ROOT / "megatron").rglob("*.py"))
    yield from sorted((ROOT / "tools").rglob("*.py"))
    yield from sorted(ROOT.glob("*.py"))


def test_no_module_but_the_two_helpers_calls_a_collective():
    offenders = []
    for path in _product_files():
        rel = path.relative_to(ROOT).as_posix()
        if rel in ALLOWED:
            continue
        offenders += [f"{rel}:{line}: {call}" for line, call in collective_calls(path.read_text())]
    assert not offenders, (
        "collectives outside megatron/parallel/comm.py and host_values.py (use "
        "comm.all_reduce & co. for device tensors, host_values.reduce_host/broadcast_host "
        "for host values):\n" + "\n".join(offenders)
    )


@pytest.mark.parametrize(
    "source",
    [
        "import torch.distributed as dist\ndist.all_reduce(x)",
        "import torch\ntorch.distributed.broadcast(x, 0)",
        "from torch import distributed as d\nd.all_gather(parts, x)",
        "from torch.distributed import all_reduce as ar\nar(x)",
        "import deepspeed.comm as dist\ndist.all_reduce(x)",
    ],
)
def test_the_scan_sees_every_spelling_of_a_collective(source):
    assert len(collective_calls(source)) == 1


def test_the_scan_leaves_barriers_object_collectives_and_our_helpers_alone():
    source = (
        "import torch.distributed as dist\nfrom megatron.parallel.comm import all_reduce\n"
        "dist.barrier()\ndist.all_gather_object(out, obj)\nall_reduce(x, group)\n"
    )
    assert collective_calls(source) == []


def test_nccl_groups_reduce_on_the_current_cuda_device(monkeypatch):
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 3)
    assert collective_device(backend="nccl") == torch.device("cuda", 3)
    assert collective_device(backend="NCCL") == torch.device("cuda", 3)
    assert collective_device(backend="gloo") == torch.device("cpu")
    assert collective_device(backend="mpi") == torch.device("cpu")
    # a group with a CPU backend beside NCCL takes host values as they are
    assert collective_device(backend="cpu:gloo,cuda:nccl") == torch.device("cpu")
    assert collective_device(backend="cuda:nccl") == torch.device("cuda", 3)
    with pytest.raises(ValueError, match="'smoke-signals'.*known: ccl, gloo, mpi, nccl"):
        collective_device(backend="smoke-signals")


class _NcclGroup:
    """What `torch.distributed` says of a two-rank NCCL group, for a process without one."""


def _pretend_nccl(monkeypatch, calls):
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(comm.dist, "get_backend", lambda group=None: "nccl")
    monkeypatch.setattr(comm.dist, "get_world_size", lambda group=None: 2)
    monkeypatch.setattr(comm.dist, "all_reduce", lambda t, **kw: calls.append(t.device))


def test_a_host_tensor_on_an_nccl_group_is_refused_before_the_collective(monkeypatch):
    calls = []
    _pretend_nccl(monkeypatch, calls)
    with pytest.raises(RuntimeError, match=r"CPU tensor of shape \(3,\).*nccl.*host_values"):
        comm.all_reduce(torch.zeros(3), _NcclGroup())
    assert calls == []  # refused before torch.distributed saw it


def test_host_values_travel_to_the_nccl_device(monkeypatch):
    calls = []
    _pretend_nccl(monkeypatch, calls)
    moved = []
    real_to = torch.Tensor.to

    def to(self, *args, **kwargs):  # no CUDA here: stay on the host, remember the target
        moved.append(kwargs.get("device"))
        return real_to(self, dtype=kwargs.get("dtype"))

    monkeypatch.setattr(torch.Tensor, "to", to)
    out = reduce_host([1.5, 2.0], _NcclGroup())
    assert moved[0] == torch.device("cuda", 0) and calls == [torch.device("cpu")]
    assert out.dtype == torch.float64 and out.tolist() == [1.5, 2.0]


def test_host_values_reduce_in_dtypes_that_stay_exact():
    assert _exact_dtype(torch.tensor([True])) == torch.int64
    assert _exact_dtype(torch.tensor([3], dtype=torch.int32)) == torch.int64
    assert _exact_dtype(torch.tensor([3.0], dtype=torch.bfloat16)) == torch.float64
    assert reduce_host([2**40 + 1], None).item() == 2**40 + 1  # a token count past fp32
