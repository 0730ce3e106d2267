"""deepy.py end to end: configs → validated bundle → DeepSpeed runner → every rank.

Launches the echo worker (the first half of train.py: decode the bundle, join the gloo
group) on 2 CPU ranks locally and through a fake `srun`/`mpirun`, and checks that every rank
received the identical, complete resolved config that `--dry-run` prints.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.distributed import free_port

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
WORKER = REPO / "tests" / "e2e" / "workers" / "echo_config.py"
FAKE_BIN = REPO / "tests" / "e2e" / "fake_bin"
TOKENIZER = REPO / "tests" / "data" / "tiny_hf_tokenizer.json"


def deepy(args: list[str], tmp_path: Path, extra_env: dict | None = None):
    env = {k: v for k, v in os.environ.items() if k != "CUDA_VISIBLE_DEVICES"}
    env.update(
        PYTHONPATH=str(REPO),
        OMP_NUM_THREADS="1",
        PATH=f"{FAKE_BIN}{os.pathsep}{env['PATH']}",
        FAKE_LAUNCHER_LOG=str(tmp_path / "calls.jsonl"),
        **(extra_env or {}),
    )
    return subprocess.run(
        [sys.executable, str(REPO / "deepy.py"), *args],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


def machine_file(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "machine.yml"
    path.write_text(
        f"tokenizer_type: HFTokenizer\nvocab_file: {TOKENIZER}\n"
        f"data_path: {tmp_path}/none_text_document\nsave: {tmp_path}/out\n" + text
    )
    return path


def dry_run_config(args: list[str], tmp_path: Path) -> dict:
    proc = deepy(["--dry-run", *args], tmp_path)
    assert proc.returncode == 0, proc.stderr
    text = proc.stdout
    resolved = json.loads(text[: text.rindex("}") + 1])
    resolved.pop("deepspeed_config")
    command = text[text.rindex("}") + 1 :].strip()
    assert "deepspeed.launcher.runner" in command and "--megatron_config" in command
    return resolved


def read_ranks(tmp_path: Path, world: int) -> list[dict]:
    return [json.loads((tmp_path / "out" / f"rank{r}.json").read_text()) for r in range(world)]


def check_identical(results: list[dict], expected: dict) -> None:
    assert [r["rank"] for r in results] == list(range(len(results)))
    assert all(r["world_size"] == len(results) for r in results)
    assert all(r["all_reduce"] == float(len(results)) for r in results)
    assert all(r["digests"] == results[0]["digests"] for r in results)
    assert len(set(results[0]["digests"])) == 1
    for r in results:
        assert r["config"] == expected


def test_160m_reaches_every_rank_with_the_same_config(tmp_path):
    machine = machine_file(tmp_path, f"num_gpus: 2\nmaster_port: {free_port()}\n")
    args = [str(WORKER), "configs/160M.yml", str(machine)]
    expected = dry_run_config(args, tmp_path)
    assert expected["hidden_size"] == 768 and expected["world_size"] == 2
    assert expected["data_parallel_size"] == 2 and expected["train_batch_size"] == 8
    assert expected["padded_vocab_size"] % 128 == 0
    proc = deepy(args, tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    check_identical(read_ranks(tmp_path, 2), expected)


def test_bad_config_launches_nothing(tmp_path):
    machine = machine_file(tmp_path, "num_gpus: 2\nhidden_size: 100\n")
    proc = deepy([str(WORKER), "configs/160M.yml", str(machine)], tmp_path)
    assert proc.returncode == 2
    assert "hidden_size" in proc.stderr and "160M.yml" in proc.stderr
    assert "machine.yml" in proc.stderr
    assert not (tmp_path / "out").exists()


def test_world_size_must_fit_the_layout(tmp_path):
    machine = machine_file(tmp_path, f"num_gpus: 3\nmaster_port: {free_port()}\n")
    args = [str(WORKER), "configs/small.yml", str(machine), "--set", "model_parallel_size=2"]
    proc = deepy(args, tmp_path)
    assert proc.returncode == 2 and "world size 3" in proc.stderr
    assert not (tmp_path / "out").exists()


def test_slurm_mode_through_srun(tmp_path):
    machine = machine_file(
        tmp_path,
        f"num_gpus: 2\nmaster_port: {free_port()}\nlauncher: slurm\ndeepspeed_slurm: true\n",
    )
    args = [str(WORKER), "configs/small.yml", str(machine)]
    expected = dry_run_config(args, tmp_path)
    proc = deepy(args, tmp_path, {"FAKE_SLURM_NODELIST": "localhost"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    check_identical(read_ranks(tmp_path, 2), expected)
    calls = [json.loads(line) for line in (tmp_path / "calls.jsonl").read_text().splitlines()]
    (srun,) = [c["argv"] for c in calls if c["tool"] == "srun"]
    assert srun[:2] == ["-n", "2"] and "--megatron_config" in srun


def test_mpi_mode_through_mpirun(tmp_path):
    hostfile = tmp_path / "hostfile"
    hostfile.write_text("localhost slots=2\n")
    machine = machine_file(
        tmp_path,
        f"hostfile: {hostfile}\nmaster_port: {free_port()}\nlauncher: openmpi\n"
        "deepspeed_mpi: true\n",
    )
    args = [str(WORKER), "configs/small.yml", str(machine)]
    expected = dry_run_config(args, tmp_path)
    proc = deepy(args, tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    check_identical(read_ranks(tmp_path, 2), expected)


@pytest.mark.parametrize(
    "extra, key, dry_run",
    [
        ("num_unique_layers: 2\n", "num_unique_layers", False),
        ("use_bnb_optimizer: true\n", "use_bnb_optimizer", False),
        ("data_impl: cached\n", "data_impl", True),
    ],
)
def test_config_that_would_train_something_else_launches_nothing(tmp_path, extra, key, dry_run):
    machine = machine_file(tmp_path, f"num_gpus: 2\nmaster_port: {free_port()}\n{extra}")
    args = [str(WORKER), "configs/small.yml", str(machine)] + (["--dry-run"] if dry_run else [])
    proc = deepy(args, tmp_path)
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert f"config key '{key}' ({machine})" in proc.stderr
    assert "GPT-NeoX's default" in proc.stderr or "not supported" in proc.stderr
    assert "deepspeed.launcher.runner" not in proc.stdout
    assert not (tmp_path / "out").exists()


def test_model_only_config_generates_but_does_not_train(tmp_path):
    model = tmp_path / "model.yml"
    model.write_text(
        "num_layers: 2\nhidden_size: 64\nnum_attention_heads: 4\nseq_length: 32\n"
        f"tokenizer_type: HFTokenizer\nvocab_file: {TOKENIZER}\nload: {tmp_path}/ckpt\n"
    )
    proc = deepy(["--dry-run", "generate.py", str(model)], tmp_path)
    # Resolved without batch sizes or an optimizer; only the pre-flight misses the checkpoint.
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert f"checkpoint '{tmp_path}/ckpt' does not exist" in proc.stderr
    assert "optimizer" not in proc.stderr and "batch" not in proc.stderr
    proc = deepy(["--dry-run", "train.py", str(model)], tmp_path)
    assert proc.returncode == 2 and "train_micro_batch_size_per_gpu" in proc.stderr
    args = ["--dry-run", "train.py", str(model), "--set", "train_micro_batch_size_per_gpu=2"]
    proc = deepy(args, tmp_path)
    assert "GPT-NeoX's default optimizer Adam" in proc.stderr  # resolved; then the pre-flight:
    assert proc.returncode == 2 and "datasets: no data: set data_path" in proc.stderr
