// bf16 <-> fp32 on the host: the top 16 bits of an IEEE float, rounded to nearest even (NaN stays
// NaN). Shared by the executors' tensors and the CUDA emulation's __nv_bfloat16.
#pragma once
#include <cstdint>
#include <cstring>

namespace np {

inline float bf16_bits_to_f32(uint16_t b) {
  uint32_t u = static_cast<uint32_t>(b) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
inline uint16_t f32_to_bf16_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40);
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

}  // namespace np
