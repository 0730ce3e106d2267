"""Finds the compiled CUDA extensions of `csrc/`, or says once that the fallback is used.

The extensions are built by `setup.py` (see `megatron.kernels.build`) into this package as
`_fused_softmax_cuda` and `_fused_rotary_cuda`. Importing one registers its operators under
`torch.ops.megatron_fused_softmax` / `torch.ops.megatron_fused_rotary`; the modules have no
other attributes. A missing or broken extension is not an error: the caller falls back to the
pure-PyTorch reference, and this module logs one warning per kernel saying so.
"""

from __future__ import annotations

import functools
import importlib
import logging
from types import ModuleType

logger = logging.getLogger(__name__)

# kernel name -> importable extension module (built from the csrc/ files named in build.py)
EXTENSION_MODULES: dict[str, str] = {
    "softmax": "megatron.kernels._fused_softmax_cuda",
    "rotary": "megatron.kernels._fused_rotary_cuda",
}

BUILD_HINT = (
    "build them with `pip install --no-build-isolation -e .` (or `python -m "
    "megatron.kernels.build`) on a machine with a CUDA build of PyTorch and nvcc"
)


@functools.cache
def load_extension(kernel: str) -> ModuleType | None:
    """Import the compiled extension of `kernel` ("softmax" or "rotary"), or return None.

    The first call for a kernel whose extension cannot be imported logs a warning naming the
    kernel and the reason; later calls return None silently (the result is cached).
    """
    if kernel not in EXTENSION_MODULES:
        raise ValueError(
            f"unknown fused kernel {kernel!r}; valid kernels: {sorted(EXTENSION_MODULES)}"
        )
    module_name = EXTENSION_MODULES[kernel]
    try:
        return importlib.import_module(module_name)
    except (ImportError, OSError) as error:
        logger.warning(
            "fused %s kernel unavailable (%s: %s); using the PyTorch reference implementation "
            "instead, which is slower. To use the CUDA kernels, %s.",
            kernel,
            module_name,
            error,
            BUILD_HINT,
        )
        return None


def kernel_available(kernel: str) -> bool:
    """True when the compiled extension of `kernel` imports (logs once when it does not)."""
    return load_extension(kernel) is not None


def extension_status() -> dict[str, bool]:
    """Whether each kernel's compiled extension is importable, e.g. for a startup log line."""
    return {kernel: kernel_available(kernel) for kernel in EXTENSION_MODULES}
