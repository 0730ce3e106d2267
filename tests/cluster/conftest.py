"""The `cluster` fixture: one 2-node cluster (SLURM, munge, sshd, pdsh, OpenMPI) per session.

Marked `cluster`: `pytest -m cluster` runs these tests alone. They are skipped, with the
reason, only where network namespaces cannot be made (not root); the Debian packages are
installed with apt when missing.
"""

from __future__ import annotations

import pytest

from tests.cluster.cluster import Cluster, cannot_make_namespaces, ensure_packages


@pytest.fixture(scope="session")
def cluster():
    why = cannot_make_namespaces()
    if why:
        pytest.skip(f"no test cluster on this machine: {why}")
    ensure_packages()
    with Cluster(nodes=2) as made:
        yield made


@pytest.fixture(scope="session")
def reference(tmp_path_factory) -> dict[int, float]:
    """The losses of the cluster runs' config on 2 local ranks, on this machine."""
    import os
    import subprocess

    from tests.cluster.runs import RUN_ENV, deepy_argv, losses, run_config

    folder = tmp_path_factory.mktemp("reference")
    config = run_config(folder, num_gpus=2)
    done = subprocess.run(
        deepy_argv(config),
        cwd=folder,
        env={**os.environ, **RUN_ENV},
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return losses(folder)
