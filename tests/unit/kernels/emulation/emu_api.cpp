// C entry points over the kernels' host functions, for ctypes in test_kernel_emulation.py.
#include "fused_rotary.h"
#include "fused_softmax.h"

using megatron_kernels::DType;

extern "C" int emu_softmax_forward(int dtype, const void* input, const void* mask,
                                   int64_t mask_stride_batch, int64_t mask_stride_query,
                                   int causal, void* output, int64_t rows, int64_t rows_per_batch,
                                   int sq, int sk, float scale) {
  const megatron_kernels::SoftmaxMask m{static_cast<const uint8_t*>(mask), mask_stride_batch,
                                        mask_stride_query};
  const megatron_kernels::SoftmaxShape shape{rows, rows_per_batch, sq, sk};
  return megatron_kernels::scaled_softmax_forward(static_cast<DType>(dtype), input, m, causal != 0,
                                                  output, shape, scale, nullptr);
}

extern "C" int emu_softmax_backward(int dtype, const void* grad_output, const void* softmax_output,
                                    void* grad_input, int causal, int64_t rows, int sq, int sk,
                                    float scale) {
  const megatron_kernels::SoftmaxShape shape{rows, rows, sq, sk};
  return megatron_kernels::scaled_softmax_backward(static_cast<DType>(dtype), grad_output,
                                                   softmax_output, grad_input, causal != 0, shape,
                                                   scale, nullptr);
}

extern "C" int emu_rotary(int backward, int dtype, int cos_dtype, const void* input,
                          const void* cos, const void* sin, void* output, int64_t seq,
                          int64_t batch, int64_t heads, int head_dim, int rot_dim,
                          int64_t stride_seq, int64_t stride_batch, int64_t stride_head,
                          int64_t angle_stride_seq, int64_t angle_stride_batch) {
  const megatron_kernels::RotaryShape shape{seq,        batch,        heads,
                                            head_dim,   rot_dim,      stride_seq,
                                            stride_batch, stride_head, angle_stride_seq,
                                            angle_stride_batch};
  const auto type = static_cast<DType>(dtype);
  const auto cos_type = static_cast<DType>(cos_dtype);
  if (backward) {
    return megatron_kernels::rotary_backward(type, cos_type, input, cos, sin, output, shape,
                                             nullptr);
  }
  return megatron_kernels::rotary_forward(type, cos_type, input, cos, sin, output, shape, nullptr);
}
