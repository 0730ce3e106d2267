// Backward entry point of the fused scaled-masked softmax: picks the element type, the causal
// variant, the vector width and the row layout, then launches softmax_detail::backward_kernel.
// The explicit mask is not needed here: the saved softmax output is already 0 where masked.
#include "fused_softmax.cuh"

namespace megatron_kernels {
namespace {

using softmax_detail::block_threads;
using softmax_detail::is_aligned;

template <typename T, bool CAUSAL>
struct BackwardLauncher {
  const T* grad_output;
  const T* softmax_output;
  T* grad_input;
  SoftmaxShape shape;
  float scale;
  cudaStream_t stream;

  template <int VEC, int ITEMS, int THREADS>
  cudaError_t run() const {
    const unsigned int blocks = softmax_detail::grid_blocks<THREADS>(shape.rows);
    if (blocks == 0) return cudaErrorInvalidValue;
    auto* kernel = &softmax_detail::backward_kernel<T, VEC, ITEMS, THREADS, CAUSAL>;
    MEGATRON_LAUNCH_KERNEL(kernel, blocks, block_threads(THREADS), stream, grad_output,
                           softmax_output, grad_input, shape, scale);
    return cudaGetLastError();
  }
};

template <typename T>
cudaError_t backward_typed(const void* grad_output, const void* softmax_output, void* grad_input,
                           bool causal, SoftmaxShape shape, float scale, cudaStream_t stream) {
  const bool vectorize = is_aligned(grad_output, 16) && is_aligned(softmax_output, 16) &&
                         is_aligned(grad_input, 16);
  const T* dy = static_cast<const T*>(grad_output);
  const T* y = static_cast<const T*>(softmax_output);
  T* dx = static_cast<T*>(grad_input);
  if (causal) {
    const BackwardLauncher<T, true> launcher{dy, y, dx, shape, scale, stream};
    return softmax_detail::dispatch_vector_width<T>(shape.sk, vectorize, launcher);
  }
  const BackwardLauncher<T, false> launcher{dy, y, dx, shape, scale, stream};
  return softmax_detail::dispatch_vector_width<T>(shape.sk, vectorize, launcher);
}

}  // namespace

cudaError_t scaled_softmax_backward(DType dtype, const void* grad_output,
                                    const void* softmax_output, void* grad_input, bool causal,
                                    SoftmaxShape shape, float scale, cudaStream_t stream) {
  if (shape.rows == 0) return cudaSuccess;
  if (shape.rows < 0 || shape.sq <= 0 || shape.sk <= 0 || shape.sk > kSoftmaxMaxColumns) {
    return cudaErrorInvalidValue;
  }
  switch (dtype) {
    case DType::kFloat32:
      return backward_typed<float>(grad_output, softmax_output, grad_input, causal, shape, scale,
                                   stream);
    case DType::kFloat16:
      return backward_typed<__half>(grad_output, softmax_output, grad_input, causal, shape, scale,
                                    stream);
    case DType::kBFloat16:
      return backward_typed<__nv_bfloat16>(grad_output, softmax_output, grad_input, causal, shape,
                                           scale, stream);
  }
  return cudaErrorInvalidValue;
}

}  // namespace megatron_kernels
