"""Worker side: join the process group through DeepSpeed, with the backend the machine allows.

`init_distributed()` uses NCCL when CUDA is available and gloo otherwise: a config that says
`distributed_backend: nccl` (GPT-NeoX's default, which its configs spell out and so cannot be
told from a choice) runs on a CPU-only machine on gloo without a warning on every run; the
start-up report names the backend in use, and `--verbose` logs the fallback. It reads the
variables `setup_distributed_env()` exported, pins the CUDA device to LOCAL_RANK under
NCCL, and is idempotent: a second call, or a call after someone else initialised
`torch.distributed`, returns the backend in use. On CPU it then removes the names of
DeepSpeed's shared-memory buffers (`shm_buffers.py`), which DeepSpeed itself leaves behind.
"""

from __future__ import annotations

import logging
import os
from datetime import timedelta

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
    if name == "nccl":
        torch.cuda.set_device(int(os.environ["LOCAL_RANK"]) % torch.cuda.device_count())
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
