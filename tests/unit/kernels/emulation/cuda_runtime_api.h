// CPU emulation of the CUDA runtime API types the kernel sources use (tests only; see
// emu_runtime.h). Shadows the real header through the include path of the emulation build.
#pragma once

enum cudaError_t { cudaSuccess = 0, cudaErrorInvalidValue = 1 };
typedef struct CUstream_st* cudaStream_t;

struct dim3 {
  unsigned int x, y, z;
  constexpr dim3(unsigned int x_ = 1, unsigned int y_ = 1, unsigned int z_ = 1)
      : x(x_), y(y_), z(z_) {}
};

struct alignas(8) uint2 {
  unsigned int x, y;
};

struct alignas(16) uint4 {
  unsigned int x, y, z, w;
};

inline cudaError_t cudaGetLastError() { return cudaSuccess; }
