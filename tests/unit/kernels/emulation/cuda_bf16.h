// CPU emulation of __nv_bfloat16 with the conversions the kernels use.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

struct __nv_bfloat16 {
  uint16_t bits;
};

inline float __bfloat162float(__nv_bfloat16 h) {
  const uint32_t word = static_cast<uint32_t>(h.bits) << 16;
  float value;
  std::memcpy(&value, &word, sizeof(value));
  return value;
}

inline __nv_bfloat16 __float2bfloat16_rn(float x) {
  if (std::isnan(x)) return __nv_bfloat16{0x7fc0};
  uint32_t word;
  std::memcpy(&word, &x, sizeof(word));
  word += 0x7fffu + ((word >> 16) & 1u);  // round to nearest even
  return __nv_bfloat16{static_cast<uint16_t>(word >> 16)};
}
