"""Installing into an environment that has its own torch: pip keeps it, and the offline
installer refuses, before installing anything, what would give a broken install.

The first check is pip itself, offline (`--no-index`, nothing to find): resolving
`pip install -e .` in the test environment must need nothing new, torch least of all; a pin
outside the environment's torch would fail to resolve. The others drive
`tools/install_offline.py`'s checks with a torch version or an nvcc it does not support.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(REPO / "tools"))

import install_offline  # noqa: E402


def test_editable_install_keeps_the_environments_torch(tmp_path):
    report = tmp_path / "report.json"
    command = [sys.executable, "-m", "pip", "install", "--dry-run", "--no-index",
               "--find-links", str(tmp_path), "--no-build-isolation", "--report", str(report),
               "-e", str(REPO)]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    wanted = [item["metadata"]["name"] for item in json.loads(report.read_text())["install"]]
    assert wanted == ["megatron-neox"]


@pytest.mark.parametrize("version", ["2.10.1", "2.14.0+cu130"])
def test_a_torch_outside_the_supported_range_is_refused(monkeypatch, version):
    monkeypatch.setattr(torch, "__version__", version)
    with pytest.raises(install_offline.OfflineInstallError, match="outside the supported range"):
        install_offline.check_torch()


def test_the_oldest_supported_torch_is_accepted(monkeypatch):
    monkeypatch.setattr(torch, "__version__", "2.11.0+cu130")
    assert install_offline.check_torch() == "2.11.0+cu130"


def fake_nvcc(folder: Path, release: str) -> None:
    nvcc = folder / "nvcc"
    nvcc.write_text(f"#!/bin/sh\necho 'Cuda compilation tools, release {release}, V{release}.1'\n")
    nvcc.chmod(0o755)


def test_an_nvcc_of_another_cuda_major_is_refused(monkeypatch, tmp_path):
    fake_nvcc(tmp_path, "12.4")
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setattr(torch.version, "cuda", "13.0")
    with pytest.raises(install_offline.OfflineInstallError, match="nvcc is CUDA 12 but torch"):
        install_offline.check_cuda()
    fake_nvcc(tmp_path, "13.0")
    install_offline.check_cuda()  # the same major: accepted
