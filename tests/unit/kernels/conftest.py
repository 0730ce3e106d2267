"""Fixtures of the kernel tests: the CPU emulation of the CUDA kernels, built once."""

from __future__ import annotations

import pytest

from tests.unit.kernels import emulated_kernels


@pytest.fixture(scope="session")
def emulated(tmp_path_factory) -> emulated_kernels.EmulatedKernels:
    if emulated_kernels.CXX is None:
        pytest.skip("g++ is needed to build the CPU emulation of the CUDA kernels")
    return emulated_kernels.build(tmp_path_factory.mktemp("emulation"))
