"""The rendezvous port of a launch, so that two runs on one machine do not collide.

A local launch (one machine, DeepSpeed's `launch.py`, rank 0 listening on this machine) whose
config does not set `master_port` gets a free port from the operating system instead of the
default 29500, which a second run would find taken (EADDRINUSE). A `master_port` the config
sets is kept, and refused before launch if something on this machine already listens on it.
Multi-node launches keep the configured port: rank 0 listens on another host, which cannot be
probed from here. A `no_ssh` node takes MASTER_PORT, else `master_port` (set or its default),
never a free port, since every node must name the same one; node 0, where rank 0 listens,
refuses it when taken.
"""

from __future__ import annotations

import errno
import socket
from collections.abc import Mapping

from megatron.launcher.errors import LauncherError
from megatron.launcher.plan import plan_resources


def free_port() -> int:
    """A TCP port nothing listens on now (the kernel's choice)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("", 0))
        return sock.getsockname()[1]


def port_in_use(port: int) -> bool:
    """Whether binding `port` on every interface fails because someone holds it.

    SO_REUSEADDR, as torch's TCPStore sets it: a port left in TIME_WAIT by a finished run is
    free, one with a listener is not.
    """
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("", port))
        except OSError as err:
            if err.errno == errno.EADDRINUSE:
                return True
            raise
    return False


def choose_master_port(
    launcher: object,
    *,
    set_in: str | None,
    device_count: int | None = None,
    environ: Mapping[str, str] | None = None,
) -> int:
    """The `master_port` to launch with.

    Args:
        launcher: `cfg.launcher` (or anything `plan_resources` takes).
        set_in: where the config set `master_port` (a file or `--set`), None if it did not.
        device_count, environ: as for `plan_resources`.

    Raises:
        LauncherError: a port the config sets is already in use on this machine.
    """
    resources = plan_resources(launcher, device_count=device_count, environ=environ)
    port = resources.settings.master_port
    node = resources.node
    if node is not None:
        if node.node_rank != 0:
            return node.master_port  # rank 0 listens on node 0: nothing to probe here
        where = f"set in {set_in}" if set_in else "the default"
        if node.port_from != "master_port":
            where = f"from the {node.port_from} variable"
        hint = "choose another, the same on every node (no_ssh never picks a free port)"
        return _refuse_if_taken(node.master_port, where, hint)
    if resources.multi_node:
        return port
    if set_in is None:
        return free_port()
    hint = "choose another port, or leave master_port unset and a free one is picked"
    return _refuse_if_taken(port, f"set in {set_in}", hint)


def _refuse_if_taken(port: int, where: str, hint: str) -> int:
    """`port`, unless something on this machine listens on it (LauncherError naming `where`)."""
    try:
        taken = port_in_use(port)
    except OSError as err:
        raise LauncherError(
            f"master_port: {port} ({where}) cannot be listened on here ({err.strerror})"
        ) from err
    if taken:
        raise LauncherError(
            f"master_port: {port} ({where}) is already in use on this machine, probably by "
            f"another run; {hint}"
        )
    return port
