"""Secrets: detection, redaction, the forwarding file and what prepare_launch hands the runner."""

import os
import stat
from types import SimpleNamespace

import pytest

from megatron.launcher import (
    SECRETS_FILE_VAR,
    LauncherError,
    WorkerEnvironmentError,
    is_secret_name,
    load_forwarded_secrets,
    prepare_launch,
    redact_argv,
    redact_env,
    setup_distributed_env,
)
from megatron.launcher.secrets import read_secrets_file, write_secrets_file

KEY = "wandb-0123456789abcdef"


@pytest.mark.parametrize(
    "name",
    ["WANDB_API_KEY", "HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "AWS_SECRET_ACCESS_KEY",
     "MLFLOW_TRACKING_PASSWORD", "MLFLOW_TRACKING_TOKEN", "COMET_API_KEY", "GITHUB_TOKEN",
     "api_key"],
)  # fmt: skip
def test_secret_names(name):
    assert is_secret_name(name)


@pytest.mark.parametrize(
    "name", ["PATH", "SSH_AUTH_SOCK", "PYTHONPATH", "WANDB_PROJECT", "MASTER_ADDR", "TOKENIZERS"]
)
def test_ordinary_names(name):
    assert not is_secret_name(name)
    assert is_secret_name(name, extra=[name])


def test_redact_env():
    assert redact_env({"WANDB_API_KEY": KEY, "PATH": "/bin"}) == {
        "WANDB_API_KEY": "***",
        "PATH": "/bin",
    }


def test_redact_argv_hides_values_assignments_and_genv_pairs():
    environ = {"WANDB_API_KEY": KEY, "SHORT_TOKEN": "ab"}
    argv = [
        "srun",
        "--export=ALL,PYTHONPATH=/repo,MLFLOW_TRACKING_TOKEN=tok123,X=1",
        f"--note={KEY}",
        "export HF_TOKEN=hf_abc; export PYTHONPATH=/r; cd /r;",
        "-genv",
        "MY_PASSWORD",
        "hunter2",
        "-genv",
        "MASTER_ADDR",
        "n1",
        "-x",
        "WANDB_API_KEY",
        "ab",
    ]
    out = redact_argv(argv, environ)
    assert out[1] == "--export=ALL,PYTHONPATH=/repo,MLFLOW_TRACKING_TOKEN=***,X=1"
    assert out[2] == "--note=***"
    assert out[3] == "export HF_TOKEN=***; export PYTHONPATH=/r; cd /r;"
    assert out[4:10] == ["-genv", "MY_PASSWORD", "***", "-genv", "MASTER_ADDR", "n1"]
    assert out[10:] == ["-x", "WANDB_API_KEY", "ab"]  # names stay; too-short values stay


def test_secrets_file_round_trip_is_private(tmp_path):
    values = {"WANDB_API_KEY": KEY, "ODD_TOKEN": 'it\'s $HOME; `x` "q"\nline2'}
    path = write_secrets_file(values, str(tmp_path / "d"))
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert stat.S_IMODE(os.stat(tmp_path / "d").st_mode) == 0o700
    assert read_secrets_file(path) == values
    environ = {SECRETS_FILE_VAR: path, "ODD_TOKEN": "already set"}
    assert load_forwarded_secrets(environ) == ["WANDB_API_KEY"]
    assert environ["WANDB_API_KEY"] == KEY and environ["ODD_TOKEN"] == "already set"


def test_missing_secrets_file_says_it_must_be_shared(tmp_path):
    environ = {SECRETS_FILE_VAR: str(tmp_path / "gone.sh")}
    with pytest.raises(WorkerEnvironmentError, match="does not exist on this node.*shared"):
        load_forwarded_secrets(environ)


def test_setup_distributed_env_loads_forwarded_secrets(tmp_path):
    path = write_secrets_file({"WANDB_API_KEY": KEY}, str(tmp_path))
    environ = {SECRETS_FILE_VAR: path}
    setup_distributed_env({}, environ)
    assert environ["WANDB_API_KEY"] == KEY


def test_local_launch_keeps_secrets_in_the_environment(tmp_path):
    environ = {"WANDB_API_KEY": KEY, "PATH": "/bin"}
    launcher = SimpleNamespace(num_gpus=2)
    with prepare_launch(
        launcher,
        "train.py",
        ["--megatron_config", "abc"],
        environ=environ,
        launch_dir=str(tmp_path),
        device_count=0,
    ) as plan:
        assert plan.env["WANDB_API_KEY"] == KEY and plan.secrets_file is None
        assert plan.env["DS_ACCELERATOR"] == "cpu" and plan.world_size == 2
        assert KEY not in " ".join(plan.argv)
    assert environ == {"WANDB_API_KEY": KEY, "PATH": "/bin"}  # not modified


def test_multi_node_launch_moves_secrets_to_a_file(tmp_path):
    hostfile = tmp_path / "hosts"
    hostfile.write_text("n1 slots=2\nn2 slots=2\n")
    environ = {"WANDB_API_KEY": KEY, "MLFLOW_TRACKING_TOKEN": "mlflow-secret", "PATH": "/bin"}
    launcher = {"launcher": "slurm", "hostfile": str(hostfile), "comment": f"x {KEY}"}
    with prepare_launch(
        launcher,
        "train.py",
        ["--megatron_config", "abc"],
        environ=environ,
        launch_dir=str(tmp_path / "s"),
    ) as plan:
        assert "WANDB_API_KEY" not in plan.env and "MLFLOW_TRACKING_TOKEN" not in plan.env
        assert plan.forwarded_secrets == ["MLFLOW_TRACKING_TOKEN", "WANDB_API_KEY"]
        path = plan.env[SECRETS_FILE_VAR]
        assert read_secrets_file(path) == {
            "WANDB_API_KEY": KEY,
            "MLFLOW_TRACKING_TOKEN": "mlflow-secret",
        }
        assert "mlflow-secret" not in " ".join(plan.argv)
        assert KEY not in plan.display() and "***" in plan.display()
        assert plan.world_size == 4
    assert not os.path.exists(path)


def test_pdsh_launch_sources_the_secrets_file_and_openmpi_forwards_its_name(tmp_path):
    hostfile = tmp_path / "hosts"
    hostfile.write_text("n1 slots=1\nn2 slots=1\n")
    environ = {"HF_TOKEN": "hf_secret_value"}
    with prepare_launch(
        {"hostfile": str(hostfile)}, "train.py", [], environ=environ, launch_dir=str(tmp_path)
    ) as plan:
        i = plan.argv.index("--venv_script")
        assert plan.argv[i + 1] == plan.secrets_file
    launcher = {"launcher": "openmpi", "hostfile": str(hostfile)}
    with prepare_launch(
        launcher, "train.py", [], environ=environ, launch_dir=str(tmp_path)
    ) as plan:
        assert f"-x {SECRETS_FILE_VAR}" in plan.argv[plan.argv.index("--launcher_args") + 1]


def test_remote_ranks_get_the_launching_shells_path_and_threads(tmp_path):
    hostfile = tmp_path / "hosts"
    hostfile.write_text("n1 slots=1\nn2 slots=1\n")
    environ = {"PATH": "/venv/bin:/usr/bin", "OMP_NUM_THREADS": "4", "EDITOR": "vi"}
    with prepare_launch(
        {"hostfile": str(hostfile)}, "train.py", [], environ=environ, launch_dir=str(tmp_path)
    ) as plan:  # pdsh: sourced on every node, before the remote launch.py starts
        sourced = read_secrets_file(plan.argv[plan.argv.index("--venv_script") + 1])
        assert sourced == {"PATH": "/venv/bin:/usr/bin", "OMP_NUM_THREADS": "4"}
    launcher = {"launcher": "openmpi", "hostfile": str(hostfile)}
    with prepare_launch(
        launcher, "train.py", [], environ=environ, launch_dir=str(tmp_path)
    ) as plan:  # mpirun -x NAME: the value travels from mpirun's own environment
        words = plan.argv[plan.argv.index("--launcher_args") + 1].split()
        assert "PATH" in words and "OMP_NUM_THREADS" in words and "EDITOR" not in words
        assert plan.secrets_file is None


@pytest.mark.parametrize("text", ["WANDB_API_KEY=x\n", "export A='unclosed\n", "export 1A=x\n"])
def test_malformed_secrets_file_names_the_file(tmp_path, text):
    path = tmp_path / "secrets.sh"
    path.write_text(text)
    with pytest.raises(WorkerEnvironmentError, match="secrets.sh' is not a list of"):
        read_secrets_file(str(path))


def test_secret_in_a_deepspeed_env_file_is_refused(tmp_path, monkeypatch):
    hostfile = tmp_path / "hosts"
    hostfile.write_text("n1 slots=1\nn2 slots=1\n")
    home = tmp_path / "home"
    home.mkdir()
    (home / ".deepspeed_env").write_text("NCCL_DEBUG=INFO\nHF_TOKEN=hf_abc\n")
    monkeypatch.chdir(tmp_path)
    environ = {"HOME": str(home)}
    with pytest.raises(LauncherError, match=r"\.deepspeed_env, line 2 sets HF_TOKEN") as err:
        with prepare_launch({"hostfile": str(hostfile)}, "train.py", [], environ=environ):
            pass
    assert "hf_abc" not in str(err.value)
    (home / ".deepspeed_env").write_text("NCCL_DEBUG=INFO\n")
    with prepare_launch({"hostfile": str(hostfile)}, "train.py", [], environ=environ) as plan:
        assert plan.secrets_file is None


def test_staged_secrets_are_removed_when_the_launch_is_refused(tmp_path):
    hostfile = tmp_path / "hosts"
    hostfile.write_text("n1 slots=1\nn2 slots=1\n")
    launch_dir = tmp_path / "launch"
    with pytest.raises(LauncherError, match="pdsh passes arguments through a remote shell"):
        with prepare_launch(
            {"hostfile": str(hostfile)},
            "train.py",
            ['{"a": 1}'],
            environ={"HF_TOKEN": "hf_secret"},
            launch_dir=str(launch_dir),
        ):
            pass
    assert list(launch_dir.iterdir()) == []
