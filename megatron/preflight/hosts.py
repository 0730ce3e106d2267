"""Pre-flight report of the hostfile: its hosts parse and `include`/`exclude` name hosts in it.

The hostfile is on the launching machine (the DeepSpeed runner reads it there), so this check
runs with `preflight_shared_fs: false` too. `deepy.py` already reads the hostfile while
resolving the config (the world size the batch sizes derive from depends on it), so a
malformed line, a missing file or an unknown host in `include`/`exclude` refuses the launch
there, with the same exit status; here the hosts the launch will use are reported, and the
launcher's own parser decides what is valid (one definition of a hostfile).
"""

from __future__ import annotations

from megatron.config import Config
from megatron.launcher.errors import LauncherError
from megatron.launcher.hostfile import apply_resource_filter, read_hostfile
from megatron.preflight.findings import ERROR, OK, Finding, register

NAME = "hostfile"


def _slots(slots: list[int]) -> str:
    if slots == list(range(slots[0], slots[-1] + 1)):
        return f"slots {slots[0]}-{slots[-1]}" if len(slots) > 1 else f"slot {slots[0]}"
    return "slots " + ",".join(map(str, slots))


@register(NAME, reads_worker_files=False)
def check_hostfile(cfg: Config, script: str) -> list[Finding]:
    """The hostfile parses and include/exclude select hosts it lists (no hostfile: nothing)."""
    launcher = cfg.launcher
    if not launcher.hostfile:
        return []
    source = f"hostfile {launcher.hostfile}"
    try:
        pool = read_hostfile(launcher.hostfile)
        chosen = apply_resource_filter(pool, launcher.include, launcher.exclude, source=source)
    except LauncherError as err:
        return [Finding(NAME, ERROR, str(err))]
    hosts = ", ".join(f"{host} ({_slots(slots)})" for host, slots in chosen.items())
    left_out = [host for host in pool if host not in chosen]
    skipped = f"; left out: {', '.join(left_out)}" if left_out else ""
    return [Finding(NAME, OK, f"{source}: {len(pool)} host(s); using {hosts}{skipped}")]
