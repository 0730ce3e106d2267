"""Shared pieces of the GPU kernel tests: the skip marks and the error measure."""

from __future__ import annotations

import pytest
import torch

from megatron.kernels.loader import BUILD_HINT, kernel_available

CUDA = torch.cuda.is_available()
BOUND = 1e-3  # relative error allowed for every kernel output, fp16 and bf16 included


def kernel_marks(kernel: str) -> list:
    """Marks for a module of tests that run the compiled `kernel` on a GPU."""
    built = CUDA and kernel_available(kernel)
    return [
        pytest.mark.gpu,
        pytest.mark.skipif(
            not CUDA, reason="needs a CUDA GPU (torch.cuda.is_available() is False)"
        ),
        pytest.mark.skipif(
            CUDA and not built, reason=f"{kernel} extension not built: {BUILD_HINT}"
        ),
    ]


def rounded_relative_error(actual: torch.Tensor, expected: torch.Tensor) -> float:
    """||actual - expected rounded to actual's dtype|| / ||expected|| in float64.

    `expected` is the float64 reference; rounding it once to the output dtype gives the best
    any kernel could return, so this measures the kernel's own error. (Without the rounding,
    bfloat16 would fail 1e-3 by its storage alone: its unit roundoff is 2^-8.)
    """
    best = expected.to(actual.dtype).double()
    return ((actual.double() - best).norm() / expected.norm().clamp(min=1e-300)).item()
