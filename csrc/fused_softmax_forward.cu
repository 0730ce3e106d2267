// Forward entry point of the fused scaled-masked softmax: picks the element type, the causal
// variant, the vector width and the row layout, then launches softmax_detail::forward_kernel.
#include "fused_softmax.cuh"

namespace megatron_kernels {
namespace {

using softmax_detail::block_threads;
using softmax_detail::is_aligned;

template <typename T, bool CAUSAL>
struct ForwardLauncher {
  const T* input;
  SoftmaxMask mask;
  T* output;
  SoftmaxShape shape;
  float scale;
  cudaStream_t stream;

  template <int VEC, int ITEMS, int THREADS>
  cudaError_t run() const {
    const unsigned int blocks = softmax_detail::grid_blocks<THREADS>(shape.rows);
    if (blocks == 0) return cudaErrorInvalidValue;
    auto* kernel = &softmax_detail::forward_kernel<T, VEC, ITEMS, THREADS, CAUSAL>;
    MEGATRON_LAUNCH_KERNEL(kernel, blocks, block_threads(THREADS), stream, input, mask, output,
                           shape, scale);
    return cudaGetLastError();
  }
};

template <typename T>
cudaError_t forward_typed(const void* input, SoftmaxMask mask, bool causal, void* output,
                          SoftmaxShape shape, float scale, cudaStream_t stream) {
  constexpr int kVec = 16 / sizeof(T);
  // Vector loads need every row start (and mask row start) aligned to one vector.
  const bool mask_aligned = mask.data == nullptr ||
                            (is_aligned(mask.data, kVec) && mask.stride_batch % kVec == 0 &&
                             mask.stride_query % kVec == 0);
  const bool vectorize = is_aligned(input, 16) && is_aligned(output, 16) && mask_aligned;
  const T* in = static_cast<const T*>(input);
  T* out = static_cast<T*>(output);
  if (causal) {
    const ForwardLauncher<T, true> launcher{in, mask, out, shape, scale, stream};
    return softmax_detail::dispatch_vector_width<T>(shape.sk, vectorize, launcher);
  }
  const ForwardLauncher<T, false> launcher{in, mask, out, shape, scale, stream};
  return softmax_detail::dispatch_vector_width<T>(shape.sk, vectorize, launcher);
}

}  // namespace

cudaError_t scaled_softmax_forward(DType dtype, const void* input, SoftmaxMask mask, bool causal,
                                   void* output, SoftmaxShape shape, float scale,
                                   cudaStream_t stream) {
  if (shape.rows == 0) return cudaSuccess;
  if (shape.rows < 0 || shape.sq <= 0 || shape.sk <= 0 || shape.sk > kSoftmaxMaxColumns ||
      shape.rows_per_batch <= 0) {
    return cudaErrorInvalidValue;
  }
  switch (dtype) {
    case DType::kFloat32:
      return forward_typed<float>(input, mask, causal, output, shape, scale, stream);
    case DType::kFloat16:
      return forward_typed<__half>(input, mask, causal, output, shape, scale, stream);
    case DType::kBFloat16:
      return forward_typed<__nv_bfloat16>(input, mask, causal, output, shape, scale, stream);
  }
  return cudaErrorInvalidValue;
}

}  // namespace megatron_kernels
