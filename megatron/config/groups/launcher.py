"""How `deepy.py` starts the workers (`cfg.launcher`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal


@dataclass(frozen=True)
class LauncherConfig:
    launcher: Literal["pdsh", "openmpi", "mvapich", "mpich", "impi", "slurm", "jsrun"] = "pdsh"
    """Multi-node backend of the DeepSpeed runner (case-insensitive). `jsrun` (LSF) is GPT-NeoX
    vocabulary that DeepSpeed's runner has no backend for: refused before launch."""

    deepspeed_slurm: bool = False
    """Workers take rank, world size and master address from SLURM's environment."""

    deepspeed_mpi: bool = False
    """Workers take rank and world size from the MPI environment (OpenMPI, MPICH, MVAPICH)."""

    hostfile: str | None = None
    """DeepSpeed hostfile (`host slots=N` per line); null: the local machine only."""

    include: str | None = None
    """Hosts/devices to use, e.g. `worker-0:0,1@worker-1`."""

    exclude: str | None = None
    """Hosts/devices to leave out, same syntax as `include`."""

    num_nodes: int = -1
    """Nodes to use from the hostfile (-1: all)."""

    num_gpus: int | None = None
    """Workers per node; null: every GPU, or 1 CPU rank on a machine without GPUs."""

    master_port: int = 29500
    """Rendezvous port."""

    master_addr: str | None = None
    """Rendezvous address of rank 0; null: 127.0.0.1 locally, else the first host."""

    force_multi: bool = False
    """Use the multi-node launcher even for one node."""

    comment: str | None = None
    """SLURM job comment passed to srun."""

    account: str | None = None
    """SLURM account passed to srun."""

    no_ssh_check: bool = False
    """Skip the runner's ssh reachability check of the hosts."""

    no_ssh: bool = False
    """Launch without ssh (Kubernetes, clusters that forbid it): run the same `deepy.py` command
    on every node; each starts its own ranks with DeepSpeed's `--no_ssh`, taking its node rank
    from NODE_RANK (else JOB_COMPLETION_INDEX, as a Kubernetes Indexed Job sets), the node count
    from NNODES (else `num_nodes`), the rendezvous from MASTER_ADDR (else `master_addr`) and
    MASTER_PORT (else `master_port`, never a free port: every node must agree). Slots per node:
    `num_gpus`, else this node's GPUs. Only with `launcher: pdsh` and no `force_multi` or
    `launcher_args`."""

    launcher_args: str | None = None
    """Extra arguments for pdsh/srun/mpirun, passed through the runner's `--launcher_args`."""

    preflight_shared_fs: bool = True
    """Pre-flight checks read the files the workers will read (datasets, tokenizer files, the
    checkpoint in `load`, free space in `save`) on the launching machine. Set false when that
    machine does not see the workers' file system (some multi-node clusters): those checks are
    then skipped, and `deepy.py` says so."""
