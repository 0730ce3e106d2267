"""How `setup.py` builds the fused CUDA kernels of `csrc/`, without ever breaking the install.

setup.py calls::

    from megatron.kernels.build import cuda_extensions, optional_build_ext
    setup(..., ext_modules=[*other_extensions, *cuda_extensions()],
          cmdclass={"build_ext": optional_build_ext(SetupsOwnBuildExt)})

`cuda_extensions()` returns the `CUDAExtension`s, or [] (with one logged reason) when PyTorch
is a CPU build, nvcc is missing, or no GPU architecture is known. Architectures come from
`TORCH_CUDA_ARCH_LIST` (e.g. "8.0;9.0+PTX", names like "Hopper" allowed) or else from the GPUs
visible at build time. `optional_build_ext()` is torch's `BuildExtension` except that a kernel
extension that fails to compile is skipped with a warning; the trainer then uses the PyTorch
fallback. `python -m megatron.kernels.build` builds the kernels in place for development.
"""

from __future__ import annotations

import logging
import os
import re
from pathlib import Path

logger = logging.getLogger(__name__)

REPO_ROOT = Path(__file__).resolve().parents[2]
ARCH_ENV = "TORCH_CUDA_ARCH_LIST"

# importable module name -> its sources, relative to the repository root
KERNEL_SOURCES: dict[str, tuple[str, ...]] = {
    "megatron.kernels._fused_softmax_cuda": (
        "csrc/fused_softmax_binding.cpp",
        "csrc/fused_softmax_forward.cu",
        "csrc/fused_softmax_backward.cu",
    ),
    "megatron.kernels._fused_rotary_cuda": (
        "csrc/fused_rotary_binding.cpp",
        "csrc/fused_rotary.cu",
    ),
}
CXX_FLAGS = ["-O3"]
NVCC_FLAGS = ["-O3", "-lineinfo"]

NAMED_ARCHES = {
    "Volta": "7.0",
    "Turing": "7.5",
    "Ampere": "8.0;8.6",
    "Ada": "8.9",
    "Hopper": "9.0",
    "Blackwell": "10.0;12.0",
}
_ARCH = re.compile(r"^(\d+)\.(\d+)(a?)(\+PTX)?$")


def gencode_flags(arch_list: str) -> list[str]:
    """nvcc -gencode flags for a TORCH_CUDA_ARCH_LIST-style string such as "8.0;9.0+PTX".

    Entries are separated by ';' or spaces; "+PTX" also embeds PTX for newer GPUs. Raises
    ValueError naming the entry and the accepted forms.
    """
    for name, arches in NAMED_ARCHES.items():
        arch_list = arch_list.replace(name, arches)
    flags: list[str] = []
    for entry in re.split(r"[;\s]+", arch_list.strip()):
        match = _ARCH.match(entry)
        if match is None:
            raise ValueError(
                f"{ARCH_ENV}: cannot read architecture {entry!r} in {arch_list!r}; use "
                f"compute capabilities like '8.0;9.0+PTX' or names {sorted(NAMED_ARCHES)}"
            )
        major, minor, suffix, ptx = match.groups()
        number = f"{major}{minor}{suffix}"
        flags.append(f"-gencode=arch=compute_{number},code=sm_{number}")
        if ptx:
            flags.append(f"-gencode=arch=compute_{number},code=compute_{number}")
    return sorted(set(flags))


def target_arch_list() -> str | None:
    """TORCH_CUDA_ARCH_LIST if set, else the capabilities of the visible GPUs, else None."""
    requested = os.environ.get(ARCH_ENV, "").strip()
    if requested and requested != "native":
        return requested
    import torch

    if not torch.cuda.is_available():
        return None
    capabilities = {torch.cuda.get_device_capability(i) for i in range(torch.cuda.device_count())}
    return ";".join(f"{major}.{minor}" for major, minor in sorted(capabilities))


def _skip_reason() -> str | None:
    import torch
    from torch.utils import cpp_extension

    if torch.version.cuda is None:
        return f"PyTorch {torch.__version__} is a CPU-only build"
    if cpp_extension.CUDA_HOME is None:
        return "no CUDA toolkit found (put nvcc on PATH or set CUDA_HOME)"
    return None


def _relative_source(source: str, root: Path) -> str:
    # setuptools wants sources relative to the directory setup.py runs in.
    return os.path.relpath(root / source)


def _build_cuda_extensions(root: Path) -> list:
    reason = _skip_reason()
    arch_list = None if reason else target_arch_list()
    if reason is None and arch_list is None:
        reason = f"no GPU is visible and {ARCH_ENV} is unset (e.g. {ARCH_ENV}='8.0;9.0')"
    if reason is not None:
        logger.warning("fused CUDA kernels not built: %s; the PyTorch fallback is used.", reason)
        return []
    from torch.utils.cpp_extension import CUDAExtension

    nvcc_flags = NVCC_FLAGS + gencode_flags(arch_list)
    logger.info("building fused CUDA kernels for %s", arch_list)
    return [
        CUDAExtension(
            name,
            [_relative_source(source, root) for source in sources],
            include_dirs=[str(root / "csrc")],
            extra_compile_args={"cxx": list(CXX_FLAGS), "nvcc": list(nvcc_flags)},
            optional=True,
        )
        for name, sources in KERNEL_SOURCES.items()
    ]


def cuda_extensions(root: str | Path | None = None) -> list:
    """The kernel `CUDAExtension`s for setup.py's ext_modules, or [] when they cannot build.

    Never raises: any problem (including an unreadable TORCH_CUDA_ARCH_LIST) is logged as a
    warning naming the reason, and the install goes on without the kernels.
    """
    try:
        return _build_cuda_extensions(Path(root) if root is not None else REPO_ROOT)
    except Exception as error:  # a kernel problem must never break installing the package
        logger.warning("fused CUDA kernels not built: %s; the PyTorch fallback is used.", error)
        return []


def optional_build_ext(base: type | None = None) -> type:
    """torch's BuildExtension, tolerant of failures of the kernel extensions (not of others).

    `base`, a setuptools `build_ext` subclass (say setup.py's own), is mixed in after
    BuildExtension so its behaviour applies to the other extensions.
    """
    from torch.utils.cpp_extension import BuildExtension

    bases = (BuildExtension,)
    if base is not None and not issubclass(BuildExtension, base):
        bases = (BuildExtension, base)

    class OptionalBuildExtension(*bases):
        def build_extensions(self):
            try:
                super().build_extensions()
            except Exception as error:  # e.g. nvcc and PyTorch disagree on the CUDA version
                kernels = [ext for ext in self.extensions if ext.name in KERNEL_SOURCES]
                if not kernels:
                    raise
                _warn_skipped([ext.name for ext in kernels], error)
                self.extensions = [ext for ext in self.extensions if ext not in kernels]
                if self.extensions:
                    super().build_extensions()

        def build_extension(self, ext):
            try:
                super().build_extension(ext)
            except Exception as error:
                if ext.name not in KERNEL_SOURCES:
                    raise
                _warn_skipped([ext.name], error)
                ext.optional = True  # lets an in-place build skip copying the missing file

    return OptionalBuildExtension


def _warn_skipped(names: list[str], error: Exception) -> None:
    logger.warning(
        "building %s failed (%s: %s); installing without them, the PyTorch fallback is used.",
        ", ".join(names),
        type(error).__name__,
        error,
    )


def build_inplace(root: str | Path | None = None) -> list[str]:
    """Build the kernels next to their Python modules (like `setup.py build_ext --inplace`).

    Returns the names of the extension modules that were built.
    """
    from setuptools import Distribution

    root = Path(root) if root is not None else REPO_ROOT
    previous = Path.cwd()
    os.chdir(root)
    try:
        extensions = cuda_extensions(root)
        if not extensions:
            return []
        distribution = Distribution(
            {
                "name": "megatron-kernels",
                "ext_modules": extensions,
                "cmdclass": {"build_ext": optional_build_ext()},
            }
        )
        command = distribution.get_command_obj("build_ext")
        command.inplace = True
        distribution.run_command("build_ext")
        built = [ext.name for ext in command.extensions]
        return [name for name in built if Path(command.get_ext_fullpath(name)).exists()]
    finally:
        os.chdir(previous)


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    built = build_inplace()
    print(f"built: {', '.join(built) if built else 'nothing (see the warnings above)'}")
