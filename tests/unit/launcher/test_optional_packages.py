"""Optional packages: which settings need which package, the pip command, the import check."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from megatron.config.groups.logging import LoggingConfig
from megatron.config.groups.model import ModelConfig
from megatron.config.groups.tokenizer import TokenizerConfig
from megatron.launcher.errors import LauncherError
from megatron.launcher.optional_packages import (
    OPTIONAL_PACKAGES,
    TOOL_PACKAGES,
    MissingPackageError,
    check_optional_packages,
    is_installed,
    missing_packages,
)

REQUIREMENTS = Path(__file__).resolve().parents[3] / "requirements"
MAMBA = [[["mamba", "global"], 1]]


def groups(tokenizer_type="CharLevelTokenizer", model=None, **logging):
    cfg = SimpleNamespace(
        logging=LoggingConfig(**logging),
        tokenizer=TokenizerConfig(tokenizer_type=tokenizer_type),
        model=ModelConfig(**(model or {})),
    )
    return lambda name: getattr(cfg, name)


@pytest.fixture
def without(monkeypatch):
    """Make the named modules unimportable for `find_spec`, as if never installed."""

    def hide(*names):
        for name in names:
            monkeypatch.setitem(sys.modules, name, None)  # find_spec then answers None

    return hide


@pytest.mark.parametrize(
    "script, settings, module, requirement, reason",
    [
        ("train.py", dict(tensorboard_dir="tb"), "tensorboard", "tensorboard>=2.15", "tb"),
        ("train.py", dict(use_wandb=True), "wandb", "wandb>=0.17", "use_wandb: true"),
        ("train.py", dict(use_comet=True), "comet_ml", "comet_ml>=3.45.0", "use_comet: true"),
        ("eval.py", {}, "lm_eval", "lm-eval[hf]==0.4.13", "lm-eval harness"),
        (
            "train.py",
            dict(tokenizer_type="SPMTokenizer"),
            "sentencepiece",
            "sentencepiece>=0.2",
            "SPMTokenizer",
        ),
        (
            "generate.py",
            dict(tokenizer_type="HFTokenizer"),
            "tokenizers",
            "tokenizers>=0.20",
            "HFTokenizer",
        ),
        (
            "train.py",
            dict(model={"attention_config": MAMBA, "mamba_selective_scan_fusion": True}),
            "mamba_ssm",
            "mamba-ssm>=1.2.0.post1",
            "mamba_selective_scan_fusion: true",
        ),
        (
            "generate.py",
            dict(model={"attention_config": MAMBA, "mamba_causal_conv_fusion": True}),
            "causal_conv1d",
            "causal-conv1d>=1.1.0",
            "mamba_causal_conv_fusion: true",
        ),
    ],
)
def test_missing_package_is_refused_with_the_pip_command(
    without, script, settings, module, requirement, reason
):
    without(module)
    with pytest.raises(MissingPackageError) as caught:
        check_optional_packages(f"some/dir/{script}", groups(**settings))
    message = str(caught.value)
    assert f"pip install {shlex.quote(requirement)}" in message
    assert module in message and reason in message and "Nothing was launched" in message
    assert isinstance(caught.value, LauncherError)  # deepy.py exits 2 on it


def test_every_missing_package_in_one_command(without):
    without("tensorboard", "wandb")
    with pytest.raises(MissingPackageError, match=r"pip install 'tensorboard>=2.15' 'wandb>=0.17'"):
        check_optional_packages("train.py", groups(tensorboard_dir="tb", use_wandb=True))


@pytest.mark.parametrize(
    "script, settings",
    [
        ("train.py", {}),  # no tensorboard_dir, no wandb, character tokenizer
        ("generate.py", dict(tensorboard_dir="tb", use_wandb=True, use_comet=True)),  # training
        ("eval.py", dict(tensorboard_dir="tb")),
        ("train.py", dict(model={"attention_config": MAMBA})),  # the reference scan
        ("train.py", dict(model={"mamba_causal_conv_fusion": True})),  # no mamba layer
    ],
)
def test_packages_a_run_does_not_use_are_not_asked_for(without, script, settings):
    without(
        "tensorboard", "wandb", "comet_ml", "sentencepiece", "tokenizers", "mamba_ssm",
        "causal_conv1d",
    )  # fmt: skip
    assert missing_packages(script, groups(**settings)) == []


def test_installed_packages_pass():
    check_optional_packages("train.py", groups("GPT2BPETokenizer", tensorboard_dir="tb"))


def test_is_installed_sees_missing_and_blocked_modules(monkeypatch):
    assert is_installed("json") and not is_installed("no_such_package_xyz")
    monkeypatch.setitem(sys.modules, "json", None)  # blocked: import would fail
    assert not is_installed("json")


def _requirement_lines() -> set[str]:
    lines = set()
    for path in REQUIREMENTS.glob("requirements*.txt"):
        for line in path.read_text().splitlines():
            line = re.sub(r"#.*", "", line).strip()
            if line and not line.startswith("-"):
                lines.add(line)
    return lines


def test_the_pip_commands_install_what_requirements_pin():
    lines = _requirement_lines()
    for package in OPTIONAL_PACKAGES:
        assert package.requirement in lines, f"{package.requirement} not in {REQUIREMENTS}"
    for packages in TOOL_PACKAGES.values():
        for _, requirement in packages:
            assert requirement in lines, f"{requirement} not in {REQUIREMENTS}"


@pytest.mark.parametrize("tool", ["convert_to_hf.py", "convert_from_hf.py"])
def test_a_tool_without_transformers_names_the_pip_command(tool, tmp_path):
    """The Hugging Face tools after `make train` (which does not install transformers): one
    message with the pip command, before anything is read, and no traceback."""
    blocker = tmp_path / "sitecustomize.py"  # this Python without transformers
    blocker.write_text(
        "import importlib.abc, sys\n"
        "class Block(importlib.abc.MetaPathFinder):\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name.split('.')[0] in ('transformers', 'safetensors'):\n"
        "            raise ModuleNotFoundError(name)\n"
        "sys.meta_path.insert(0, Block())\n"
    )
    env = {**os.environ, "PYTHONPATH": f"{tmp_path}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    args = ["--checkpoint", str(tmp_path / "none"), "--output", str(tmp_path / "out")]
    if tool == "convert_from_hf.py":
        args = ["--hf", str(tmp_path / "none"), "--output", str(tmp_path / "out")]
    run = subprocess.run([sys.executable, f"tools/{tool}", *args], cwd=REQUIREMENTS.parent,
                         env=env, capture_output=True, text=True, timeout=120)  # fmt: skip
    assert run.returncode == 2, run.stderr[-2000:]
    assert "Traceback" not in run.stderr
    assert f"tools/{tool} needs transformers, safetensors" in run.stderr
    assert "pip install 'transformers>=4.46,<6' 'safetensors>=0.4'" in run.stderr
    assert not (tmp_path / "out").exists()
