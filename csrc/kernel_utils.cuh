// Device helpers shared by the fused kernels: fp32 <-> storage-type conversion, vector
// loads/stores, and warp/block reductions.
//
// Only CUDA headers are included here (no PyTorch), so every kernel file compiles with a
// plain `nvcc -c`. The PyTorch build passes -D__CUDA_NO_HALF_OPERATORS__ and friends, so the
// code below converts explicitly and never relies on __half/__nv_bfloat16 operators.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

// Kernel launch, spelled as a macro so that the CPU emulation in tests/unit/kernels/emulation,
// which compiles these files with a host compiler, can run kernels without the <<<>>> syntax.
// `kernel` must be a single token: take a pointer to a template instance first.
#ifndef MEGATRON_LAUNCH_KERNEL
#define MEGATRON_LAUNCH_KERNEL(kernel, grid, block, stream, ...) \
  kernel<<<(grid), (block), 0, (stream)>>>(__VA_ARGS__)
#endif

namespace megatron_kernels {

constexpr int kWarpSize = 32;

// ---- storage type <-> fp32 ------------------------------------------------------------------

template <typename T>
__device__ __forceinline__ float to_float(T x);

template <>
__device__ __forceinline__ float to_float<float>(float x) {
  return x;
}

template <>
__device__ __forceinline__ float to_float<__half>(__half x) {
  return __half2float(x);
}

template <>
__device__ __forceinline__ float to_float<__nv_bfloat16>(__nv_bfloat16 x) {
  return __bfloat162float(x);
}

template <typename T>
__device__ __forceinline__ T from_float(float x);

template <>
__device__ __forceinline__ float from_float<float>(float x) {
  return x;
}

template <>
__device__ __forceinline__ __half from_float<__half>(float x) {
  return __float2half_rn(x);
}

template <>
__device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float x) {
  return __float2bfloat16_rn(x);
}

// ---- vector memory access ---------------------------------------------------------------------

// An unsigned type of exactly BYTES bytes, used to move BYTES in one memory instruction.
template <int BYTES>
struct RawBits;
template <>
struct RawBits<1> {
  using type = uint8_t;
};
template <>
struct RawBits<2> {
  using type = uint16_t;
};
template <>
struct RawBits<4> {
  using type = uint32_t;
};
template <>
struct RawBits<8> {
  using type = uint2;
};
template <>
struct RawBits<16> {
  using type = uint4;
};

// Copies N consecutive elements with a single load/store. Both pointers must be aligned to
// N * sizeof(T) bytes; the host side checks this before choosing a vectorised launch.
template <typename T, int N>
__device__ __forceinline__ void copy_vector(T* dst, const T* src) {
  using Raw = typename RawBits<sizeof(T) * N>::type;
  *reinterpret_cast<Raw*>(dst) = *reinterpret_cast<const Raw*>(src);
}

// ---- reductions -------------------------------------------------------------------------------

struct MaxOp {
  __device__ __forceinline__ float operator()(float a, float b) const { return fmaxf(a, b); }
};

struct SumOp {
  __device__ __forceinline__ float operator()(float a, float b) const { return a + b; }
};

// Reduces over all 32 lanes of the calling warp; every lane gets the result.
template <typename Op>
__device__ __forceinline__ float warp_reduce(float value, Op op) {
#pragma unroll
  for (int offset = kWarpSize / 2; offset > 0; offset /= 2) {
    value = op(value, __shfl_xor_sync(0xffffffffu, value, offset));
  }
  return value;
}

// Reduces over the THREADS threads that share one row; every thread gets the result.
// THREADS is either one warp (no shared memory, no barrier) or the whole block, in which case
// `scratch` must hold THREADS / 32 floats and every thread of the block must call this.
template <int THREADS, typename Op>
__device__ __forceinline__ float row_reduce(float value, Op op, float identity, float* scratch) {
  value = warp_reduce(value, op);
  if constexpr (THREADS > kWarpSize) {
    constexpr int kWarps = THREADS / kWarpSize;
    const int warp = threadIdx.x / kWarpSize;
    const int lane = threadIdx.x % kWarpSize;
    __syncthreads();  // the previous reduction may still be reading `scratch`
    if (lane == 0) scratch[warp] = value;
    __syncthreads();
    value = lane < kWarps ? scratch[lane] : identity;
    value = warp_reduce(value, op);
  }
  return value;
}

}  // namespace megatron_kernels
