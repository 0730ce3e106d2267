"""Which host every rank runs on, so that a rank that loses a peer can say which one.

    record_peers()            # once per worker, right after the process group is up
    lost_peer_error(error)    # a LostPeerError naming the lost rank and host, or None

When a node dies (power, kernel, a kill of every process on it) its ranks' sockets close, and
a rank still waiting on them fails inside a collective with the backend's words, e.g. gloo's
`Read error [10.0.3.12]:17055: Connection reset by peer`, or after
`distributed_timeout_minutes` with a timeout. That is the cluster's situation, not a bug in
the trainer: the run stops with a message naming the rank and host it lost (from the table
`record_peers` gathered at start-up: each rank's host name and the address its peers reach
it at), and `latest` stays on the last complete checkpoint, which a relaunch resumes.
"""

from __future__ import annotations

import re
import socket
from dataclasses import dataclass

# Words of gloo's and NCCL's errors when a peer's process or node is gone.
_LOST = re.compile(
    r"Connection reset by peer|Connection closed by peer|Broken pipe|Connection refused|"
    r"Timed out waiting|timed out|remote process exited|NCCL communicator was aborted|"
    r"Socket Timeout|No route to host",
    re.IGNORECASE,
)
_ADDRESS = re.compile(r"\[([0-9a-fA-F.:]+)\]:\d+")


@dataclass(frozen=True)
class Peer:
    rank: int
    host: str
    address: str


class LostPeerError(RuntimeError):
    """A collective failed because another rank's process or node is gone."""


_peers: list[Peer] = []  # this worker's view of the world, filled once by record_peers
_me: list[int] = []  # this worker's rank, beside it


def _own_address(master_addr: str) -> str:
    """The address this host is reached at from rank 0's network (no packet is sent)."""
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
            probe.connect((master_addr, 9))
            return probe.getsockname()[0]
    except OSError:
        return socket.gethostbyname(socket.gethostname())


def record_peers(master_addr: str = "127.0.0.1") -> list[Peer]:
    """Collective: every rank's host and address, kept for `lost_peer_error`."""
    import torch.distributed as dist

    mine = (socket.gethostname(), _own_address(master_addr))
    everyone = [mine]
    if dist.is_initialized() and dist.get_world_size() > 1:
        everyone = [None] * dist.get_world_size()
        dist.all_gather_object(everyone, mine)
    _peers[:] = [Peer(rank, host, address) for rank, (host, address) in enumerate(everyone)]
    _me[:] = [dist.get_rank() if dist.is_initialized() else 0]
    return list(_peers)


def _from_a_collective(error: BaseException) -> bool:
    """Whether `error` came out of a `torch.distributed` call (its traceback passes there)."""
    tb = error.__traceback__
    while tb is not None:
        if "torch/distributed/" in tb.tb_frame.f_code.co_filename.replace("\\", "/"):
            return True
        tb = tb.tb_next
    return False


def _lost_in_a_collective(error: BaseException) -> BaseException | None:
    """`error`, or the error it was raised from (a failed checkpoint save wraps the broken
    barrier), when it is a backend's peer-loss error from a collective."""
    seen = 0
    while error is not None and seen < 8:
        if isinstance(error, RuntimeError) and _LOST.search(str(error)):
            if _from_a_collective(error):
                return error
        error, seen = error.__cause__ or error.__context__, seen + 1
    return None


def lost_peer_error(error: BaseException) -> LostPeerError | None:
    """`error` said as the loss of a peer (module docstring), or None when it is not one."""
    error = _lost_in_a_collective(error)
    if error is None:
        return None
    text = str(error)
    first = text.strip().splitlines()[0] if text.strip() else type(error).__name__
    addresses = set(_ADDRESS.findall(text))
    lost: dict[tuple[str, str], list[int]] = {}  # (host, address): ranks; an address is a node's
    for p in _peers:
        if p.address in addresses and p.rank not in _me:
            lost.setdefault((p.host, p.address), []).append(p.rank)
    if lost:
        who = "; ".join(
            f"rank{'s' if len(ranks) > 1 else ''} {', '.join(map(str, ranks))} on {host} "
            f"({address})"
            for (host, address), ranks in lost.items()
        )
        head = f"lost contact with {who}: a process or its node stopped"
    else:
        hosts = sorted({p.host for p in _peers})
        where = f" (ranks ran on {', '.join(hosts)})" if hosts else ""
        head = f"lost contact with another rank{where}: a process, a node or the network failed"
    return LostPeerError(
        f"{head}. The run stops; `latest` stays on the last complete checkpoint, which a "
        f"relaunch resumes. The backend said: {first}"
    )
