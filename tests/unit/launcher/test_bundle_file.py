"""A config bundle too long for a command line reaches the workers in a file, on every launcher.

muP's base shapes travel inside the bundle: at 80 layers they make it longer than Linux lets one
argument be once pdsh or srun wrap it for a remote shell. `deepy.py::bundle_args` then passes
`--megatron_config_file`, a file `prepare_launch` writes in the launch folder (shared by the
nodes) and deletes when the launch ends; a worker reads back the same config.
"""

from __future__ import annotations

import os

import pytest
import yaml

from deepy import bundle_args
from megatron.config import ConfigError, config_from_argv
from megatron.config.bundle import BUNDLE_FILE_FLAG, BUNDLE_FLAG, INLINE_LIMIT
from megatron.launcher import prepare_launch
from megatron.model import ModelArgs
from megatron.model.mup_shapes import base_shapes
from tests.tiny import resolve, tiny_settings

# Linux's MAX_ARG_STRLEN: the longest single argument execve takes
LINUX_ARGUMENT_LIMIT = 128 * 1024
HOSTS = "node1 slots=1\nnode2 slots=1\n"


def mup_config(tmp_path, layers: int):
    settings = tiny_settings(tmp_path, num_layers=layers)
    shapes = base_shapes(ModelArgs.from_config(resolve(settings, world_size=1)), 2)
    path = tmp_path / "base-shapes.yml"
    path.write_text(yaml.safe_dump(shapes, sort_keys=False))
    return resolve({**settings, "use_mup": True, "base_shapes_file": str(path)}, world_size=1)


def launchers(tmp_path) -> dict[str, tuple[dict, dict]]:
    """Each backend's launcher keys and the environment it starts from."""
    hostfile = tmp_path / "hostfile"
    hostfile.write_text(HOSTS)
    many = {"hostfile": str(hostfile)}
    slurm_env = {"SLURM_JOB_NODELIST": "node[1-2]", "SLURM_GPUS_ON_NODE": "1", "PATH": "/bin"}
    nossh_env = {"NNODES": "2", "NODE_RANK": "1", "MASTER_ADDR": "node1", "PATH": "/bin"}
    return {
        "local": ({}, {"PATH": "/bin"}),
        "pdsh": ({**many, "launcher": "pdsh"}, {"PATH": "/bin"}),
        "openmpi": ({**many, "launcher": "openmpi"}, {"PATH": "/bin"}),
        "mpich": ({**many, "launcher": "mpich"}, {"PATH": "/bin"}),
        "slurm": ({"launcher": "slurm", "deepspeed_slurm": True}, slurm_env),
        "no-ssh": ({**many, "no_ssh": True, "master_port": 29511}, nossh_env),
    }


def test_an_80_layer_mup_bundle_is_too_long_to_pass_inline(tmp_path):
    small = resolve(tiny_settings(tmp_path), world_size=1)
    assert bundle_args(small)[0] == BUNDLE_FLAG  # the usual config stays on the command line
    big = bundle_args(mup_config(tmp_path, 80))
    assert big[0] == BUNDLE_FILE_FLAG
    assert len(big[1].text) > INLINE_LIMIT


@pytest.mark.parametrize("name", ["local", "pdsh", "openmpi", "mpich", "slurm", "no-ssh"])
def test_every_launcher_passes_a_large_bundle_as_a_file(tmp_path, name):
    cfg = mup_config(tmp_path, 80)
    keys, environ = launchers(tmp_path)[name]
    launch_dir = tmp_path / "launch"
    with prepare_launch(
        keys,
        "train.py",
        bundle_args(cfg),
        environ=environ,
        launch_dir=str(launch_dir),
        device_count=1,
    ) as plan:
        assert max(len(arg) for arg in plan.argv) < INLINE_LIMIT
        assert sum(len(arg) + 1 for arg in plan.argv) < LINUX_ARGUMENT_LIMIT
        path = plan.argv[plan.argv.index(BUNDLE_FILE_FLAG) + 1]
        assert os.path.dirname(path) == str(launch_dir)
        assert oct(os.stat(path).st_mode & 0o777) == "0o600"
        worker_argv = plan.argv[plan.argv.index("train.py") + 1 :]
        assert config_from_argv(worker_argv) == cfg
        assert cfg.mup.mup_base_shapes  # the shapes themselves made the trip
    assert not os.path.exists(path)


def test_a_bundle_file_missing_on_a_node_is_named(tmp_path):
    missing = tmp_path / ".megatron_launch" / "config-x"
    with pytest.raises(ConfigError, match="no such file on .*every node sees"):
        config_from_argv([BUNDLE_FILE_FLAG, str(missing)])
