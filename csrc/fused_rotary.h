// Host-side entry points of the fused rotary positional embedding (GPT-NeoX convention).
//
// Plain C++ over raw pointers (no PyTorch types); fused_rotary_binding.cpp calls these.
//
// Layout: x is (seq, batch, heads, head_dim) with any strides on the first three dims and a
// contiguous last dim; cos and sin are (seq, batch or 1, rot_dim) with a contiguous last dim
// (one table for the batch, or one per batch row when rows have their own positions); the
// output is a contiguous (seq, batch, heads, head_dim) tensor. With half = rot_dim / 2, x1 = x[..., :half] and
// x2 = x[..., half:rot_dim], the forward computes the "rotate_half" rotation
//   out[..., :half]        = x1 * cos[:, :half] - x2 * sin[:, :half]
//   out[..., half:rot_dim] = x2 * cos[:, half:] + x1 * sin[:, half:]
//   out[..., rot_dim:]     = x[..., rot_dim:]            (rotary_pct < 1: passed through)
// and the backward applies the transpose of that linear map to the output gradient.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "dtypes.h"

namespace megatron_kernels {

struct RotaryShape {
  int64_t seq;
  int64_t batch;
  int64_t heads;
  int head_dim;
  int rot_dim;           // even, 0 < rot_dim <= head_dim
  int64_t stride_seq;    // input strides in elements (the last dim has stride 1)
  int64_t stride_batch;
  int64_t stride_head;
  int64_t angle_stride_seq;    // cos/sin strides in elements (the last dim has stride 1)
  int64_t angle_stride_batch;  // 0: one table shared by the batch
};

// `dtype` is the type of input and output, `cos_dtype` that of cos and sin (the same as dtype,
// or float32). Returns cudaErrorInvalidValue for an unsupported shape, else the launch status.
cudaError_t rotary_forward(DType dtype, DType cos_dtype, const void* input, const void* cos,
                           const void* sin, void* output, RotaryShape shape, cudaStream_t stream);

// The gradient of rotary_forward with respect to its input (cos and sin are constants).
cudaError_t rotary_backward(DType dtype, DType cos_dtype, const void* grad_output,
                            const void* cos, const void* sin, void* grad_input, RotaryShape shape,
                            cudaStream_t stream);

}  // namespace megatron_kernels
