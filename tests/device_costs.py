"""Counters that make a GPU's costs visible on a CPU: the one kind of such counter in the tests.

On a GPU, every op whose result's size or value the host needs waits for the device to finish
all the work queued before it. On a CPU nothing waits, so a test cannot see the cost; it can
count the ops. `HostReads` counts, while active, each op that on a GPU would synchronise the
host with the device:

- `aten._local_scalar_dense`: `.item()`, `float()`, `int()`, `bool()`, `if t:`;
- `Tensor.tolist()` and `Tensor.numpy()` (patched: they do not dispatch);
- ops whose output size depends on the values: `nonzero`/`argwhere`/`where(mask)`,
  `masked_select`, boolean-mask indexing (`x[mask]`, `x[mask] = v`), `unique*`,
  `repeat_interleave` without `output_size`;
- `bincount` (its CUDA kernel reads the input's range back), `equal`;
- the accelerator's `synchronize()` (DeepSpeed's `get_accelerator()` and `torch.cuda`).

`HostOps` counts every op dispatched while it is active, and those of them a GPU would launch
a kernel for (`launches`: not a view, not an allocation): each costs the host a few
microseconds, and work queued one small op at a time after a host read leaves the GPU idle.

Tensors that live on the host on every device (torch's optimizers keep their step counters
there) are named in `exempt` and not counted. Each read is recorded with the first frame
outside torch and this file (`where`), so a failing test names the line that read.
"""

from __future__ import annotations

import collections
import dataclasses
import sys
import traceback
import weakref

import torch
from torch.utils._python_dispatch import TorchDispatchMode

aten = torch.ops.aten

# ops that read a device value back to the host (or size their output by the values)
_READS = {
    aten._local_scalar_dense.default: "item",
    aten.nonzero.default: "nonzero",
    aten.masked_select.default: "masked_select",
    aten._unique.default: "unique",
    aten._unique2.default: "unique",
    aten.unique_dim.default: "unique",
    aten.unique_consecutive.default: "unique",
    aten.bincount.default: "bincount",
    aten.equal.default: "equal",
}
_INDEX_OPS = {aten.index.Tensor, aten.index_put.default, aten.index_put_.default}
_SKIP_FILES = (__file__, "/torch/", "/contextlib.py")


def _is_mask(index) -> bool:
    return torch.is_tensor(index) and index.dtype in (torch.bool, torch.uint8)


def read_kind(func, args, kwargs) -> str | None:
    """The kind of host read `func(*args, **kwargs)` makes on a GPU, or None."""
    if func in _READS:
        return _READS[func]
    if func in _INDEX_OPS and any(_is_mask(i) for i in (args[1] or ()) if i is not None):
        return "mask_index"
    if func is aten.repeat_interleave.Tensor or func is aten.repeat_interleave.self_Tensor:
        output_size = kwargs.get("output_size") if kwargs else None
        return "repeat_interleave" if output_size is None else None
    return None


def caller() -> str:
    """`file:line` of the innermost frame outside torch and this module."""
    for frame in reversed(traceback.extract_stack()):
        if not any(part in frame.filename for part in _SKIP_FILES):
            return f"{frame.filename.rsplit('/megatron/', 1)[-1]}:{frame.lineno}"
    return "?"


class HostReads(TorchDispatchMode):
    """Counts, while active, the host reads and device synchronisations a GPU would pay.

    `count`: how many; `kinds`: a Counter by kind; `where`: a Counter by `file:line` of the
    reading code. `exempt`: tensors that live on the host on every device (not counted).
    """

    def __init__(self, exempt=()):
        super().__init__()
        self.exempt = {t.data_ptr() for t in exempt}

    def _count(self, kind: str) -> None:
        self.count += 1
        self.kinds[kind] += 1
        self.where[f"{kind} {caller()}"] += 1

    def __enter__(self):
        self.count = 0
        self.kinds, self.where = collections.Counter(), collections.Counter()
        self._patched = []
        for name in ("tolist", "numpy"):
            self._patch(torch.Tensor, name, name)
        self._patch(torch.cuda, "synchronize", "synchronize")
        accelerator = _deepspeed_accelerator()
        if accelerator is not None:
            self._patch(accelerator, "synchronize", "synchronize")
        return super().__enter__()

    def _patch(self, owner, name: str, kind: str) -> None:
        original = getattr(owner, name)
        mode = self

        def counted(*args, **kwargs):
            mode._count(kind)
            return original(*args, **kwargs)

        self._patched.append((owner, name, owner.__dict__.get(name), original))
        setattr(owner, name, counted)

    def __exit__(self, *exc):
        for owner, name, own, _ in reversed(self._patched):
            if own is None:
                delattr(owner, name)
            else:
                setattr(owner, name, own)
        return super().__exit__(*exc)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kind = read_kind(func, args, kwargs)
        if kind == "item" and args[0].data_ptr() in self.exempt:
            kind = None
        if kind is not None:
            self._count(kind)
        return func(*args, **(kwargs or {}))

    def report(self) -> str:
        """The reads by place, most first: for a failing assertion's message."""
        return ", ".join(f"{where} x{n}" for where, n in self.where.most_common())


_NO_KERNEL = {aten.empty.memory_format, aten.empty_like.default, aten.empty_strided.default}


class HostOps(TorchDispatchMode):
    """Counts, while active, the ops dispatched (`count`) and those that would launch a kernel
    on a GPU (`launches`), with the launches by `file:line` of the calling code (`where`); the
    counts add up over every time it is entered."""

    def __init__(self):
        super().__init__()
        self.count, self.launches, self.where = 0, 0, collections.Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.count += 1
        if not func.is_view and func not in _NO_KERNEL:
            self.launches += 1
            self.where[f"{func.overloadpacket.__name__} {caller()}"] += 1
        return func(*args, **(kwargs or {}))

    def report(self, top: int = 12) -> str:
        """The launches by op and place, most first: for a failing assertion's message."""
        return ", ".join(f"{where} x{n}" for where, n in self.where.most_common(top))


def _deepspeed_accelerator():
    """DeepSpeed's accelerator object, where DeepSpeed is imported already (None otherwise)."""
    if "deepspeed" not in sys.modules:
        return None
    from deepspeed.accelerator import get_accelerator

    return get_accelerator()


class LargeTensors(TorchDispatchMode):
    """Records, while active, the tensors a GPU would have to hold: each op's outputs
    (`kind` "output") and, through `saved_tensors_hooks`, what autograd keeps for backward
    (`kind` "saved"), as `Buffer`s with shape, dtype, bytes and the allocating `file:line`.

    Views (outputs sharing an input's storage) are not allocations and are left out. `storage`
    and `alive()` identify the memory: a tensor one layer builds and the next reuses is the same
    storage, still alive (a freed address the allocator hands out again is not).
    """

    def __enter__(self):
        self.buffers: list[Buffer] = []
        self._hooks = torch.autograd.graph.saved_tensors_hooks(self._pack, lambda t: t)
        self._hooks.__enter__()
        return super().__enter__()

    def __exit__(self, *exc):
        self._hooks.__exit__(*exc)
        return super().__exit__(*exc)

    def _record(self, kind: str, t: torch.Tensor) -> None:
        self.buffers.append(
            Buffer(
                kind,
                tuple(t.shape),
                t.dtype,
                t.numel() * t.element_size(),
                _storage(t),
                caller(),
                weakref.ref(t),
            )
        )

    def _pack(self, t: torch.Tensor) -> torch.Tensor:
        self._record("saved", t)
        return t

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        inputs = {_storage(t) for t in _tensors((args, kwargs))}
        for t in _tensors(out):
            if _storage(t) not in inputs:
                self._record("output", t)
        return out

    def square(self, s: int, kind: str | None = None) -> list[Buffer]:
        """The buffers with two dims of length `s` (sequence × sequence), of `kind` or any."""
        return [b for b in self.buffers if b.shape.count(s) >= 2 and kind in (None, b.kind)]

    def report(self, buffers=None) -> str:
        """Buffers by size, largest first: for a failing assertion's message."""
        chosen = sorted(self.buffers if buffers is None else buffers, key=lambda b: -b.nbytes)
        return ", ".join(str(b) for b in chosen[:12])


@dataclasses.dataclass(frozen=True)
class Buffer:
    """One tensor `LargeTensors` saw."""

    kind: str
    shape: tuple[int, ...]
    dtype: torch.dtype
    nbytes: int
    storage: int
    where: str
    tensor: weakref.ref = dataclasses.field(compare=False, repr=False)

    def alive(self) -> bool:
        """Whether the tensor is still referenced (a cache, a later layer's graph)."""
        return self.tensor() is not None

    def __str__(self) -> str:
        return f"{self.kind} {self.shape} {self.dtype} {self.nbytes} B at {self.where}"


def _storage(t: torch.Tensor) -> int:
    return t.untyped_storage().data_ptr() if t.device.type != "meta" else id(t)


def _tensors(tree):
    return [t for t in torch.utils._pytree.tree_leaves(tree) if torch.is_tensor(t)]
