"""Hostfiles and include/exclude filters, checked before the DeepSpeed runner sees them.

A hostfile lists one host per line, `NAME slots=N` (N workers on that host), with `#`
comments. An include/exclude filter is `NODE_SPEC[@NODE_SPEC...]`, where
`NODE_SPEC = NAME[:SLOT[,SLOT...]]` (no slots: the whole host). The resolution mirrors
DeepSpeed 0.19.8's runner (`parse_resource_filter`, `apply_num_nodes_and_gpus`) so the
world size computed here is the one the runner will start, but every mistake is reported
with the file, line or key instead of a bare `ValueError` after launch.
"""

from __future__ import annotations

import os
import re
from collections import OrderedDict

from megatron.launcher.errors import HostfileError, LauncherError

# DeepSpeed's runner reads this when `--hostfile` is not given (DLTS clusters).
DEFAULT_HOSTFILE = "/job/hostfile"

_HOST_RE = re.compile(r"^[A-Za-z0-9_.:-]+$")
_SLOTS_RE = re.compile(r"^slots=(\d+)$")
_OPTION_RE = re.compile(r"^[A-Za-z_]+=\S+$")  # e.g. OpenMPI's max_slots=8, ignored here


def parse_hostfile_text(text: str, source: str = "<hostfile>") -> OrderedDict[str, int]:
    """Parse hostfile text into {host: slots}, in file order; `source` names it in errors."""
    pool: OrderedDict[str, int] = OrderedDict()
    first_line: dict[str, int] = {}
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        where = f"hostfile {source}, line {number} ({raw.strip()!r})"
        host, *options = line.split()
        if not _HOST_RE.match(host) or host.startswith("slots="):
            raise HostfileError(f"{where}: expected 'HOSTNAME slots=N', got host {host!r}")
        slots = [m.group(1) for m in map(_SLOTS_RE.match, options) if m]
        others = [o for o in options if not _SLOTS_RE.match(o)]
        if len(slots) != 1:
            raise HostfileError(f"{where}: expected exactly one 'slots=N' after the host name")
        bad = [o for o in others if not _OPTION_RE.match(o)]
        if bad:
            raise HostfileError(f"{where}: unexpected {bad[0]!r}; expected 'HOSTNAME slots=N'")
        if int(slots[0]) < 1:
            raise HostfileError(f"{where}: slots must be at least 1")
        if host in pool:
            raise HostfileError(
                f"{where}: host {host!r} is already listed on line {first_line[host]}; "
                "list each host once"
            )
        pool[host] = int(slots[0])
        first_line[host] = number
    if not pool:
        raise HostfileError(f"hostfile {source} lists no hosts; expected lines 'HOSTNAME slots=N'")
    return pool


def read_hostfile(path: str) -> OrderedDict[str, int]:
    """Read and parse a hostfile; a missing file is an error (DeepSpeed would go local)."""
    if not os.path.isfile(path):
        raise HostfileError(
            f"hostfile: {path!r} does not exist (or is not a file); write one 'HOSTNAME slots=N' "
            "line per node, or leave hostfile unset to run on this machine only"
        )
    with open(path, encoding="utf-8") as handle:
        return parse_hostfile_text(handle.read(), source=path)


def format_hostfile(pool: dict[str, int]) -> str:
    """The hostfile text for {host: slots}."""
    return "".join(f"{host} slots={slots}\n" for host, slots in pool.items())


def parse_resource_filter(text: str, key: str = "include") -> OrderedDict[str, list[int]]:
    """Parse `NAME[:SLOT[,SLOT...]][@...]` into {host: sorted slots} ([] = the whole host).

    `key` (include or exclude) names the setting in errors.
    """
    result: OrderedDict[str, list[int]] = OrderedDict()
    example = "e.g. 'worker-0:0,1@worker-1'"
    for spec in text.split("@"):
        where = f"{key}: {text!r}"
        if not spec.strip():
            raise LauncherError(f"{where} has an empty host between '@' separators; {example}")
        host, sep, slot_text = spec.strip().partition(":")
        if not _HOST_RE.match(host) or ":" in slot_text:
            raise LauncherError(f"{where}: {spec!r} is not NAME or NAME:SLOT[,SLOT...]; {example}")
        slots = set(result.get(host, []))
        if sep:
            for item in slot_text.split(","):
                if not item.strip().isdigit():
                    raise LauncherError(
                        f"{where}: slot {item!r} of host {host!r} is not a non-negative "
                        f"integer; {example}"
                    )
                slots.add(int(item))
        result[host] = sorted(slots)
    return result


def apply_resource_filter(
    pool: dict[str, int], include: str | None, exclude: str | None, *, source: str
) -> OrderedDict[str, list[int]]:
    """Apply include/exclude to {host: slots}; return {host: [slot ids]} in pool order.

    `source` names where the pool came from (the hostfile path, or "this machine").
    """
    resources = OrderedDict((host, list(range(n))) for host, n in pool.items())
    key, text = ("include", include) if include else ("exclude", exclude)
    if not text:
        return resources
    chosen = parse_resource_filter(text, key)
    for host, slots in chosen.items():
        if host not in pool:
            raise LauncherError(
                f"{key}: host {host!r} is not in {source}; known hosts: {', '.join(pool)}"
            )
        missing = [s for s in slots if s >= pool[host]]
        if missing:
            raise LauncherError(
                f"{key}: slot {missing[0]} of host {host!r} does not exist; {source} gives "
                f"it slots 0-{pool[host] - 1}"
            )
    if key == "include":
        kept = OrderedDict((h, chosen[h] or resources[h]) for h in resources if h in chosen)
    else:
        kept = OrderedDict(
            (h, [s for s in resources[h] if chosen.get(h) and s not in chosen[h]])
            if h in chosen
            else (h, resources[h])
            for h in resources
        )
    kept = OrderedDict((h, s) for h, s in kept.items() if s)
    if not kept:
        raise LauncherError(f"{key}: {text!r} leaves no hosts to run on (from {source})")
    return kept


def trim_resources(
    resources: OrderedDict[str, list[int]],
    num_nodes: int,
    num_gpus: int | None,
    *,
    source: str | None = None,
) -> OrderedDict[str, list[int]]:
    """Keep the first `num_nodes` hosts (-1: all) and `num_gpus` slots each (None: all).

    Like the runner, `num_gpus` sets the slot count per host to exactly N (ids 0..N-1).
    With `source` (where the slots came from), asking for more slots than a host has is an
    error; without it (CPU ranks on this machine) any N is allowed.
    """
    if num_nodes > 0:
        if num_nodes > len(resources):
            raise LauncherError(
                f"num_nodes: {num_nodes} but only {len(resources)} host(s) are available "
                f"({', '.join(resources)})"
            )
        resources = OrderedDict(list(resources.items())[:num_nodes])
    if num_gpus is not None:
        short = [(h, len(s)) for h, s in resources.items() if len(s) < num_gpus]
        if source is not None and short:
            host, have = short[0]
            raise LauncherError(
                f"num_gpus: {num_gpus} but host {host!r} has only {have} slot(s) in {source}"
            )
        resources = OrderedDict((host, list(range(num_gpus))) for host in resources)
    return resources
