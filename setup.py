"""Install the `megatron` package and build its compiled parts where the machine allows.

    pip install --no-build-isolation -e .

Compiled parts: the dataset sample-index helper (C++/pybind11, always attempted) and the fused
CUDA kernels (only where CUDA and nvcc are usable; TORCH_CUDA_ARCH_LIST picks the GPU
architectures). Each has a pure-Python fallback, so a failed build never fails the install:
the trainer says once at run time which fallback it uses. `--no-build-isolation` lets the build
use the installed torch instead of resolving another one.
"""

from __future__ import annotations

import sys
from pathlib import Path

from setuptools import find_packages, setup
from setuptools.command.build_ext import build_ext

ROOT = Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT))


class OptionalBuildExt(build_ext):
    """Build every extension it can; report and skip the ones that fail."""

    def run(self):
        try:
            super().run()
        except Exception as err:  # noqa: BLE001 - the compiled parts are optional
            print(f"warning: compiled extensions not built ({err}); using fallbacks")

    def build_extension(self, ext):
        try:
            super().build_extension(ext)
        except Exception as err:  # noqa: BLE001
            print(f"warning: extension {ext.name} not built ({err}); its fallback will be used")


def extensions() -> tuple[list, type]:
    exts: list = []
    cmdclass = OptionalBuildExt
    try:
        from megatron.data.helpers_build import data_helpers_extension

        exts.append(data_helpers_extension())
    except Exception as err:  # noqa: BLE001 - pybind11/numpy missing: numpy fallback
        print(f"warning: dataset index helper not configured ({err})")
    try:
        from megatron.kernels.build import cuda_extensions, optional_build_ext

        cuda = cuda_extensions()
        if cuda:
            exts.extend(cuda)
            cmdclass = optional_build_ext(OptionalBuildExt)
    except Exception as err:  # noqa: BLE001 - no torch/CUDA: PyTorch fallbacks
        print(f"warning: CUDA kernels not configured ({err})")
    return exts, cmdclass


def requirements(name: str = "requirements.txt") -> list[str]:
    """The requirements a file of `requirements/` lists itself (its `-r` includes left out)."""
    lines = (ROOT / "requirements" / name).read_text().splitlines()
    return [line.strip() for line in lines if line.strip() and not line.startswith(("#", "-"))]


# The extras are the optional requirement files, so `pip install -e ".[tensorboard]"` and
# `pip install -r requirements/requirements-tensorboard.txt` install the same thing.
OPTIONAL = {
    name: requirements(f"requirements-{name}.txt")
    for name in ("tensorboard", "wandb", "comet", "eval")
}


ext_modules, build_cmd = extensions()

setup(
    name="megatron-neox",
    version="0.1.0",
    description="DeepSpeed-based, Megatron-style 3D-parallel trainer for GPT language models",
    long_description=(ROOT / "README.md").read_text(encoding="utf-8"),
    long_description_content_type="text/markdown",
    python_requires=">=3.10",
    packages=find_packages(include=["megatron", "megatron.*"]),
    py_modules=[],
    install_requires=requirements(),
    extras_require={
        **OPTIONAL,
        "dev": requirements("requirements-dev.txt") + sum(OPTIONAL.values(), []),
        # CUDA kernels built against the installed torch: never part of `dev` (CPU machines).
        "mamba": requirements("requirements-mamba.txt"),
    },
    ext_modules=ext_modules,
    cmdclass={"build_ext": build_cmd},
    entry_points={
        "console_scripts": [
            "megatron-preprocess=megatron.data.preprocess:main",
        ]
    },
    zip_safe=False,
)
