"""LauncherSettings: duck-typed construction and errors that name the key and valid values."""

from dataclasses import asdict, fields
from types import SimpleNamespace

import pytest

from megatron.config.groups.launcher import LauncherConfig
from megatron.launcher import RUNNER_LAUNCHERS, LauncherError, LauncherSettings
from megatron.launcher.settings import WORKER_ENV_LAUNCH, WORKER_ENV_MPI, WORKER_ENV_SLURM


def test_defaults_match_gpt_neox():
    s = LauncherSettings()
    assert (s.launcher, s.num_nodes, s.num_gpus, s.master_port) == ("pdsh", -1, None, 29500)
    assert s.worker_env == WORKER_ENV_LAUNCH


def test_from_config_reads_attributes_mappings_and_skips_none():
    cfg = SimpleNamespace(launcher="SLURM", deepspeed_slurm=True, num_gpus=None, other=1)
    s = LauncherSettings.from_config(cfg)
    assert s.launcher == "slurm" and s.deepspeed_slurm and s.num_gpus is None
    assert LauncherSettings.from_config({"num_gpus": 4, "master_port": 1234}).num_gpus == 4
    assert LauncherSettings.from_config(s) is s


def test_empty_strings_mean_unset():
    s = LauncherSettings(include="", hostfile=" ", master_addr="")
    assert s.include is None and s.hostfile is None and s.master_addr is None


@pytest.mark.parametrize(
    "launcher, env",
    [
        ("pdsh", WORKER_ENV_LAUNCH),
        ("slurm", WORKER_ENV_SLURM),
        ("openmpi", WORKER_ENV_MPI),
        ("mpich", WORKER_ENV_MPI),
        ("impi", WORKER_ENV_MPI),
        ("mvapich", WORKER_ENV_MPI),
    ],
)
def test_worker_env_follows_the_backend(launcher, env):
    assert LauncherSettings(launcher=launcher).worker_env == env


def test_unknown_launcher_lists_valid_choices():
    with pytest.raises(LauncherError, match="launcher: 'torchrun' is not") as err:
        LauncherSettings(launcher="torchrun")
    for name in RUNNER_LAUNCHERS:
        assert name in str(err.value)


def test_jsrun_explains_why():
    with pytest.raises(LauncherError, match="jsrun.*not supported.*no jsrun"):
        LauncherSettings(launcher="jsrun")


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"num_gpus": True}, "num_gpus: True has type bool; expected int or null"),
        ({"num_gpus": "2"}, "num_gpus: '2' has type str"),
        ({"deepspeed_slurm": "yes"}, "deepspeed_slurm: 'yes' has type str; expected bool"),
        ({"num_gpus": 0}, "num_gpus: 0 is invalid"),
        ({"num_nodes": 0}, "num_nodes: 0 is invalid"),
        ({"num_nodes": -2}, "num_nodes: -2 is invalid"),
        ({"master_port": 70000}, "master_port: 70000 is not a TCP port"),
        ({"include": "a", "exclude": "b"}, "mutually exclusive"),
        ({"deepspeed_slurm": True}, "deepspeed_slurm: true needs launcher: slurm"),
        ({"deepspeed_mpi": True, "launcher": "slurm"}, "deepspeed_mpi: true needs an MPI"),
        (
            {"deepspeed_mpi": True, "deepspeed_slurm": True, "launcher": "slurm"},
            "both true",
        ),
    ],
)
def test_bad_values_name_the_key(kwargs, message):
    with pytest.raises(LauncherError, match=message.replace("(", r"\(")):
        LauncherSettings(**kwargs)


def test_settings_are_the_launcher_config_group():
    # One definition: the launcher's settings are the config group's fields and defaults, and a
    # resolved config's group converts with every value kept.
    assert issubclass(LauncherSettings, LauncherConfig)
    assert [f.name for f in fields(LauncherSettings)] == [f.name for f in fields(LauncherConfig)]
    assert LauncherSettings() == LauncherSettings.from_config(LauncherConfig())
    group = LauncherConfig(launcher="slurm", deepspeed_slurm=True, num_gpus=4, master_port=1234)
    assert asdict(LauncherSettings.from_config(group)) == asdict(group)


def test_runner_launchers_are_deepspeeds_backends():
    # The config vocabulary less the refused values is exactly what DeepSpeed's runner accepts.
    from deepspeed.launcher import constants

    backends = {v for k, v in vars(constants).items() if k.endswith("_LAUNCHER")}
    assert set(RUNNER_LAUNCHERS) == backends
