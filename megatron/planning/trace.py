"""Live and saved bytes of tensors, counted as the ops that make them run.

The memory plan traces rather than states its activation figures: a part of the model runs
forward and backward on the `meta` device (shapes and dtypes, no memory), and this module
counts what it would hold. The same counter runs over real tensors on a CPU, which is how the
tests check the plan against a real run.

`LiveBytes` is a dispatch mode: every storage an op creates (not one of its inputs', not seen
before) is recorded with its size and the op counts at which it was born and found freed (a
weak reference to the storage, checked after each op). Storages made before the mode was
entered (parameters, the traced part's input) are not counted. `peak(since, until, exclude)`
is the high-water mark of the recorded bytes over a range of ops, leaving out allocations the
caller names (the parameters' gradients, which the plan counts as model states: `alive`
finds the allocations of given tensors).

`SavedBytes` is a pair of saved-tensor hooks: the storages autograd keeps from a forward for
its backward, each counted once however many ops save it, parameters left out.
"""

from __future__ import annotations

import dataclasses

import torch
from torch.multiprocessing.reductions import StorageWeakRef
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves


def storage_id(t: torch.Tensor) -> int:
    """An id of `t`'s storage, the same for every view of it (also on `meta`)."""
    return t.untyped_storage()._cdata


def _tensors(tree) -> list[torch.Tensor]:
    return [t for t in tree_leaves(tree) if isinstance(t, torch.Tensor)]


@dataclasses.dataclass
class Allocation:
    """One recorded storage: its bytes, the op count that made it and the one after which it
    was found freed (None: alive)."""

    nbytes: int
    born: int
    freed: int | None = None


class LiveBytes(TorchDispatchMode):
    """Records the storages ops create on `device_type` while active (see the module
    docstring); `ops` counts the ops run, `allocations` lists every `Allocation` in the order
    they were made. The plan counts `meta` storages; over a real run, `meta` tensors (which
    DeepSpeed makes for shapes) hold no memory and a real device type is counted instead.

    A storage id names one live storage at a time: once a storage is freed, a new one may
    come at its address, and is then a new allocation."""

    def __init__(self, device_type: str = "meta"):
        super().__init__()
        self.device_type = device_type
        self.ops = 0
        self.allocations: list[Allocation] = []
        self._alive: dict[int, tuple[StorageWeakRef, Allocation]] = {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        self.ops += 1
        self._sweep()
        inputs = {storage_id(t) for t in _tensors((args, kwargs))}
        for t in _tensors(out):
            key = storage_id(t)
            if key in inputs or key in self._alive or t.device.type != self.device_type:
                continue
            storage = t.untyped_storage()
            allocation = Allocation(storage.nbytes(), self.ops)
            self.allocations.append(allocation)
            self._alive[key] = (StorageWeakRef(storage), allocation)
        return out

    def _sweep(self) -> None:
        for key in [k for k, (ref, _) in self._alive.items() if ref.expired()]:
            _, allocation = self._alive.pop(key)
            allocation.freed = self.ops

    def alive(self, tensors) -> list[Allocation]:
        """The live allocations holding `tensors` (those recorded; others are left out)."""
        self._sweep()
        found = (self._alive.get(storage_id(t)) for t in tensors if t is not None)
        return [entry[1] for entry in found if entry is not None]

    def records(self, key: int) -> bool:
        """Whether the live storage `key` (a `storage_id`) was made while recording."""
        self._sweep()
        return key in self._alive

    def live(self, exclude=()) -> int:
        """Bytes recorded and alive now, but those of the allocations in `exclude`."""
        self._sweep()
        skip = {id(a) for a in exclude}
        return sum(a.nbytes for _, a in self._alive.values() if id(a) not in skip)

    def peak(self, since: int = 0, until: int | None = None, exclude=()) -> int:
        """The most bytes alive at once after any op in `(since, until]` (op counts), leaving
        out the allocations in `exclude` (`alive(tensors)` finds them)."""
        self._sweep()
        until = self.ops if until is None else until
        skip = {id(a) for a in exclude}
        deltas: dict[int, int] = {}
        base = 0
        for a in self.allocations:
            if id(a) in skip or (a.freed is not None and a.freed <= since) or a.born > until:
                continue
            if a.born <= since:
                base += a.nbytes
            else:
                deltas[a.born] = deltas.get(a.born, 0) + a.nbytes
            if a.freed is not None and a.freed <= until:
                deltas[a.freed] = deltas.get(a.freed, 0) - a.nbytes
        # after the range's first op: what was alive before it, changed by its own deltas
        current = base
        best = base if since + 1 not in deltas else 0
        for op in sorted(deltas):
            current += deltas[op]
            best = max(best, current)
        return best


class SavedBytes:
    """Saved-tensor hooks counting the storages a forward keeps for its backward.

    `with SavedBytes(exclude=params) as saved: forward` -> `saved.bytes`, `saved.ids`."""

    def __init__(self, exclude=()):
        self.exclude = {storage_id(t) for t in exclude}
        self.sizes: dict[int, int] = {}

    def _pack(self, t: torch.Tensor) -> torch.Tensor:
        key = storage_id(t)
        if key not in self.exclude:
            self.sizes.setdefault(key, t.untyped_storage().nbytes())
        return t

    def __enter__(self):
        self._hooks = torch.autograd.graph.saved_tensors_hooks(self._pack, lambda t: t)
        self._hooks.__enter__()
        return self

    def __exit__(self, *exc):
        return self._hooks.__exit__(*exc)

    @property
    def bytes(self) -> int:
        return sum(self.sizes.values())

    @property
    def ids(self) -> set[int]:
        return set(self.sizes)
