"""Tests of megatron.kernels: CPU fallbacks, build helpers, nvcc compile check, GPU kernels."""
