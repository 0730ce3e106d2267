"""The extension loader (fallback said once) and the build helpers setup.py calls."""

from __future__ import annotations

import logging
import sys
from pathlib import Path

import pytest
import torch
from setuptools import Distribution, Extension
from setuptools.command.build_ext import build_ext
from torch.utils import cpp_extension

from megatron.kernels import build, loader


@pytest.fixture
def fresh_loader(monkeypatch):
    loader.load_extension.cache_clear()
    yield monkeypatch
    loader.load_extension.cache_clear()


def test_missing_extension_falls_back_and_says_so_once(fresh_loader, caplog):
    fresh_loader.setitem(loader.EXTENSION_MODULES, "softmax", "megatron.kernels._not_built_here")
    with caplog.at_level(logging.WARNING, logger="megatron.kernels.loader"):
        assert loader.load_extension("softmax") is None
        assert not loader.kernel_available("softmax")
        assert loader.extension_status()["softmax"] is False
    messages = [r.getMessage() for r in caplog.records if r.name == "megatron.kernels.loader"]
    softmax_messages = [m for m in messages if "fused softmax kernel unavailable" in m]
    assert len(softmax_messages) == 1
    assert "PyTorch reference" in softmax_messages[0]


def test_unknown_kernel_name_is_an_error(fresh_loader):
    with pytest.raises(ValueError, match="valid kernels: \\['rotary', 'softmax'\\]"):
        loader.load_extension("softmaxx")


def test_loader_and_build_agree_on_module_names():
    assert set(loader.EXTENSION_MODULES.values()) == set(build.KERNEL_SOURCES)
    for sources in build.KERNEL_SOURCES.values():
        assert all((build.REPO_ROOT / source).is_file() for source in sources)


@pytest.mark.parametrize(
    "arch_list,expected",
    [
        ("9.0", ["-gencode=arch=compute_90,code=sm_90"]),
        (
            "8.0; 9.0+PTX",
            [
                "-gencode=arch=compute_80,code=sm_80",
                "-gencode=arch=compute_90,code=compute_90",
                "-gencode=arch=compute_90,code=sm_90",
            ],
        ),
        ("Hopper", ["-gencode=arch=compute_90,code=sm_90"]),
        ("9.0a", ["-gencode=arch=compute_90a,code=sm_90a"]),
    ],
)
def test_gencode_flags(arch_list, expected):
    assert build.gencode_flags(arch_list) == expected


def test_unreadable_arch_list_names_the_variable():
    with pytest.raises(ValueError, match="TORCH_CUDA_ARCH_LIST: cannot read architecture 'sm_90'"):
        build.gencode_flags("8.0;sm_90")


@pytest.mark.skipif(torch.version.cuda is not None, reason="needs a CPU-only PyTorch build")
def test_cpu_torch_builds_no_extension_and_says_why(caplog):
    with caplog.at_level(logging.WARNING, logger="megatron.kernels.build"):
        assert build.cuda_extensions() == []
    assert "CPU-only build" in caplog.text


@pytest.fixture
def cuda_toolkit(monkeypatch):
    """Pretend PyTorch was built with CUDA and nvcc lives at /usr/local/cuda."""
    monkeypatch.setattr(torch.version, "cuda", "12.8")
    monkeypatch.setattr(cpp_extension, "CUDA_HOME", "/usr/local/cuda")
    return monkeypatch


def test_extensions_for_the_requested_architecture(cuda_toolkit):
    cuda_toolkit.setenv("TORCH_CUDA_ARCH_LIST", "9.0")
    extensions = build.cuda_extensions()
    assert [ext.name for ext in extensions] == list(build.KERNEL_SOURCES)
    for ext in extensions:
        assert "-gencode=arch=compute_90,code=sm_90" in ext.extra_compile_args["nvcc"]
        assert all(Path(source).is_file() for source in ext.sources)
        assert ext.optional


def test_bad_arch_list_or_no_gpu_builds_nothing_without_raising(cuda_toolkit, caplog):
    cuda_toolkit.setenv("TORCH_CUDA_ARCH_LIST", "sm_90")
    with caplog.at_level(logging.WARNING, logger="megatron.kernels.build"):
        assert build.cuda_extensions() == []
    assert "cannot read architecture" in caplog.text
    if not torch.cuda.is_available():
        cuda_toolkit.delenv("TORCH_CUDA_ARCH_LIST")
        assert build.cuda_extensions() == []
        assert "no GPU is visible" in caplog.text


GOOD_SOURCE = """
#include <Python.h>
static PyModuleDef def = {PyModuleDef_HEAD_INIT, "good_ext", nullptr, -1, nullptr,
                          nullptr, nullptr, nullptr, nullptr};
PyMODINIT_FUNC PyInit_good_ext(void) { return PyModule_Create(&def); }
"""


class SetupBuildExt(build_ext):
    """Stands in for setup.py's own build_ext subclass."""

    marker = "setup.py's build_ext"


def _build(tmp_path: Path, extensions: list[Extension]) -> None:
    distribution = Distribution(
        {
            "name": "t",
            "ext_modules": extensions,
            "cmdclass": {"build_ext": build.optional_build_ext(SetupBuildExt)},
        }
    )
    command = distribution.get_command_obj("build_ext")
    command.build_lib = str(tmp_path / "lib")
    command.build_temp = str(tmp_path / "temp")
    assert command.marker == "setup.py's build_ext"
    distribution.run_command("build_ext")


@pytest.mark.skipif(sys.platform != "linux", reason="builds a tiny C++ extension with gcc")
def test_a_failing_kernel_extension_does_not_stop_the_build(tmp_path, monkeypatch, caplog):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "good.cpp").write_text(GOOD_SOURCE)
    (tmp_path / "broken.cpp").write_text("this is not C++\n")
    kernel_name = next(iter(build.KERNEL_SOURCES))
    extensions = [Extension(kernel_name, ["broken.cpp"]), Extension("good_ext", ["good.cpp"])]
    with caplog.at_level(logging.WARNING, logger="megatron.kernels.build"):
        _build(tmp_path, extensions)
    assert list((tmp_path / "lib").glob("good_ext*.so"))
    assert f"building {kernel_name} failed" in caplog.text


@pytest.mark.skipif(sys.platform != "linux", reason="builds a tiny C++ extension with gcc")
def test_a_failing_non_kernel_extension_still_fails(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "broken.cpp").write_text("this is not C++\n")
    with pytest.raises(Exception, match="compil"):
        _build(tmp_path, [Extension("someone_elses_ext", ["broken.cpp"])])


@pytest.mark.skipif(torch.version.cuda is not None, reason="needs a CPU-only PyTorch build")
def test_inplace_build_on_a_cpu_machine_builds_nothing():
    cwd = Path.cwd()
    assert build.build_inplace() == []
    assert Path.cwd() == cwd
