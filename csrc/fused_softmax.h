// Host-side entry points of the fused scaled-masked softmax kernels.
//
// Plain C++ over raw pointers (no PyTorch types), so the kernels compile with CUDA headers
// alone; fused_softmax_binding.cpp turns PyTorch tensors into these calls.
//
// Layout: `rows` contiguous rows of `sk` elements; row r is query (r % sq) of batch entry
// (r / rows_per_batch), i.e. a contiguous (b, np, sq, sk) tensor has rows = b * np * sq and
// rows_per_batch = np * sq. The output is softmax(scale * x) along each row, computed in fp32,
// with masked positions set to exactly 0; a row with every position masked is all zeros.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "dtypes.h"

namespace megatron_kernels {

// Longest row (sk) the softmax kernels accept; longer rows must use the PyTorch fallback.
constexpr int kSoftmaxMaxColumns = 32768;

struct SoftmaxShape {
  int64_t rows;            // number of rows (numel / sk)
  int64_t rows_per_batch;  // rows per batch entry (np * sq), to find a row's mask
  int sq;                  // queries per (batch, head): a row's query index is row % sq
  int sk;                  // keys: the row length
};

// An optional boolean mask (one byte per element, nonzero = masked) of logical shape
// (b or 1, 1, sq, sk) with a contiguous last dimension.
struct SoftmaxMask {
  const uint8_t* data;   // nullptr: no explicit mask
  int64_t stride_batch;  // elements between batch entries; 0 broadcasts one mask over the batch
  int64_t stride_query;  // elements between query rows; 0 broadcasts one row over the queries
};

// output = softmax(scale * input) with key j of query i masked where mask[i, j] is set and, if
// `causal`, where j > i. `input` and `output` hold shape.rows * shape.sk elements of `dtype`.
// Returns cudaErrorInvalidValue for a shape outside the supported range, else the launch status.
cudaError_t scaled_softmax_forward(DType dtype, const void* input, SoftmaxMask mask, bool causal,
                                   void* output, SoftmaxShape shape, float scale,
                                   cudaStream_t stream);

// grad_input = scale * y * (grad_output - sum_j(grad_output * y)) with y = softmax_output.
// With `causal`, keys j > i are neither read nor used and their gradient is written as 0.
cudaError_t scaled_softmax_backward(DType dtype, const void* grad_output,
                                    const void* softmax_output, void* grad_input, bool causal,
                                    SoftmaxShape shape, float scale, cudaStream_t stream);

}  // namespace megatron_kernels
