"""Worker side: join the process group through DeepSpeed, with the backend the machine allows.

`init_distributed()` uses NCCL when CUDA is available and gloo otherwise: a config that says
`distributed_backend: nccl` (GPT-NeoX's default, which its configs spell out and so cannot be
told from a choice) runs on a CPU-only machine on gloo without a warning on every run; the
start-up report names the backend in use, and `--verbose` logs the fallback. It reads the
variables `setup_distributed_env()` exported, pins the CUDA device (`pin_device`: LOCAL_RANK,
or 0 when a process sees one GPU, LOCAL_RANK then set to 0 so that DeepSpeed agrees), and is
idempotent: a second call, or a call after someone else initialised
`torch.distributed`, returns the backend in use. On CPU it then removes the names of
DeepSpeed's shared-memory buffers (`shm_buffers.py`), which DeepSpeed itself leaves behind.
"""

from __future__ import annotations

import logging
import os
from datetime import timedelta

from megatron.config.placement import NODE_LOCAL_RANK, node_local_rank
from megatron.config.verbosity import quiet_deepspeed, sync_deepspeed_logger
from megatron.launcher.errors import WorkerEnvironmentError
from megatron.launcher.shm_buffers import release_own_buffer

logger = logging.getLogger(__name__)

BACKENDS = ("nccl", "gloo", "mpi", "ccl")
_REQUIRED = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


def choose_backend(backend: str | None, cuda_available: bool) -> str:
    """The backend to use: `backend` if this machine supports it, else nccl/gloo by CUDA."""
    if backend is None:
        return "nccl" if cuda_available else "gloo"
    name = backend.lower()
    if name not in BACKENDS:
        raise WorkerEnvironmentError(
            f"distributed_backend: {backend!r} is not a torch.distributed backend; "
            f"valid: {', '.join(BACKENDS)}"
        )
    if name == "nccl" and not cuda_available:
        logger.info("distributed_backend: nccl needs CUDA and none is available; using gloo")
        return "gloo"
    return name


def device_index(local_rank: int, device_count: int) -> int:
    """This process's GPU by DeepSpeed's rule, `cuda:LOCAL_RANK` (its process group, engine,
    `PipelineModule` and ZeRO-3 each place on `device_name(LOCAL_RANK)`), or device 0 when the
    process sees one GPU only (SLURM's `--gpus-per-task=1`): that one is its own. With more
    than one but not LOCAL_RANK+1 visible, which one is ours cannot be told: refused."""
    if local_rank < device_count:
        return local_rank
    if device_count == 1:
        return 0
    visible = os.environ.get("CUDA_VISIBLE_DEVICES", "unset")
    raise WorkerEnvironmentError(
        f"LOCAL_RANK={local_rank}, but this process sees {device_count} GPUs "
        f"(CUDA_VISIBLE_DEVICES={visible}): DeepSpeed puts local rank N on cuda:N. Let every "
        "process see all of its node's GPUs, or exactly one (SLURM: --gpus-per-task=1)"
    )


def pin_device() -> int:
    """Set this process's CUDA device (`device_index`) and make LOCAL_RANK name it, which is
    what DeepSpeed reads as the device ("local rank (= GPU device ID)", `dist.get_local_rank`);
    the launcher's value stays in NODE_LOCAL_RANK (`node_local_rank`). Returns the index."""
    import torch

    local_rank = int(os.environ["LOCAL_RANK"])
    device = device_index(local_rank, torch.cuda.device_count())
    if device != local_rank:
        if "OMPI_COMM_WORLD_LOCAL_RANK" in os.environ:  # DeepSpeed asserts they are equal
            raise WorkerEnvironmentError(
                f"OMPI_COMM_WORLD_LOCAL_RANK={local_rank} with one visible GPU per process: "
                "DeepSpeed requires LOCAL_RANK to equal it, and LOCAL_RANK must be the device "
                "(0); under OpenMPI let every process see all of its node's GPUs"
            )
        os.environ[NODE_LOCAL_RANK] = str(local_rank)
        os.environ["LOCAL_RANK"] = str(device)
        logger.info("one visible GPU: local rank %d runs on cuda:0 (LOCAL_RANK=0)", local_rank)
    torch.cuda.set_device(device)
    return device


def refuse_node_local_storage(ds_config: dict) -> None:
    """DeepSpeed's `checkpoint.use_node_local_storage` writes a node's files from its local
    rank 0: after `pin_device` made every process local rank 0 (one GPU each), all of them
    would write the same files at once. Refused with the reason."""
    moved = node_local_rank() != int(os.environ.get("LOCAL_RANK") or 0)
    if moved and (ds_config.get("checkpoint") or {}).get("use_node_local_storage"):
        raise WorkerEnvironmentError(
            "checkpoint.use_node_local_storage with one visible GPU per process: LOCAL_RANK "
            "is 0 on every process (the device DeepSpeed uses), so every process of a node "
            "would write its checkpoint files; drop the key or let each process see all GPUs"
        )


def init_distributed(backend: str | None = None, *, timeout_minutes: float | None = None) -> str:
    """Initialise torch.distributed through `deepspeed.init_distributed`; return the backend.

    Args:
        backend: nccl, gloo, mpi or ccl (None: nccl with CUDA, else gloo); nccl without
            CUDA falls back to gloo.
        timeout_minutes: collective timeout (None: DeepSpeed's default, which the
            DEEPSPEED_TIMEOUT environment variable overrides).

    Raises:
        WorkerEnvironmentError: RANK, WORLD_SIZE, ... are not set; call
            `setup_distributed_env(cfg.launcher)` first.
    """
    import torch
    import torch.distributed as dist

    cuda = torch.cuda.is_available()
    if not cuda:
        # Must precede the first `import deepspeed`: its accelerator is chosen once.
        os.environ.setdefault("DS_ACCELERATOR", "cpu")
    import deepspeed

    sync_deepspeed_logger()
    if dist.is_available() and dist.is_initialized():
        with quiet_deepspeed():
            deepspeed.init_distributed(dist_backend=dist.get_backend(), verbose=False)
        return dist.get_backend()
    missing = [name for name in _REQUIRED if name not in os.environ]
    if missing:
        raise WorkerEnvironmentError(
            f"init_distributed: {', '.join(missing)} not set; call "
            "megatron.launcher.setup_distributed_env(cfg.launcher) first, or start the "
            "worker with deepy.py"
        )
    name = choose_backend(backend, cuda)
    if cuda:
        pin_device()
    kwargs = {}
    if timeout_minutes is not None:
        kwargs["timeout"] = timedelta(minutes=timeout_minutes)
    with quiet_deepspeed():  # on CPU it prints that it built its shared-memory op
        deepspeed.init_distributed(
            dist_backend=name, auto_mpi_discovery=False, verbose=False, **kwargs
        )
    if not cuda:
        release_own_buffer()  # DeepSpeed never removes its /dev/shm all-reduce buffers
    return name
