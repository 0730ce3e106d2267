// CPU emulation of __half (IEEE binary16) with the conversions the kernels use.
#pragma once

#include <cstdint>
#include <cstring>

struct __half {
  uint16_t bits;
};

inline float __half2float(__half h) {
  _Float16 value;
  std::memcpy(&value, &h.bits, sizeof(value));
  return static_cast<float>(value);
}

inline __half __float2half_rn(float x) {
  const _Float16 value = static_cast<_Float16>(x);  // round to nearest even
  __half h;
  std::memcpy(&h.bits, &value, sizeof(value));
  return h;
}
