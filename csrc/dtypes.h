// Element types shared by the host entry points of all fused kernels.
#pragma once

namespace megatron_kernels {

// Element types the kernels are built for (the binding files map PyTorch dtypes onto these).
enum class DType : int { kFloat32 = 0, kFloat16 = 1, kBFloat16 = 2 };

}  // namespace megatron_kernels
