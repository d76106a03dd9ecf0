// fp8 <-> fp32, PyTorch's float8_e4m3fn and float8_e5m2 (the OCP formats: OCP 8-bit Floating
// Point Specification (OFP8) rev. 1.0, 2023, Table 1; Micikevicius et al., "FP8 Formats for Deep
// Learning", arXiv:2209.05433, Table 1), on the host and (compiled by nvcc) on the device:
//   e4m3fn: 4 exponent bits (bias 7), 3 mantissa bits, no infinities, NaN = S.1111.111, max 448;
//   e5m2:   5 exponent bits (bias 15), 2 mantissa bits, IEEE infinities and NaNs, max 57344.
// The cast is saturating, as torchao's to_fp8_saturated makes it (a clamp to +-max, then the
// conversion): finite values beyond the range give +-max, infinities too; NaN stays NaN. Rounding is
// to nearest, ties to an even mantissa; the sign is kept (-0 and small negatives give 0x80).
#pragma once
#include <math.h>

#include <cstdint>
#include <cstring>

#include "planner/inputs/spec.hpp"

#if defined(__CUDACC__)
#define NP_FP8_HD __host__ __device__
#else
#define NP_FP8_HD
#endif

namespace np {

struct Fp8Format {
  int exp_bits, man_bits, bias;
  float max;
  bool ieee;  // e5m2: infinities and NaNs as IEEE; e4m3fn: only S.1111.111 is NaN
};
NP_FP8_HD inline Fp8Format fp8_format(Dtype d) {
  return d == Dtype::kFp8E5m2 ? Fp8Format{5, 2, 15, 57344.0f, true}
                              : Fp8Format{4, 3, 7, 448.0f, false};
}

NP_FP8_HD inline float fp8_to_f32(uint8_t bits, Dtype d) {
  const Fp8Format f = fp8_format(d);
  const int exp = (bits >> f.man_bits) & ((1 << f.exp_bits) - 1);
  const int man = bits & ((1 << f.man_bits) - 1);
  const float sign = bits & 0x80 ? -1.0f : 1.0f;
  const int top = (1 << f.exp_bits) - 1;
  if (f.ieee && exp == top) return man ? NAN : sign * INFINITY;
  if (!f.ieee && exp == top && man == (1 << f.man_bits) - 1) return NAN;
  if (exp == 0) return sign * ldexpf(static_cast<float>(man), 1 - f.bias - f.man_bits);
  return sign * ldexpf(static_cast<float>(man + (1 << f.man_bits)), exp - f.bias - f.man_bits);
}

NP_FP8_HD inline uint8_t f32_to_fp8(float v, Dtype d) {
  const Fp8Format f = fp8_format(d);
  if (v != v) return 0x7f;  // NaN: S.1111.111 (e5m2: a quiet NaN)
  const uint8_t sign = copysignf(1.0f, v) < 0 ? 0x80 : 0;
  float a = fminf(fabsf(v), f.max);  // saturate
  // The spacing of representable values at a: subnormal below 2^(1 - bias), else 2^(e - man).
  int e = 0;
  frexpf(a, &e);  // a = m 2^e, m in [0.5, 1): the leading bit is 2^(e - 1)
  const int lead = a == 0 ? 1 - f.bias : (e - 1 > 1 - f.bias ? e - 1 : 1 - f.bias);
  const float q = ldexpf(1.0f, lead - f.man_bits);
  const float r = rintf(a / q);  // ties to even (the default rounding): the mantissa's last bit
  const float value = r * q;     // representable; at most max (max is on the grid and a <= max)
  if (value == 0) return sign;
  frexpf(value, &e);
  if (e - 1 < 1 - f.bias)  // subnormal
    return static_cast<uint8_t>(sign | static_cast<int>(ldexpf(value, f.bias - 1 + f.man_bits)));
  const int exp_field = e - 1 + f.bias;
  const int man = static_cast<int>(ldexpf(value, f.man_bits - (e - 1))) - (1 << f.man_bits);
  return static_cast<uint8_t>(sign | exp_field << f.man_bits | man);
}

// torchao's _round_scale_down_to_power_of_2 (exp2(floor(log2(s)))) of a positive normal fp32 s,
// exactly: its sign and exponent bits. (A float log2 can round up to an integer just below a
// power of 2; the exponent does not.)
NP_FP8_HD inline float pow2_floor(float s) {
  uint32_t u;
  memcpy(&u, &s, 4);
  u &= 0xff800000u;
  memcpy(&s, &u, 4);
  return s;
}

}  // namespace np
