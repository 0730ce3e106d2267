// Fused rotary positional embedding, forward and backward: one block per (seq, batch) position,
// threadIdx.y walking the heads and threadIdx.x the rotary pairs (j, j + half) of a head, so
// each element is read once and written once; cos/sin rows are shared by all heads via L1.
#include "fused_rotary.h"
#include "kernel_utils.cuh"

namespace megatron_kernels {
namespace {

constexpr int kThreadsX = 32;  // along the head dim
constexpr int kThreadsY = 4;   // along the heads

template <typename T, typename TC, bool BACKWARD>
__global__ void __launch_bounds__(kThreadsX* kThreadsY)
    rotary_kernel(const T* __restrict__ input, const TC* __restrict__ cos,
                  const TC* __restrict__ sin, T* __restrict__ output, RotaryShape shape) {
  const int64_t s = blockIdx.x / shape.batch;
  const int64_t b = blockIdx.x % shape.batch;
  const int half = shape.rot_dim / 2;
  const int64_t angles = s * shape.angle_stride_seq + b * shape.angle_stride_batch;
  const TC* c = cos + angles;
  const TC* sn = sin + angles;
  for (int64_t h = threadIdx.y; h < shape.heads; h += blockDim.y) {
    const T* x = input + s * shape.stride_seq + b * shape.stride_batch + h * shape.stride_head;
    T* y = output + ((s * shape.batch + b) * shape.heads + h) * shape.head_dim;
    for (int j = threadIdx.x; j < half; j += blockDim.x) {
      const float x1 = to_float(x[j]);
      const float x2 = to_float(x[j + half]);
      const float cos1 = to_float(c[j]);
      const float cos2 = to_float(c[j + half]);
      const float sin1 = to_float(sn[j]);
      const float sin2 = to_float(sn[j + half]);
      if (BACKWARD) {
        // Transpose of the forward map: x holds the output gradient here.
        y[j] = from_float<T>(x1 * cos1 + x2 * sin2);
        y[j + half] = from_float<T>(x2 * cos2 - x1 * sin1);
      } else {
        y[j] = from_float<T>(x1 * cos1 - x2 * sin1);
        y[j + half] = from_float<T>(x2 * cos2 + x1 * sin2);
      }
    }
    for (int j = shape.rot_dim + threadIdx.x; j < shape.head_dim; j += blockDim.x) y[j] = x[j];
  }
}

template <typename T, typename TC, bool BACKWARD>
cudaError_t launch(const void* input, const void* cos, const void* sin, void* output,
                   const RotaryShape& shape, cudaStream_t stream) {
  const int64_t blocks = shape.seq * shape.batch;
  if (blocks > INT32_MAX) return cudaErrorInvalidValue;
  auto* kernel = &rotary_kernel<T, TC, BACKWARD>;
  MEGATRON_LAUNCH_KERNEL(kernel, dim3(static_cast<unsigned int>(blocks)),
                         dim3(kThreadsX, kThreadsY), stream, static_cast<const T*>(input),
                         static_cast<const TC*>(cos), static_cast<const TC*>(sin),
                         static_cast<T*>(output), shape);
  return cudaGetLastError();
}

// cos/sin are either the element type itself or float32.
template <typename T, bool BACKWARD>
cudaError_t launch_cos_typed(DType cos_dtype, const void* input, const void* cos, const void* sin,
                             void* output, const RotaryShape& shape, cudaStream_t stream) {
  if (cos_dtype == DType::kFloat32) {
    return launch<T, float, BACKWARD>(input, cos, sin, output, shape, stream);
  }
  return launch<T, T, BACKWARD>(input, cos, sin, output, shape, stream);
}

template <bool BACKWARD>
cudaError_t rotary(DType dtype, DType cos_dtype, const void* input, const void* cos,
                   const void* sin, void* output, const RotaryShape& shape, cudaStream_t stream) {
  if (shape.seq == 0 || shape.batch == 0 || shape.heads == 0) return cudaSuccess;
  const bool shape_ok = shape.seq > 0 && shape.batch > 0 && shape.heads > 0 &&
                        shape.rot_dim > 0 && shape.rot_dim % 2 == 0 &&
                        shape.rot_dim <= shape.head_dim;
  if (!shape_ok || (cos_dtype != dtype && cos_dtype != DType::kFloat32)) {
    return cudaErrorInvalidValue;
  }
  switch (dtype) {
    case DType::kFloat32:
      return launch<float, float, BACKWARD>(input, cos, sin, output, shape, stream);
    case DType::kFloat16:
      return launch_cos_typed<__half, BACKWARD>(cos_dtype, input, cos, sin, output, shape, stream);
    case DType::kBFloat16:
      return launch_cos_typed<__nv_bfloat16, BACKWARD>(cos_dtype, input, cos, sin, output, shape,
                                                       stream);
  }
  return cudaErrorInvalidValue;
}

}  // namespace

cudaError_t rotary_forward(DType dtype, DType cos_dtype, const void* input, const void* cos,
                           const void* sin, void* output, RotaryShape shape, cudaStream_t stream) {
  return rotary<false>(dtype, cos_dtype, input, cos, sin, output, shape, stream);
}

cudaError_t rotary_backward(DType dtype, DType cos_dtype, const void* grad_output,
                            const void* cos, const void* sin, void* grad_input, RotaryShape shape,
                            cudaStream_t stream) {
  return rotary<true>(dtype, cos_dtype, grad_output, cos, sin, grad_input, shape, stream);
}

}  // namespace megatron_kernels
