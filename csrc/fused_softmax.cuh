// Kernels of the fused scaled-masked softmax (forward and backward) and the launch-layout
// dispatch shared by fused_softmax_forward.cu and fused_softmax_backward.cu.
//
// Row layout: a row of sk elements is spread over THREADS threads that each hold ITEMS
// elements in registers, as ITEMS / VEC vectors of VEC consecutive elements: thread t owns
// columns [(i * THREADS + t) * VEC, +VEC) for i in [0, ITEMS / VEC), so consecutive threads
// touch consecutive 16-byte chunks (coalesced). A one-warp row shares a 128-thread block with
// three other rows; a longer row gets a block of its own and reduces through shared memory.
// The whole row stays in registers, so the input is read once and the output written once.
#pragma once

#include <cmath>

#include "fused_softmax.h"
#include "kernel_utils.cuh"

namespace megatron_kernels {
namespace softmax_detail {

// Only one-warp rows share a block: a longer row reduces through the block's shared memory and
// barriers, which must then belong to that row alone.
constexpr int block_threads(int threads_per_row) {
  return threads_per_row == kWarpSize ? 4 * kWarpSize : threads_per_row;
}

inline bool is_aligned(const void* pointer, int bytes) {
  return reinterpret_cast<uintptr_t>(pointer) % bytes == 0;
}

template <typename T, int VEC, int ITEMS, int THREADS, bool CAUSAL>
__global__ void __launch_bounds__(block_threads(THREADS))
    forward_kernel(const T* __restrict__ input, SoftmaxMask mask, T* __restrict__ output,
                   SoftmaxShape shape, float scale) {
  constexpr int kRowsPerBlock = block_threads(THREADS) / THREADS;
  constexpr int kVectors = ITEMS / VEC;
  __shared__ float scratch[THREADS / kWarpSize];

  const int t = threadIdx.x % THREADS;
  const int64_t row = int64_t(blockIdx.x) * kRowsPerBlock + threadIdx.x / THREADS;
  if (row >= shape.rows) return;  // only whole one-warp rows leave here, never a block row
  const int query = int(row % shape.sq);
  // Columns at or past `limit` are masked without being read (the causal triangle).
  const int limit = CAUSAL ? min(query + 1, shape.sk) : shape.sk;
  const T* x = input + row * shape.sk;
  const uint8_t* m = mask.data == nullptr ? nullptr
                                          : mask.data + (row / shape.rows_per_batch) *
                                                            mask.stride_batch +
                                                query * mask.stride_query;

  float v[ITEMS];
  float row_max = -INFINITY;
#pragma unroll
  for (int i = 0; i < kVectors; ++i) {
    const int col = (i * THREADS + t) * VEC;
    if (col < limit) {
      alignas(sizeof(T) * VEC) T xv[VEC];
      alignas(VEC) uint8_t mv[VEC] = {};
      copy_vector<T, VEC>(xv, x + col);
      if (m != nullptr) copy_vector<uint8_t, VEC>(mv, m + col);
#pragma unroll
      for (int k = 0; k < VEC; ++k) {
        const bool keep = col + k < limit && mv[k] == 0;
        v[i * VEC + k] = keep ? to_float(xv[k]) * scale : -INFINITY;
        row_max = fmaxf(row_max, v[i * VEC + k]);
      }
    } else {
#pragma unroll
      for (int k = 0; k < VEC; ++k) v[i * VEC + k] = -INFINITY;
    }
  }
  row_max = row_reduce<THREADS>(row_max, MaxOp(), -INFINITY, scratch);

  // A fully masked row has row_max = -inf: shifting by 0 keeps every exp at 0, so the row
  // sums to 0 and is written as zeros instead of NaN.
  const float shift = row_max == -INFINITY ? 0.f : row_max;
  float sum = 0.f;
#pragma unroll
  for (int j = 0; j < ITEMS; ++j) {
    v[j] = __expf(v[j] - shift);
    sum += v[j];
  }
  sum = row_reduce<THREADS>(sum, SumOp(), 0.f, scratch);
  const float inverse = sum > 0.f ? 1.f / sum : 0.f;

  T* y = output + row * shape.sk;
#pragma unroll
  for (int i = 0; i < kVectors; ++i) {
    const int col = (i * THREADS + t) * VEC;
    if (col < shape.sk) {
      alignas(sizeof(T) * VEC) T out[VEC];
#pragma unroll
      for (int k = 0; k < VEC; ++k) out[k] = from_float<T>(v[i * VEC + k] * inverse);
      copy_vector<T, VEC>(y + col, out);
    }
  }
}

template <typename T, int VEC, int ITEMS, int THREADS, bool CAUSAL>
__global__ void __launch_bounds__(block_threads(THREADS))
    backward_kernel(const T* __restrict__ grad_output, const T* __restrict__ softmax_output,
                    T* __restrict__ grad_input, SoftmaxShape shape, float scale) {
  constexpr int kRowsPerBlock = block_threads(THREADS) / THREADS;
  constexpr int kVectors = ITEMS / VEC;
  __shared__ float scratch[THREADS / kWarpSize];

  const int t = threadIdx.x % THREADS;
  const int64_t row = int64_t(blockIdx.x) * kRowsPerBlock + threadIdx.x / THREADS;
  if (row >= shape.rows) return;
  const int query = int(row % shape.sq);
  const int limit = CAUSAL ? min(query + 1, shape.sk) : shape.sk;
  const int64_t offset = row * shape.sk;

  // Kept in the storage type: two rows of ITEMS floats would not fit in registers at 1024
  // threads per block.
  alignas(16) T dy[ITEMS];
  alignas(16) T y[ITEMS];
  float dot = 0.f;
#pragma unroll
  for (int i = 0; i < kVectors; ++i) {
    const int col = (i * THREADS + t) * VEC;
    if (col < limit) {
      copy_vector<T, VEC>(dy + i * VEC, grad_output + offset + col);
      copy_vector<T, VEC>(y + i * VEC, softmax_output + offset + col);
#pragma unroll
      for (int k = 0; k < VEC; ++k) {
        if (col + k >= limit) {  // inside the causal triangle: y = 0 by definition
          dy[i * VEC + k] = from_float<T>(0.f);
          y[i * VEC + k] = from_float<T>(0.f);
        }
        dot += to_float(dy[i * VEC + k]) * to_float(y[i * VEC + k]);
      }
    } else {
#pragma unroll
      for (int k = 0; k < VEC; ++k) {
        dy[i * VEC + k] = from_float<T>(0.f);
        y[i * VEC + k] = from_float<T>(0.f);
      }
    }
  }
  dot = row_reduce<THREADS>(dot, SumOp(), 0.f, scratch);

#pragma unroll
  for (int i = 0; i < kVectors; ++i) {
    const int col = (i * THREADS + t) * VEC;
    if (col < shape.sk) {
      alignas(sizeof(T) * VEC) T out[VEC];
#pragma unroll
      for (int k = 0; k < VEC; ++k) {
        const float yk = to_float(y[i * VEC + k]);
        out[k] = from_float<T>(scale * yk * (to_float(dy[i * VEC + k]) - dot));
      }
      copy_vector<T, VEC>(grad_input + offset + col, out);
    }
  }
}

// Calls launcher.run<VEC, ITEMS, THREADS>() with the narrowest row layout covering sk.
template <int VEC, typename Launcher>
cudaError_t dispatch_layout(int sk, const Launcher& launcher) {
  if (sk <= 16 * 32) return launcher.template run<VEC, 16, 32>();
  if (sk <= 16 * 64) return launcher.template run<VEC, 16, 64>();
  if (sk <= 16 * 128) return launcher.template run<VEC, 16, 128>();
  if (sk <= 16 * 256) return launcher.template run<VEC, 16, 256>();
  if (sk <= 16 * 512) return launcher.template run<VEC, 16, 512>();
  if (sk <= 16 * 1024) return launcher.template run<VEC, 16, 1024>();
  if (sk <= 32 * 1024) return launcher.template run<VEC, 32, 1024>();
  return cudaErrorInvalidValue;
}

// 16-byte vectors when every row start is 16-byte aligned, else element by element.
template <typename T, typename Launcher>
cudaError_t dispatch_vector_width(int sk, bool vectorize, const Launcher& launcher) {
  constexpr int kVec = 16 / sizeof(T);
  if (vectorize && sk % kVec == 0) return dispatch_layout<kVec>(sk, launcher);
  return dispatch_layout<1>(sk, launcher);
}

// Grid size for `rows` rows laid out THREADS threads per row; 0 when the grid would overflow.
template <int THREADS>
unsigned int grid_blocks(int64_t rows) {
  constexpr int kRowsPerBlock = block_threads(THREADS) / THREADS;
  const int64_t blocks = (rows + kRowsPerBlock - 1) / kRowsPerBlock;
  return blocks > INT32_MAX ? 0u : static_cast<unsigned int>(blocks);
}

}  // namespace softmax_detail
}  // namespace megatron_kernels
