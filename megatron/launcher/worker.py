"""Start-up of a worker: join the process group, size the CPU threads, build the topology.

Order (each step needs the previous): `setup_distributed_env` (rank from the launcher's
environment) → `init_distributed` (NCCL with CUDA, else gloo) → `ParallelTopology` (its
groups are collective). The worker then seeds every random stream
(`megatron/parallel/random.py::seed_everything`); the model must be built right after it and
before `model_parallel_seed`.
"""

from __future__ import annotations

import os

import torch
import torch.distributed as dist


def initialize_distributed(cfg):
    """Join (or reuse) the process group and build the `ParallelTopology`."""
    from megatron.config.ds_export import deepspeed_config
    from megatron.kernels.build_locks import watch_lock_waits
    from megatron.kernels.deepspeed_ops import announce_jit_builds
    from megatron.launcher import init_distributed, setup_distributed_env
    from megatron.launcher.distributed import refuse_node_local_storage
    from megatron.launcher.peers import record_peers
    from megatron.parallel import ParallelTopology

    if not (dist.is_available() and dist.is_initialized()):
        setup_distributed_env(cfg.launcher)
    # before DeepSpeed compiles an op it was installed without (the shm all-reduce on a CPU)
    announce_jit_builds(needs_cpu_adam=cfg.optimizer.optimizer_type == "CPU_Adam")
    watch_lock_waits()  # a wait on a build lock says so, naming the file
    init_distributed(
        cfg.parallel.distributed_backend,
        timeout_minutes=cfg.parallel.distributed_timeout_minutes,
    )
    refuse_node_local_storage(deepspeed_config(cfg))
    record_peers(os.environ.get("MASTER_ADDR", "127.0.0.1"))  # to name a rank that dies
    set_cpu_threads()
    return ParallelTopology.from_config(cfg)


def set_cpu_threads() -> int:
    """Without a GPU, share the CPU cores among the ranks of this machine (no oversubscription,
    which slows gloo ranks down many times over). Leaves an explicit OMP_NUM_THREADS alone."""
    if torch.cuda.is_available() or "OMP_NUM_THREADS" in os.environ:
        return torch.get_num_threads()
    local = int(os.environ.get("LOCAL_WORLD_SIZE") or os.environ.get("LOCAL_SIZE") or 0)
    if not local:
        local = dist.get_world_size() if dist.is_initialized() else 1
    threads = max(1, (os.cpu_count() or 1) // local)
    torch.set_num_threads(threads)
    return threads
