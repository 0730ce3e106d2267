"""Shared by the fake `srun` and `mpirun`: record the call, run N local tasks, wait for all.

Each fake appends `{"tool": ..., "argv": [...]}` to the JSON-lines file named by
$FAKE_LAUNCHER_LOG (when set), so tests can check the exact command line the DeepSpeed
runner built, then starts every task on this machine with the environment a real
scheduler would give it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys


def record(tool: str, argv: list[str]) -> None:
    log = os.environ.get("FAKE_LAUNCHER_LOG")
    if log:
        with open(log, "a", encoding="utf-8") as handle:
            handle.write(json.dumps({"tool": tool, "argv": argv}) + "\n")


def split_options(argv: list[str], takes_value: set[str], takes_two: set[str] = frozenset()):
    """Split `[options...] command...`; returns ({option: [values]}, command)."""
    options: dict[str, list[str]] = {}
    index = 0
    while index < len(argv) and argv[index].startswith("-"):
        arg = argv[index]
        if arg.startswith("--") and "=" in arg:
            key, value = arg.split("=", 1)
            options.setdefault(key, []).append(value)
            index += 1
        elif arg in takes_two:
            options.setdefault(arg, []).append(" ".join(argv[index + 1 : index + 3]))
            index += 3
        elif arg in takes_value:
            options.setdefault(arg, []).append(argv[index + 1])
            index += 2
        else:
            options.setdefault(arg, []).append("")
            index += 1
    if index == len(argv):
        sys.exit(f"{os.path.basename(sys.argv[0])}: no command to run")
    return options, argv[index:]


def run_tasks(command: list[str], envs: list[dict[str, str]]) -> int:
    """Start one process per environment; return 0 if all succeed, else the first failure."""
    procs = [subprocess.Popen(command, env=env) for env in envs]
    codes = [proc.wait() for proc in procs]
    return next((code for code in codes if code != 0), 0)
