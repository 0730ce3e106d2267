"""Which hosts and slots a launch will use, resolved the way DeepSpeed 0.19.8's runner does.

The runner (deepspeed/launcher/runner.py) builds a resource pool from the hostfile (or, with
no hostfile, `{"localhost": <accelerator count>}`), applies include/exclude, then keeps the
first `num_nodes` hosts and `num_gpus` slots per host. With more than one host left, or
`--force_multi`, it starts the multi-node backend (pdsh/srun/mpirun); otherwise it runs
`deepspeed.launcher.launch` locally, which starts one process per slot and sets RANK,
LOCAL_RANK, WORLD_SIZE, MASTER_ADDR (127.0.0.1) and MASTER_PORT.

On a machine without GPUs DeepSpeed's CPU accelerator counts NUMA nodes instead; this
module makes that explicit: no hostfile, no GPU and no `num_gpus` means one CPU rank.
"""

from __future__ import annotations

import logging
import os
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass

from megatron.launcher.errors import LauncherError
from megatron.launcher.hostfile import (
    DEFAULT_HOSTFILE,
    apply_resource_filter,
    format_hostfile,
    read_hostfile,
    trim_resources,
)
from megatron.launcher.nodelist import expand_slurm_nodelist
from megatron.launcher.nossh import NoSshNode, expected_node_count, host_names, read_node
from megatron.launcher.settings import LauncherSettings

logger = logging.getLogger(__name__)

LOCAL_SOURCE = "this machine"


@dataclass(frozen=True)
class LaunchResources:
    """The resolved launch: hosts, slots per host and how the runner will start them."""

    settings: LauncherSettings
    hostfile: str | None
    """The hostfile the runner reads (absolute), or None for this machine only."""
    resources: OrderedDict[str, list[int]]
    """{host: slot ids} after include/exclude/num_nodes/num_gpus."""
    num_gpus: int | None
    """The `--num_gpus` value to pass (None: leave it to the hostfile or the GPU count)."""
    multi_node: bool
    """True: the runner uses the multi-node backend; False: a local launch.py."""
    hostfile_text: str | None = None
    """A hostfile to write and pass to the runner (SLURM allocation, or `no_ssh` nodes, without
    a hostfile)."""
    node: NoSshNode | None = None
    """With `no_ssh: true`: this node's rank and the rendezvous (multi_node is then False: the
    runner starts this node's ranks with a local launch.py)."""

    @property
    def world_size(self) -> int:
        """The number of worker processes the launch starts."""
        return sum(len(slots) for slots in self.resources.values())

    @property
    def hosts(self) -> list[str]:
        return list(self.resources)


def resolve_hostfile(settings: LauncherSettings) -> str | None:
    """The hostfile the runner will read: `hostfile`, else DeepSpeed's /job/hostfile if any."""
    if settings.hostfile is not None:
        return os.path.abspath(os.path.expanduser(settings.hostfile))
    return DEFAULT_HOSTFILE if os.path.isfile(DEFAULT_HOSTFILE) else None


def local_device_count() -> int:
    """GPUs visible on this machine (0 without CUDA)."""
    import torch  # deferred: the launcher CLI should not pay for torch unless needed

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def plan_resources(
    launcher: object,
    *,
    device_count: int | None = None,
    environ: Mapping[str, str] | None = None,
) -> LaunchResources:
    """Resolve `launcher` (cfg.launcher or LauncherSettings) into the hosts and slots used.

    `device_count` is the number of GPUs on this machine (None: ask torch); it only matters
    without a hostfile. With `environ` (the launching environment), `launcher: slurm` and
    no hostfile inside a multi-node SLURM allocation use the allocation's nodes
    (`slurm_allocation_pool`) and set `hostfile_text` for `prepare_launch` to write.
    With `no_ssh: true`, this node's place comes from `environ` (None: `os.environ`); see
    megatron.launcher.nossh.
    """
    settings = LauncherSettings.from_config(launcher)
    hostfile = resolve_hostfile(settings)
    num_gpus = settings.num_gpus
    if settings.include or settings.exclude:
        if settings.num_nodes > 0:
            raise LauncherError(
                f"num_nodes: {settings.num_nodes} cannot be combined with include/exclude "
                "(the runner rejects it); pick hosts with include/exclude only"
            )
        if num_gpus is not None:
            logger.warning(
                "num_gpus: %s is ignored because include/exclude already selects the slots",
                num_gpus,
            )
            num_gpus = None
    if settings.is_mpi:
        _check_mpi(settings, hostfile)

    if settings.no_ssh and environ is None:
        environ = os.environ
    hostfile_text = None
    slurm_pool = None
    if hostfile is None and settings.launcher == "slurm" and environ is not None:
        slurm_pool = slurm_allocation_pool(settings, environ, device_count)
    if hostfile is not None:
        pool, source = read_hostfile(hostfile), f"hostfile {hostfile}"
        check_source: str | None = source
    elif slurm_pool is not None:
        pool, source = slurm_pool, "the SLURM allocation (SLURM_JOB_NODELIST)"
        check_source = source
        hostfile_text = format_hostfile(pool)
    else:
        local = _local_pool(settings, num_gpus, device_count, environ)
        pool, source, check_source, num_gpus = local
        if settings.no_ssh:
            hostfile_text = format_hostfile(pool)
    resources = apply_resource_filter(pool, settings.include, settings.exclude, source=source)
    resources = trim_resources(resources, settings.num_nodes, num_gpus, source=check_source)
    if settings.launcher == "slurm" and _counted_devices(device_count) == 0:
        # CPU ranks: DeepSpeed's SLURM runner turns --num_gpus into `srun --gpus-per-node`,
        # which a CPU allocation refuses; the ranks per node travel as hostfile slots instead.
        if hostfile is None and hostfile_text is None:
            hostfile_text = format_hostfile({h: len(s) for h, s in resources.items()})
        num_gpus = None
    node = read_node(settings, environ, len(resources), source) if settings.no_ssh else None
    forced = settings.force_multi or settings.launcher != "pdsh"
    return LaunchResources(
        settings=settings,
        hostfile=hostfile,
        resources=resources,
        num_gpus=num_gpus,
        multi_node=node is None and (forced or len(resources) > 1),
        hostfile_text=hostfile_text,
        node=node,
    )


def _local_pool(
    settings: LauncherSettings,
    num_gpus: int | None,
    device_count: int | None,
    environ: Mapping[str, str] | None,
) -> tuple[OrderedDict[str, int], str, str | None, int | None]:
    """Without a hostfile: this machine, or with `no_ssh` NNODES nodes alike.

    Returns the pool, its name for errors, the name when slots must be checked against it
    (None for CPU ranks: any number is fine) and the `num_gpus` to apply.
    """
    if settings.num_nodes > 1 and not settings.no_ssh:
        raise LauncherError(
            f"num_nodes: {settings.num_nodes} needs a hostfile listing the nodes; "
            "without one the runner only uses this machine"
        )
    count = local_device_count() if device_count is None else device_count
    if count == 0 and num_gpus is None and not settings.include:
        num_gpus = 1  # one CPU rank by default, whatever the NUMA layout
    hosts, source = ["localhost"], LOCAL_SOURCE
    if settings.no_ssh:
        nnodes = expected_node_count(settings, environ or {}, required=True)
        hosts = host_names(nnodes)
        source = f"{nnodes} no_ssh node(s) like {LOCAL_SOURCE}"
    slots = count or num_gpus or 1  # CPU ranks: as many as asked (the no_ssh hostfile says so)
    pool = OrderedDict((host, slots) for host in hosts)
    return pool, source, source if count > 0 else None, num_gpus


def _counted_devices(device_count: int | None) -> int:
    return local_device_count() if device_count is None else device_count


def slurm_allocation_pool(
    settings: LauncherSettings, environ: Mapping[str, str], device_count: int | None
) -> OrderedDict[str, int] | None:
    """{node: slots} of the SLURM allocation deepy.py runs in, or None outside one.

    DeepSpeed's runner without a hostfile only knows this machine (`srun -n <local GPUs>`),
    so inside a multi-node allocation the nodes come from SLURM_JOB_NODELIST. Slots per
    node: `num_gpus`, else SLURM_GPUS_ON_NODE, else SLURM_NTASKS_PER_NODE, else this
    machine's GPU count, else 1.
    """
    nodelist = environ.get("SLURM_JOB_NODELIST") or environ.get("SLURM_NODELIST")
    if not nodelist:
        return None
    nodes = expand_slurm_nodelist(nodelist)
    if len(nodes) < 2:
        return None  # one node: the runner's local pool is the same machine
    slots = settings.num_gpus
    for name in ("SLURM_GPUS_ON_NODE", "SLURM_NTASKS_PER_NODE"):
        if slots is None and environ.get(name, "").isdigit() and int(environ[name]) > 0:
            slots = int(environ[name])
    if slots is None:
        slots = (local_device_count() if device_count is None else device_count) or 1
    return OrderedDict((node, slots) for node in nodes)


def planned_world_size(
    launcher: object,
    *,
    device_count: int | None = None,
    environ: Mapping[str, str] | None = None,
) -> int:
    """The number of worker processes `launcher` will start (for the config's world size).

    `environ` (default `os.environ`, as for `prepare_launch`) is where a multi-node SLURM
    allocation is looked up for `launcher: slurm` without a hostfile.
    """
    environ = os.environ if environ is None else environ
    return plan_resources(launcher, device_count=device_count, environ=environ).world_size


def _check_mpi(settings: LauncherSettings, hostfile: str | None) -> None:
    """MPI backends size the job from the hostfile alone (the runner rejects the rest)."""
    for key in ("include", "exclude"):
        if getattr(settings, key):
            raise LauncherError(
                f"{key}: launcher {settings.launcher} cannot select hosts or slots; edit "
                "the hostfile instead"
            )
    if settings.num_nodes != -1 or settings.num_gpus is not None:
        raise LauncherError(
            f"num_nodes/num_gpus: launcher {settings.launcher} runs one process per hostfile "
            "slot and cannot limit nodes or GPUs; leave them unset and edit the hostfile"
        )
    if hostfile is None:
        raise LauncherError(
            f"launcher: {settings.launcher} needs a hostfile ('HOSTNAME slots=N' per node) "
            "to know where to start processes; set hostfile"
        )
