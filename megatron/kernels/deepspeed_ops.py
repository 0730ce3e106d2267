"""The DeepSpeed ops this trainer loads, built once at install time instead of in every worker.

DeepSpeed compiles an op the first time a process needs it (torch's JIT extension builder)
unless the op was built when DeepSpeed was installed (`DS_BUILD_<OP>=1`), in which case it
imports the installed library. On a CPU, every run needs `deepspeed_shm_comm` (DeepSpeed's
shared-memory all-reduce, about 80 s to compile); `optimizer.type: CPU_Adam` needs `cpu_adam`
on any machine. A JIT build also holds a lock file in the extension folder, which a killed
build leaves behind (see `megatron/preflight/build_locks.py`).

    python tools/build_deepspeed_ops.py     # the install step: reinstalls DeepSpeed, ops built

`missing_ops` says which of them the installed DeepSpeed lacks; `announce_jit_builds` is what
a worker logs, before DeepSpeed starts such a build, so nobody waits on a silent compile.
`choose_accelerator` tells DeepSpeed the device before its first import in a process that is
not a worker (deepy.py, the checkpoint tools), so it does not guess and warn.
"""

from __future__ import annotations

import logging
import os
import sys

logger = logging.getLogger(__name__)

BUILD_COMMAND = "python tools/build_deepspeed_ops.py"
# op name -> the environment variable that makes DeepSpeed's setup.py build it
BUILD_VARS = {"deepspeed_shm_comm": "DS_BUILD_SHM_COMM", "cpu_adam": "DS_BUILD_CPU_ADAM"}
OPS_BY_ACCELERATOR = {"cpu": ("deepspeed_shm_comm", "cpu_adam"), "cuda": ("cpu_adam",)}


def accelerator() -> str:
    """The DeepSpeed accelerator of this machine: `DS_ACCELERATOR`, else cuda or cpu."""
    chosen = os.environ.get("DS_ACCELERATOR", "").strip()
    if chosen:
        return chosen
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def choose_accelerator() -> str:
    """Make DeepSpeed's accelerator this machine's (`accelerator()`) before DeepSpeed's first
    import in this process; return it.

    Left to guess, DeepSpeed probes at import and on a machine without a GPU warns "Setting
    accelerator to CPU. If you have GPU or other accelerator, we were unable to detect it." in
    every command that imports it (deepy.py's pre-flight, the checkpoint tools), although the
    CPU is what we run on. On a CPU the import here runs with `DS_ACCELERATOR=cpu`, DeepSpeed's
    own override, which it takes silently (its INFO line says so). The variable is set for that
    import only: deepy.py's environment reaches workers that may run on GPU nodes (srun and
    MPICH pass all of it), which choose for themselves (`megatron/launcher/launch.py` sets it
    for a local launch on a machine without a GPU). Nothing to do on a GPU (DeepSpeed finds
    CUDA without a word), when the variable is set already, or after DeepSpeed's import."""
    kind = accelerator()
    if kind != "cpu" or "DS_ACCELERATOR" in os.environ or "deepspeed" in sys.modules:
        return kind
    os.environ["DS_ACCELERATOR"] = kind
    try:
        from deepspeed.accelerator import get_accelerator

        get_accelerator()  # chosen now, once for the process
    finally:
        del os.environ["DS_ACCELERATOR"]
    return kind


def installed_ops() -> dict[str, bool]:
    """{op: built at install} as the installed DeepSpeed records it."""
    from deepspeed.git_version_info import installed_ops as ops

    return {name: bool(value) for name, value in ops.items()}


def missing_ops(kind: str | None = None) -> list[str]:
    """The ops this trainer uses on `kind` (default: this machine) that DeepSpeed would JIT."""
    built = installed_ops()
    return [op for op in OPS_BY_ACCELERATOR.get(kind or accelerator(), ()) if not built.get(op)]


def announce_jit_builds(needs_cpu_adam: bool) -> list[str]:
    """Log, before DeepSpeed builds them, the ops this worker will compile; return their names."""
    kind = accelerator()
    coming = [op for op in missing_ops(kind) if op != "cpu_adam" or needs_cpu_adam]
    for op in coming:
        logger.warning(
            "DeepSpeed will compile its %s op now (it was not built when DeepSpeed was "
            "installed; about a minute, under a lock in the torch extensions folder). Build it "
            "once for every run: %s",
            op,
            BUILD_COMMAND,
        )
    return coming
