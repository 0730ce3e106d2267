"""Build locks of torch's extension builder, and the DeepSpeed ops built at install time.

* A build killed half way (SIGKILL during a real `load_inline` compile) leaves its lock; the
  next launch's pre-flight (`deepy.py --dry-run`) reports and removes it instead of letting
  the ranks wait forever. A lock a live build holds is left alone and reported; one that may
  belong to another node's build refuses a multi-node launch, naming the file.
* A worker that must wait on a lock says so, naming the file.
* The ops DeepSpeed loads on this machine were built when it was installed (the install step of
  docs/getting-started.md): DeepSpeed's own loader returns them from its package, and compiles
  nothing.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from torch.utils.file_baton import FileBaton

from megatron.kernels.build_locks import STALE_AFTER, lock_findings, watch_lock_waits
from megatron.kernels.deepspeed_ops import OPS_BY_ACCELERATOR, accelerator, missing_ops
from tests.tiny import tiny_settings, write_config

REPO = Path(__file__).resolve().parents[3]
BUILD = """
from torch.utils.cpp_extension import load_inline
load_inline(name="mn_lock_probe", cpp_sources="int one() { return 1; }", functions=["one"])
"""


def _killed_build(extensions: Path) -> Path:
    """Start a real extension build under `extensions`, SIGKILL it once it holds its lock."""
    build = subprocess.Popen(
        [sys.executable, "-c", BUILD], env={**os.environ, "TORCH_EXTENSIONS_DIR": str(extensions)}
    )
    lock = extensions / "mn_lock_probe" / "lock"
    deadline = time.monotonic() + 120
    while not lock.exists():
        assert build.poll() is None and time.monotonic() < deadline, "the build took no lock"
        time.sleep(0.02)
    build.send_signal(signal.SIGKILL)
    build.wait()
    assert lock.exists()  # what a Ctrl-C or a time limit leaves behind
    return lock


def test_the_next_launch_clears_the_lock_a_killed_build_left(tmp_path):
    extensions = tmp_path / "extensions"
    lock = _killed_build(extensions)
    config = write_config(tmp_path, tiny_settings(tmp_path, num_gpus=1))
    done = subprocess.run(
        [sys.executable, "deepy.py", "train.py", str(config), "--dry-run"],
        cwd=REPO,
        env={**os.environ, "TORCH_EXTENSIONS_DIR": str(extensions)},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"removed the stale build lock {lock}" in done.stdout + done.stderr
    assert not lock.exists()


def test_a_live_build_is_left_alone_and_another_nodes_lock_is_refused(tmp_path):
    lock = tmp_path / "py311_cpu" / "some_op" / "lock"
    lock.parent.mkdir(parents=True)
    fd = os.open(lock, os.O_CREAT | os.O_EXCL)  # as torch's builder holds it while it builds
    try:
        [state] = lock_findings(tmp_path, one_machine=True)
        assert state.holders == (os.getpid(),) and not state.removed and lock.exists()
    finally:
        os.close(fd)
    # nobody here holds it: on a cluster, a build on another node sharing the folder?
    [state] = lock_findings(tmp_path, one_machine=False)
    assert not state.removed and lock.exists()
    # ... unless it is older than any build
    [state] = lock_findings(tmp_path, one_machine=False, now=time.time() + STALE_AFTER + 1)
    assert state.removed and not lock.exists()


def test_a_wait_on_a_lock_names_the_file(tmp_path, caplog):
    lock = tmp_path / "lock"
    lock.write_text("")
    watch_lock_waits(notice_after=0.2)
    threading.Timer(0.6, lock.unlink).start()  # the other build finishes
    with caplog.at_level(logging.WARNING, logger="megatron.kernels.build_locks"):
        FileBaton(str(lock), wait_seconds=0.01).wait()
    assert f"the build lock {lock}" in caplog.text


OP_LOADERS = {
    "deepspeed_shm_comm": ("deepspeed.ops.op_builder.cpu", "ShareMemCommBuilder"),
    "cpu_adam": ("deepspeed.ops.op_builder", "CPUAdamBuilder"),
}
LOAD = """
import importlib, sys
module, name = sys.argv[1], sys.argv[2]
op = getattr(importlib.import_module(module), name)().load()
print(op.__file__)
"""


@pytest.mark.parametrize("op", sorted(OP_LOADERS))
def test_the_op_a_worker_loads_was_built_at_install(tmp_path, op):
    kind = accelerator()
    if op not in OPS_BY_ACCELERATOR.get(kind, ()):
        pytest.skip(f"{op} is not loaded on a {kind} machine")
    assert op not in missing_ops(kind), "run: python tools/build_deepspeed_ops.py"
    extensions = tmp_path / "extensions"
    done = subprocess.run(
        [sys.executable, "-c", LOAD, *OP_LOADERS[op]],
        env={**os.environ, "TORCH_EXTENSIONS_DIR": str(extensions), "DS_ACCELERATOR": kind},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert "/deepspeed/ops/" in done.stdout  # DeepSpeed's installed library
    assert not extensions.exists()  # nothing compiled, no lock taken
