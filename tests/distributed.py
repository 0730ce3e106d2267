"""Run a test function on several CPU processes joined by a gloo process group.

`run_distributed(fn, world_size, *args)` spawns `world_size` processes, initialises
`torch.distributed` (gloo) in each, calls `fn(rank, world_size, *args)` and returns the list
of per-rank return values (which must be picklable; they travel by value, tensors included:
torch's queue would pass a tensor as a handle to the rank's shared memory, which is gone once
the rank has exited, and the parent's read then fails with FileNotFoundError).
`backend="cuda:gloo"` puts every rank on the one GPU instead, in a process group whose only
backend is for CUDA tensors: a collective on a host tensor is refused there as NCCL would
refuse it (NCCL itself refuses two ranks on one device). An exception on any rank fails the
call with that rank's traceback, so a broken collective cannot hang the suite silently.

On the CPU the ranks are forked from one forkserver that has imported torch, DeepSpeed,
transformers and the trainer once for the whole session: a spawned rank spent 3-5 s importing
them before its test began (the same 2-rank call took 3.4 s spawned and 0.06 s forked), and the
suite makes some hundreds of these calls. Each rank takes the caller's environment as it is at
the call, as a spawned one would. The server never touches CUDA; `cuda:gloo` ranks are still
spawned, so nothing CUDA-initialised is ever forked.
"""

from __future__ import annotations

import os
import pickle
import socket
import time
import traceback
from queue import Empty

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# What a rank imports before its test's own module: torch, DeepSpeed (which picks its
# accelerator at import: the CPU here), transformers (the reference models) and the trainer.
PRELOAD = ["torch", "deepspeed", "transformers", "megatron.training", "tests.distributed"]


def _context(backend: str):
    if backend.startswith("cuda"):
        return mp.get_context("spawn")
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(PRELOAD)  # read when the server starts, on the first call
    return ctx


def _worker(rank, world_size, port, fn, args, queue, backend, environ):
    cuda = backend.startswith("cuda")
    os.environ.clear()  # the caller's, not the forkserver's from its start
    os.environ.update(environ)
    os.environ.update(
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
        RANK=str(rank),
        LOCAL_RANK="0" if cuda else str(rank),  # DeepSpeed's device: the one GPU
        WORLD_SIZE=str(world_size),
        LOCAL_WORLD_SIZE=str(world_size),
        DS_ACCELERATOR="cuda" if cuda else "cpu",
    )
    torch.set_num_threads(1)
    try:
        if cuda:
            torch.cuda.set_device(0)
        dist.init_process_group(backend, rank=rank, world_size=world_size)
        result = fn(rank, world_size, *args)
        queue.put((rank, True, pickle.dumps(result)))  # by value (module docstring)
    except BaseException:  # noqa: BLE001 - report every failure to the parent
        queue.put((rank, False, traceback.format_exc()))
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def run_distributed(fn, world_size: int, *args, timeout: float = 300.0, backend: str = "gloo"):
    """Call `fn(rank, world_size, *args)` on `world_size` ranks (gloo on the CPU, or
    `backend="cuda:gloo"` on the one GPU); return results by rank."""
    ctx = _context(backend)
    queue = ctx.Queue()
    port = free_port()
    environ = dict(os.environ)
    procs = [
        ctx.Process(target=_worker, args=(r, world_size, port, fn, args, queue, backend, environ))
        for r in range(world_size)
    ]
    for p in procs:
        p.start()
    results: dict[int, object] = {}
    failures = []
    deadline = time.monotonic() + timeout
    # Drain the queue before joining: a rank blocks on a large result until it is read.
    while len(results) + len(failures) < world_size:
        if time.monotonic() > deadline:
            failures.append(f"not every rank finished within {timeout:.0f} s")
            break
        try:
            rank, ok, payload = queue.get(timeout=1.0)
        except Empty:
            if not any(p.is_alive() for p in procs) and queue.empty():
                failures.append("a rank exited without reporting (crashed?)")
                break
            continue
        if ok:
            results[rank] = pickle.loads(payload)
        else:
            failures.append(f"rank {rank} failed:\n{payload}")
    for p in procs:
        p.join(5 if failures else timeout)
        if p.is_alive():
            p.kill()
    if failures:
        raise AssertionError("\n".join(failures))
    return [results[r] for r in range(world_size)]
