"""The CUDA sources compile on a machine without a GPU: the CI-able half of the kernel checks.

Each .cu named in `megatron.kernels.build.KERNEL_SOURCES` is compiled with `nvcc -c` for one
architecture (sm_90) with the flags PyTorch's build adds; each binding .cpp is compiled by the
host compiler against PyTorch's headers (`-fsyntax-only`: the CPU wheel has no libtorch_cuda to
link against). The CPU wheel ships c10/cuda headers but not the CMake-generated
c10/cuda/impl/cuda_cmake_macros.h, which C10_CUDA_NO_CMAKE_CONFIGURE_FILE skips; nor the
cuBLAS/cuSPARSE headers that ATen/cuda/CUDAContext.h needs, which is why the kernels include
only CUDA headers and the bindings only c10/cuda. All files compile in parallel.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sysconfig
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from torch.utils import cpp_extension

from megatron.kernels.build import CXX_FLAGS, KERNEL_SOURCES, NVCC_FLAGS, REPO_ROOT

NVCC = shutil.which("nvcc")
CXX = shutil.which(os.environ.get("CXX", "c++")) or shutil.which("g++")
SOURCES = sorted({source for sources in KERNEL_SOURCES.values() for source in sources})

pytestmark = pytest.mark.skipif(
    NVCC is None, reason="nvcc is not on PATH: the CUDA compile check needs the CUDA toolkit"
)


def _cuda_include() -> str | None:
    """The CUDA toolkit's include dir (nvcc may be a wrapper script outside the toolkit)."""
    if NVCC is None:
        return None
    homes = [os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH")]
    homes += [str(Path(NVCC).resolve().parent.parent), "/usr/local/cuda"]
    for home in filter(None, homes):
        if (Path(home) / "include" / "cuda_runtime.h").exists():
            return str(Path(home) / "include")
    return None


CUDA_INCLUDE = _cuda_include()


def _include_flags() -> list[str]:
    paths = [
        str(REPO_ROOT / "csrc"),
        *cpp_extension.include_paths(),
        CUDA_INCLUDE,
        sysconfig.get_paths()["include"],
    ]
    flags = [f"-I{path}" for path in paths]
    torch_include = Path(cpp_extension.include_paths()[0])
    if not (torch_include / "c10/cuda/impl/cuda_cmake_macros.h").exists():
        flags.append("-DC10_CUDA_NO_CMAKE_CONFIGURE_FILE")
    return flags


def _command(source: str, out_dir: Path) -> list[str]:
    path = str(REPO_ROOT / source)
    if source.endswith(".cu"):
        return [
            NVCC,
            "-c",
            path,
            "-o",
            str(out_dir / (Path(source).stem + ".o")),
            "-std=c++20",
            "-gencode=arch=compute_90,code=sm_90",
            *cpp_extension.COMMON_NVCC_FLAGS,
            *NVCC_FLAGS,
            *_include_flags(),
        ]
    return [CXX, "-fsyntax-only", "-std=c++20", "-Wall", *CXX_FLAGS, *_include_flags(), path]


@pytest.fixture(scope="module")
def compile_results(tmp_path_factory) -> dict[str, subprocess.CompletedProcess]:
    out_dir = tmp_path_factory.mktemp("nvcc")

    def run(source: str) -> subprocess.CompletedProcess:
        return subprocess.run(_command(source, out_dir), capture_output=True, text=True)

    with ThreadPoolExecutor(max_workers=max(2, os.cpu_count() or 2)) as pool:
        return dict(zip(SOURCES, pool.map(run, SOURCES)))


def test_sources_cover_every_cuda_file():
    csrc = (REPO_ROOT / "csrc").glob("fused_*")
    on_disk = {f"csrc/{p.name}" for p in csrc if p.suffix in (".cu", ".cpp")}
    assert on_disk == set(SOURCES)


@pytest.mark.skipif(CUDA_INCLUDE is None, reason="cuda_runtime.h not found: set CUDA_HOME")
@pytest.mark.parametrize("source", SOURCES)
def test_source_compiles(source, compile_results):
    if source.endswith(".cpp") and CXX is None:
        pytest.skip("no host C++ compiler (c++/g++) for the binding files")
    result = compile_results[source]
    assert result.returncode == 0, f"{source} failed to compile:\n{result.stderr[-6000:]}"
