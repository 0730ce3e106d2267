"""Launching without ssh (`no_ssh: true`): each node runs `deepy.py` and finds its place itself.

Kubernetes pods and many clusters cannot ssh to each other, so no head node can start the
others. Instead the same `deepy.py` command runs on every node, torchrun-style, and each
reads from its environment:

* its node rank: NODE_RANK, else JOB_COMPLETION_INDEX (which a Kubernetes Indexed Job gives
  every pod); NODE_RANK wins when both are set, so a pod spec can override the index; else,
  as one task per node of a SLURM step (`srun --ntasks-per-node=1 python deepy.py ...`), this
  node's place in SLURM_STEP_NODELIST;
* the node count: NNODES, else the `num_nodes` setting (both set: they must agree), else the
  SLURM step's SLURM_STEP_NUM_NODES; with a `hostfile`, the nodes it lists (after
  num_nodes/include/exclude), which NNODES must match;
* rank 0's address: MASTER_ADDR, else `master_addr`, else the SLURM step's first node (a
  one-node run may leave all unset: 127.0.0.1);
* the rendezvous port: MASTER_PORT, else `master_port` (its default 29500 when unset). A
  one-machine run's free-port choice does not apply: every node must name the same port.

Every node computes the same world (NNODES nodes of `num_gpus` slots, else of this node's GPU
count) and gives it to DeepSpeed 0.19.8's runner as a hostfile with `--no_ssh --node_rank R`;
the runner then starts DeepSpeed's launch.py on this node only, which gives the local ranks
the global ranks R * slots ... (R + 1) * slots - 1 (deepspeed/launcher/launch.py). The runner
needs `--master_addr` here, or it would ssh to the first host to ask its address.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from megatron.launcher.errors import LauncherError
from megatron.launcher.nodelist import expand_slurm_nodelist
from megatron.launcher.settings import LauncherSettings

NODE_RANK_VARS = ("NODE_RANK", "JOB_COMPLETION_INDEX")  # the first one set is used
NNODES_VAR = "NNODES"
MASTER_ADDR_VAR = "MASTER_ADDR"
MASTER_PORT_VAR = "MASTER_PORT"
LOCALHOST = "127.0.0.1"
SLURM_STEP = "the SLURM step"  # where the values came from, inside `srun`


@dataclass(frozen=True)
class SlurmStep:
    """This task's node in a SLURM step that runs one `deepy.py` per node."""

    node_rank: int
    nnodes: int
    first_node: str


def slurm_step(environ: Mapping[str, str]) -> SlurmStep | None:
    """The SLURM step this process is a task of (None outside `srun`: a batch script's own
    environment has no SLURM_STEP_ID, and must not pass for node 0 of a launch)."""
    if not environ.get("SLURM_STEP_ID", "").strip():
        return None
    nodes = expand_slurm_nodelist(environ.get("SLURM_STEP_NODELIST", ""), "SLURM_STEP_NODELIST")
    tasks = environ.get("SLURM_STEP_NUM_TASKS", "").strip()
    if tasks != str(len(nodes)):
        raise LauncherError(
            f"no_ssh: true inside srun needs one deepy.py per node, but this step runs {tasks} "
            f"task(s) on {len(nodes)} node(s); use srun --ntasks-per-node=1 (deepy.py then "
            "starts each node's ranks)"
        )
    name = environ.get("SLURMD_NODENAME", "").strip()
    if name not in nodes:
        raise LauncherError(
            f"no_ssh: SLURMD_NODENAME={name!r} is not in SLURM_STEP_NODELIST ({', '.join(nodes)})"
        )
    return SlurmStep(nodes.index(name), len(nodes), nodes[0])


@dataclass(frozen=True)
class NoSshNode:
    """This node's place in a launch without ssh, and where each value came from."""

    node_rank: int
    nnodes: int
    master_addr: str
    master_port: int
    rank_from: str
    """The variable that gave `node_rank` (NODE_RANK or JOB_COMPLETION_INDEX)."""
    addr_from: str
    """MASTER_ADDR, `master_addr`, or "one node" (127.0.0.1)."""
    port_from: str
    """MASTER_PORT or `master_port`."""

    def describe(self) -> str:
        """For the console: the node, rank 0's address, and where each value came from."""
        return (
            f"node {self.node_rank} of {self.nnodes} from {self.rank_from}; master "
            f"{self.master_addr} from {self.addr_from}, port from {self.port_from}"
        )


def host_names(nnodes: int) -> list[str]:
    """Host names for the runner's hostfile; only their order matters (launch.py's node ids)."""
    return [f"node-{index}" for index in range(nnodes)]


def _int_var(environ: Mapping[str, str], name: str, valid: str) -> int | None:
    text = environ.get(name, "").strip()
    if not text:
        return None
    try:
        return int(text)
    except ValueError:
        message = f"no_ssh: {name}={environ[name]!r} is not an integer; {valid}"
        raise LauncherError(message) from None


def expected_node_count(
    settings: LauncherSettings, environ: Mapping[str, str], *, required: bool
) -> int | None:
    """The node count from NNODES or `num_nodes` (None: neither set and not `required`)."""
    nnodes = _int_var(environ, NNODES_VAR, "set it to the number of nodes (>= 1)")
    if nnodes is not None and nnodes < 1:
        raise LauncherError(f"no_ssh: {NNODES_VAR}={nnodes} is invalid; the node count is >= 1")
    configured = settings.num_nodes if settings.num_nodes > 0 else None
    if nnodes is not None and configured is not None and nnodes != configured:
        raise LauncherError(
            f"no_ssh: {NNODES_VAR}={nnodes} but num_nodes: {configured}; they must agree "
            f"(leave num_nodes unset to take {NNODES_VAR})"
        )
    count = nnodes if nnodes is not None else configured
    step = slurm_step(environ) if count is None else None
    if step is not None:
        count = step.nnodes
    if count is None and required:
        raise LauncherError(
            f"no_ssh: true needs the node count: set {NNODES_VAR} (the same on every node) "
            "or num_nodes, or give a hostfile listing the nodes"
        )
    return count


def read_node(
    settings: LauncherSettings, environ: Mapping[str, str], nnodes: int, nodes_from: str
) -> NoSshNode:
    """This node's rank and the rendezvous, checked against the `nnodes` the plan holds.

    `nodes_from` names where `nnodes` came from, for the error when NNODES disagrees.
    """
    declared = expected_node_count(settings, environ, required=False)
    if declared is not None and declared != nnodes:
        raise LauncherError(
            f"no_ssh: {NNODES_VAR}/num_nodes say {declared} node(s) but {nodes_from} gives "
            f"{nnodes}; make them agree"
        )
    valid = f"valid node ranks are 0-{nnodes - 1} ({NNODES_VAR}={nnodes})"
    rank_from = next((n for n in NODE_RANK_VARS if environ.get(n, "").strip()), None)
    step = slurm_step(environ)
    if rank_from is None and step is None:
        raise LauncherError(
            f"no_ssh: true needs this node's rank: set NODE_RANK ({valid}), run as a "
            "Kubernetes Indexed Job, which sets JOB_COMPLETION_INDEX, or as one task per node "
            "of srun (srun --ntasks-per-node=1)"
        )
    if rank_from is None:
        node_rank, rank_from = step.node_rank, SLURM_STEP
    else:
        node_rank = _int_var(environ, rank_from, valid)
    if not 0 <= node_rank < nnodes:
        raise LauncherError(f"no_ssh: {rank_from}={node_rank} is out of range; {valid}")
    addr, addr_from = environ.get(MASTER_ADDR_VAR, "").strip(), MASTER_ADDR_VAR
    if not addr:
        addr, addr_from = settings.master_addr or "", "master_addr"
    if not addr and step is not None:
        addr, addr_from = step.first_node, SLURM_STEP
    if not addr and nnodes == 1:
        addr, addr_from = LOCALHOST, "one node"
    if not addr:
        raise LauncherError(
            f"no_ssh: true on {nnodes} nodes needs rank 0's address: set {MASTER_ADDR_VAR} "
            "(the host or IP of node 0, the same on every node) or master_addr"
        )
    port, port_from = _port(settings, environ)
    return NoSshNode(node_rank, nnodes, addr, port, rank_from, addr_from, port_from)


def _port(settings: LauncherSettings, environ: Mapping[str, str]) -> tuple[int, str]:
    port = _int_var(environ, MASTER_PORT_VAR, "set a TCP port (1-65535), the same on every node")
    if port is None:
        return settings.master_port, "master_port"
    if not 1 <= port <= 65535:
        raise LauncherError(f"no_ssh: {MASTER_PORT_VAR}={port} is not a TCP port (1-65535)")
    return port, MASTER_PORT_VAR
