"""SLURM's compressed host lists and task counts, expanded the way `scontrol show` does.

`expand_slurm_nodelist("node[01-03,07],gpu-a[1-2]")` gives
`["node01", "node02", "node03", "node07", "gpu-a1", "gpu-a2"]`: commas outside brackets
separate names, commas inside separate ranges, a range keeps the zero padding of its lower
bound, and several bracket groups in one name expand as a product (`r[1-2]n[1-2]` gives
r1n1, r1n2, r2n1, r2n2). `expand_slurm_tasks_per_node("2(x3),1")` gives `[2, 2, 2, 1]`.
"""

from __future__ import annotations

import itertools
import re

from megatron.launcher.errors import WorkerEnvironmentError

_RANGE_RE = re.compile(r"^(\d+)(?:-(\d+))?$")
_TASKS_RE = re.compile(r"^(\d+)(?:\(x(\d+)\))?$")


def expand_slurm_nodelist(nodelist: str, name: str = "SLURM_JOB_NODELIST") -> list[str]:
    """Expand a SLURM host list into host names, in order; `name` labels it in errors."""
    text = nodelist.strip()
    if not text:
        raise WorkerEnvironmentError(f"{name} is empty; expected host names like 'node[01-04]'")
    hosts: list[str] = []
    for item in _split_top_level(text, name):
        parts = _parse_item(item, text, name)  # each part: the list of its alternatives
        hosts.extend("".join(combo) for combo in itertools.product(*parts))
    return hosts


def expand_slurm_tasks_per_node(value: str, name: str = "SLURM_STEP_TASKS_PER_NODE") -> list[int]:
    """Expand SLURM's per-node task counts, e.g. `"2(x3),1"` -> `[2, 2, 2, 1]`."""
    counts: list[int] = []
    for item in value.strip().split(","):
        match = _TASKS_RE.match(item.strip())
        if not match:
            raise WorkerEnvironmentError(
                f"{name}={value!r}: {item!r} is not N or N(xR), e.g. '2(x3),1'"
            )
        counts.extend([int(match.group(1))] * int(match.group(2) or 1))
    return counts


def _split_top_level(text: str, name: str) -> list[str]:
    """Split on commas that are not inside brackets; check the brackets balance."""
    items, depth, start = [], 0, 0
    for index, char in enumerate(text):
        if char == "[":
            depth += 1
            if depth > 1:
                raise WorkerEnvironmentError(f"{name}={text!r}: nested '[' at position {index}")
        elif char == "]":
            depth -= 1
            if depth < 0:
                raise WorkerEnvironmentError(f"{name}={text!r}: ']' without '[' at {index}")
        elif char == "," and depth == 0:
            items.append(text[start:index])
            start = index + 1
    if depth:
        raise WorkerEnvironmentError(f"{name}={text!r}: '[' is never closed")
    items.append(text[start:])
    empty = [i for i in items if not i.strip()]
    if empty:
        raise WorkerEnvironmentError(f"{name}={text!r}: empty host name between commas")
    return [i.strip() for i in items]


def _parse_item(item: str, text: str, name: str) -> list[list[str]]:
    """Split one host pattern into literal parts and expanded bracket groups."""
    parts: list[list[str]] = []
    for literal, group in re.findall(r"([^\[\]]+)|\[([^\]]*)\]", item):
        parts.append([literal] if literal else _expand_group(group, text, name))
    return parts


def _expand_group(group: str, text: str, name: str) -> list[str]:
    values: list[str] = []
    for piece in group.split(","):
        match = _RANGE_RE.match(piece.strip())
        if not match:
            raise WorkerEnvironmentError(
                f"{name}={text!r}: [{group}] holds {piece!r}; expected N or N-M, e.g. [01-04,07]"
            )
        low_text, high_text = match.group(1), match.group(2) or match.group(1)
        low, high = int(low_text), int(high_text)
        if high < low:
            raise WorkerEnvironmentError(f"{name}={text!r}: range {piece!r} runs backwards")
        width = len(low_text)  # SLURM pads to the width of the lower bound: 01-10 -> 01..10
        values.extend(str(n).zfill(width) for n in range(low, high + 1))
    return values
