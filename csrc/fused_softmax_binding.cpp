// PyTorch face of the fused softmax kernels: checks tensors, then calls the raw-pointer entry
// points of fused_softmax.h on the current CUDA stream.
//
// Importing the extension module `megatron.kernels._fused_softmax_cuda` registers
//   torch.ops.megatron_fused_softmax.forward(input, mask, scale, causal, output)
//   torch.ops.megatron_fused_softmax.backward(grad_output, softmax_output, scale, causal,
//                                             grad_input)
//   torch.ops.megatron_fused_softmax.max_columns()
// Outputs are passed in (and written completely), so callers choose where results live.
#include <Python.h>

#include <ATen/core/Tensor.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>

#include "fused_softmax.h"

namespace {

using megatron_kernels::DType;
using megatron_kernels::SoftmaxMask;
using megatron_kernels::SoftmaxShape;

DType kernel_dtype(const at::Tensor& tensor, const char* name) {
  switch (tensor.scalar_type()) {
    case at::kFloat:
      return DType::kFloat32;
    case at::kHalf:
      return DType::kFloat16;
    case at::kBFloat16:
      return DType::kBFloat16;
    default:
      TORCH_CHECK(false, "megatron_fused_softmax: ", name, " has dtype ", tensor.scalar_type(),
                  "; the kernels support float32, float16 and bfloat16");
  }
}

// Checks a tensor of softmax rows (..., sq, sk) against the reference tensor `like`.
void check_rows(const at::Tensor& tensor, const char* name, const at::Tensor& like) {
  TORCH_CHECK(tensor.is_cuda(), "megatron_fused_softmax: ", name, " must be a CUDA tensor");
  TORCH_CHECK(tensor.device() == like.device(), "megatron_fused_softmax: ", name, " is on ",
              tensor.device(), " but the input is on ", like.device());
  TORCH_CHECK(tensor.scalar_type() == like.scalar_type(), "megatron_fused_softmax: ", name,
              " has dtype ", tensor.scalar_type(), " but the input has ", like.scalar_type());
  TORCH_CHECK(tensor.sizes() == like.sizes(), "megatron_fused_softmax: ", name, " has shape ",
              tensor.sizes(), " but the input has ", like.sizes());
  TORCH_CHECK(tensor.is_contiguous(), "megatron_fused_softmax: ", name, " must be contiguous");
}

SoftmaxShape row_shape(const at::Tensor& input) {
  TORCH_CHECK(input.dim() >= 2, "megatron_fused_softmax: input must have at least 2 dims "
              "(..., sq, sk), got shape ", input.sizes());
  const int64_t sk = input.size(-1);
  const int64_t sq = input.size(-2);
  TORCH_CHECK(sk <= megatron_kernels::kSoftmaxMaxColumns, "megatron_fused_softmax: sk = ", sk,
              " is longer than the kernels' limit of ", megatron_kernels::kSoftmaxMaxColumns);
  SoftmaxShape shape;
  shape.sk = static_cast<int>(sk);
  shape.sq = static_cast<int>(sq);
  shape.rows = sk == 0 ? 0 : input.numel() / sk;
  // Rows per batch entry, (np * sq) for a (b, np, sq, sk) input; only used to index a mask.
  shape.rows_per_batch = input.dim() == 4 ? input.size(1) * sq : shape.rows;
  if (shape.rows_per_batch == 0) shape.rows_per_batch = 1;
  return shape;
}

// A boolean mask of shape (b or 1, 1, sq or 1, sk) for a (b, np, sq, sk) input.
SoftmaxMask mask_view(const std::optional<at::Tensor>& mask, const at::Tensor& input) {
  SoftmaxMask view{nullptr, 0, 0};
  if (!mask.has_value()) return view;
  const at::Tensor& m = *mask;
  TORCH_CHECK(input.dim() == 4, "megatron_fused_softmax: a mask needs a (b, np, sq, sk) input, "
              "got input shape ", input.sizes());
  TORCH_CHECK(m.device() == input.device(), "megatron_fused_softmax: mask is on ", m.device(),
              " but the input is on ", input.device());
  TORCH_CHECK(m.scalar_type() == at::kBool, "megatron_fused_softmax: mask must be bool "
              "(True = masked), got ", m.scalar_type());
  const bool shape_ok = m.dim() == 4 && (m.size(0) == 1 || m.size(0) == input.size(0)) &&
                        m.size(1) == 1 && (m.size(2) == 1 || m.size(2) == input.size(2)) &&
                        m.size(3) == input.size(3);
  TORCH_CHECK(shape_ok, "megatron_fused_softmax: mask shape ", m.sizes(), " does not broadcast "
              "as (b or 1, 1, sq or 1, sk) over input shape ", input.sizes());
  TORCH_CHECK(m.size(3) == 1 || m.stride(3) == 1, "megatron_fused_softmax: the mask's last dim "
              "must be contiguous (stride 1), got strides ", m.strides());
  view.data = reinterpret_cast<const uint8_t*>(m.const_data_ptr<bool>());
  view.stride_batch = m.size(0) == 1 ? 0 : m.stride(0);
  view.stride_query = m.size(2) == 1 ? 0 : m.stride(2);
  return view;
}

void forward_cuda(const at::Tensor& input, const std::optional<at::Tensor>& mask, double scale,
                  bool causal, at::Tensor& output) {
  check_rows(input, "input", input);
  check_rows(output, "output", input);
  const DType dtype = kernel_dtype(input, "input");
  const SoftmaxShape shape = row_shape(input);
  const SoftmaxMask mask_ptrs = mask_view(mask, input);
  const c10::cuda::CUDAGuard guard(input.device());
  C10_CUDA_CHECK(megatron_kernels::scaled_softmax_forward(
      dtype, input.const_data_ptr(), mask_ptrs, causal, output.mutable_data_ptr(), shape,
      static_cast<float>(scale), c10::cuda::getCurrentCUDAStream()));
}

void backward_cuda(const at::Tensor& grad_output, const at::Tensor& softmax_output, double scale,
                   bool causal, at::Tensor& grad_input) {
  check_rows(softmax_output, "softmax_output", softmax_output);
  check_rows(grad_output, "grad_output", softmax_output);
  check_rows(grad_input, "grad_input", softmax_output);
  const DType dtype = kernel_dtype(softmax_output, "softmax_output");
  const SoftmaxShape shape = row_shape(softmax_output);
  const c10::cuda::CUDAGuard guard(softmax_output.device());
  C10_CUDA_CHECK(megatron_kernels::scaled_softmax_backward(
      dtype, grad_output.const_data_ptr(), softmax_output.const_data_ptr(),
      grad_input.mutable_data_ptr(), causal, shape, static_cast<float>(scale),
      c10::cuda::getCurrentCUDAStream()));
}

int64_t max_columns() { return megatron_kernels::kSoftmaxMaxColumns; }

}  // namespace

TORCH_LIBRARY(megatron_fused_softmax, m) {
  m.def("forward(Tensor input, Tensor? mask, float scale, bool causal, Tensor(a!) output) -> ()");
  m.def(
      "backward(Tensor grad_output, Tensor softmax_output, float scale, bool causal, "
      "Tensor(a!) grad_input) -> ()");
  m.def("max_columns() -> int", &max_columns);
}

TORCH_LIBRARY_IMPL(megatron_fused_softmax, CUDA, m) {
  m.impl("forward", &forward_cuda);
  m.impl("backward", &backward_cuda);
}

// The ops register when this module is imported; the module itself has no attributes.
PyMODINIT_FUNC PyInit__fused_softmax_cuda(void) {
  static PyModuleDef module_def = {PyModuleDef_HEAD_INIT, "_fused_softmax_cuda",
                                   "Fused scaled-masked softmax kernels: see "
                                   "torch.ops.megatron_fused_softmax.",
                                   -1, nullptr, nullptr, nullptr, nullptr, nullptr};
  return PyModule_Create(&module_def);
}
