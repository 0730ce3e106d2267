// PyTorch face of the fused rotary embedding: checks tensors, then calls the raw-pointer entry
// points of fused_rotary.h on the current CUDA stream.
//
// Importing the extension module `megatron.kernels._fused_rotary_cuda` registers
//   torch.ops.megatron_fused_rotary.forward(input, cos, sin, output)
//   torch.ops.megatron_fused_rotary.backward(grad_output, cos, sin, grad_input)
// with input (seq, batch, heads, head_dim), cos/sin (seq, batch or 1, 1, rot_dim) or
// (seq, rot_dim), and a contiguous output of the input's shape that is written completely.
#include <Python.h>

#include <ATen/core/Tensor.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>

#include "fused_rotary.h"

namespace {

using megatron_kernels::DType;
using megatron_kernels::RotaryShape;

DType kernel_dtype(const at::Tensor& tensor, const char* name) {
  switch (tensor.scalar_type()) {
    case at::kFloat:
      return DType::kFloat32;
    case at::kHalf:
      return DType::kFloat16;
    case at::kBFloat16:
      return DType::kBFloat16;
    default:
      TORCH_CHECK(false, "megatron_fused_rotary: ", name, " has dtype ", tensor.scalar_type(),
                  "; the kernel supports float32, float16 and bfloat16");
  }
}

void check_angles(const at::Tensor& angles, const char* name, const at::Tensor& input) {
  TORCH_CHECK(angles.device() == input.device(), "megatron_fused_rotary: ", name, " is on ",
              angles.device(), " but the input is on ", input.device());
  TORCH_CHECK(angles.scalar_type() == input.scalar_type() || angles.scalar_type() == at::kFloat,
              "megatron_fused_rotary: ", name, " has dtype ", angles.scalar_type(),
              "; it must be float32 or the input's dtype ", input.scalar_type());
  const bool table_4d = angles.dim() == 4 && angles.size(2) == 1 &&
                       (angles.size(1) == 1 || angles.size(1) == input.size(1));
  const bool shape_ok = (angles.dim() == 2 || table_4d) && angles.size(0) == input.size(0);
  TORCH_CHECK(shape_ok, "megatron_fused_rotary: ", name, " has shape ", angles.sizes(),
              "; expected (seq, batch or 1, 1, rot_dim) or (seq, rot_dim) with seq = ",
              input.size(0), " and batch = ", input.size(1));
  TORCH_CHECK(angles.is_contiguous(), "megatron_fused_rotary: ", name, " must be contiguous");
}

RotaryShape rotary_shape(const at::Tensor& input, const at::Tensor& cos, const at::Tensor& sin,
                         const at::Tensor& output) {
  TORCH_CHECK(input.is_cuda(), "megatron_fused_rotary: input must be a CUDA tensor");
  TORCH_CHECK(input.dim() == 4, "megatron_fused_rotary: input must be (seq, batch, heads, "
              "head_dim), got shape ", input.sizes());
  TORCH_CHECK(input.size(3) <= 1 || input.stride(3) == 1, "megatron_fused_rotary: the input's "
              "last dim must be contiguous (stride 1), got strides ", input.strides());
  check_angles(cos, "cos", input);
  check_angles(sin, "sin", input);
  TORCH_CHECK(cos.sizes() == sin.sizes() && cos.scalar_type() == sin.scalar_type(),
              "megatron_fused_rotary: cos ", cos.sizes(), " ", cos.scalar_type(),
              " and sin ", sin.sizes(), " ", sin.scalar_type(), " must match");
  const int64_t rot_dim = cos.size(-1);
  TORCH_CHECK(rot_dim > 0 && rot_dim % 2 == 0 && rot_dim <= input.size(3),
              "megatron_fused_rotary: rot_dim = ", rot_dim, " must be even and in (0, head_dim = ",
              input.size(3), "]");
  TORCH_CHECK(output.device() == input.device() && output.scalar_type() == input.scalar_type() &&
                  output.sizes() == input.sizes() && output.is_contiguous(),
              "megatron_fused_rotary: output must be a contiguous tensor of shape ", input.sizes(),
              " and dtype ", input.scalar_type(), " on ", input.device());
  RotaryShape shape;
  shape.seq = input.size(0);
  shape.batch = input.size(1);
  shape.heads = input.size(2);
  shape.head_dim = static_cast<int>(input.size(3));
  shape.rot_dim = static_cast<int>(rot_dim);
  shape.stride_seq = input.stride(0);
  shape.stride_batch = input.stride(1);
  shape.stride_head = input.stride(2);
  shape.angle_stride_seq = cos.stride(0);
  shape.angle_stride_batch = cos.dim() == 4 && cos.size(1) > 1 ? cos.stride(1) : 0;
  return shape;
}

void forward_cuda(const at::Tensor& input, const at::Tensor& cos, const at::Tensor& sin,
                  at::Tensor& output) {
  const RotaryShape shape = rotary_shape(input, cos, sin, output);
  const c10::cuda::CUDAGuard guard(input.device());
  C10_CUDA_CHECK(megatron_kernels::rotary_forward(
      kernel_dtype(input, "input"), kernel_dtype(cos, "cos"), input.const_data_ptr(),
      cos.const_data_ptr(), sin.const_data_ptr(), output.mutable_data_ptr(), shape,
      c10::cuda::getCurrentCUDAStream()));
}

void backward_cuda(const at::Tensor& grad_output, const at::Tensor& cos, const at::Tensor& sin,
                   at::Tensor& grad_input) {
  const RotaryShape shape = rotary_shape(grad_output, cos, sin, grad_input);
  const c10::cuda::CUDAGuard guard(grad_output.device());
  C10_CUDA_CHECK(megatron_kernels::rotary_backward(
      kernel_dtype(grad_output, "grad_output"), kernel_dtype(cos, "cos"),
      grad_output.const_data_ptr(), cos.const_data_ptr(), sin.const_data_ptr(),
      grad_input.mutable_data_ptr(), shape, c10::cuda::getCurrentCUDAStream()));
}

}  // namespace

TORCH_LIBRARY(megatron_fused_rotary, m) {
  m.def("forward(Tensor input, Tensor cos, Tensor sin, Tensor(a!) output) -> ()");
  m.def("backward(Tensor grad_output, Tensor cos, Tensor sin, Tensor(a!) grad_input) -> ()");
}

TORCH_LIBRARY_IMPL(megatron_fused_rotary, CUDA, m) {
  m.impl("forward", &forward_cuda);
  m.impl("backward", &backward_cuda);
}

// The ops register when this module is imported; the module itself has no attributes.
PyMODINIT_FUNC PyInit__fused_rotary_cuda(void) {
  static PyModuleDef module_def = {PyModuleDef_HEAD_INIT, "_fused_rotary_cuda",
                                   "Fused rotary embedding kernels: see "
                                   "torch.ops.megatron_fused_rotary.",
                                   -1, nullptr, nullptr, nullptr, nullptr, nullptr};
  return PyModule_Create(&module_def);
}
