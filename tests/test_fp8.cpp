// The host fp8 conversions (executor/fp8.hpp) bit for bit against an independent reference: every
// code decoded from its fields by the OCP formula, and every cast checked against a search for the
// nearest of the 256 codes (ties to the even mantissa) after the saturating clamp.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "executor/fp8.hpp"

namespace np {
namespace {

struct Ref {
  Dtype d;
  std::vector<double> value;  // per code; NaN where the code is NaN, inf where infinite
};

// Decodes every code from the format's table (OFP8 rev. 1.0, Table 1): exponent bias 7 (e4m3) or
// 15 (e5m2); e4m3fn has no infinities and its only NaNs are S.1111.111; e5m2's top exponent holds
// the infinities (mantissa 0) and NaNs.
Ref reference(Dtype d) {
  const bool e5 = d == Dtype::kFp8E5m2;
  const int eb = e5 ? 5 : 4, mb = e5 ? 2 : 3, bias = e5 ? 15 : 7;
  Ref r{d, {}};
  for (int c = 0; c < 256; ++c) {
    int s = c >> 7, e = (c >> mb) & ((1 << eb) - 1), m = c & ((1 << mb) - 1);
    double v;
    if (e5 && e == 31)
      v = m ? NAN : INFINITY;
    else if (!e5 && e == 15 && m == 7)
      v = NAN;
    else if (e == 0)
      v = m / double(1 << mb) * std::pow(2.0, 1 - bias);
    else
      v = (1 + m / double(1 << mb)) * std::pow(2.0, e - bias);
    r.value.push_back(s ? -v : v);
  }
  return r;
}

// The saturating cast by search: clamp to +-max, then the finite code of the input's sign nearest
// to it; on a tie, the one with an even mantissa (an even code).
uint8_t search(const Ref& r, float x, double max) {
  if (std::isnan(x)) return 0x7f;
  const int sign = std::signbit(x) ? 0x80 : 0;
  const double a = std::min<double>(std::fabs(double(x)), max);
  int best = -1;
  double best_d = INFINITY;
  for (int c = 0; c < 128; ++c) {
    double v = r.value[c];
    if (!std::isfinite(v)) continue;
    double dist = std::fabs(v - a);
    if (dist < best_d || (dist == best_d && (c & 1) == 0)) best = c, best_d = dist;
  }
  return static_cast<uint8_t>(sign | best);
}

TEST(Fp8, DecodesEveryCodeAsTheFormatTable) {
  for (Dtype d : {Dtype::kFp8E4m3, Dtype::kFp8E5m2}) {
    Ref r = reference(d);
    for (int c = 0; c < 256; ++c) {
      float got = fp8_to_f32(static_cast<uint8_t>(c), d);
      if (std::isnan(r.value[c])) {
        EXPECT_TRUE(std::isnan(got)) << name_of(d) << " code " << c;
      } else {
        EXPECT_EQ(double(got), r.value[c]) << name_of(d) << " code " << c;
        EXPECT_EQ(std::signbit(got), c >= 128) << name_of(d) << " code " << c;
      }
    }
  }
  // The published extremes (OFP8 Table 1): max normal, min normal, min subnormal.
  EXPECT_EQ(fp8_to_f32(0x7e, Dtype::kFp8E4m3), 448.0f);
  EXPECT_EQ(fp8_to_f32(0x08, Dtype::kFp8E4m3), std::ldexp(1.0f, -6));
  EXPECT_EQ(fp8_to_f32(0x01, Dtype::kFp8E4m3), std::ldexp(1.0f, -9));
  EXPECT_EQ(fp8_to_f32(0x7b, Dtype::kFp8E5m2), 57344.0f);
  EXPECT_EQ(fp8_to_f32(0x04, Dtype::kFp8E5m2), std::ldexp(1.0f, -14));
  EXPECT_EQ(fp8_to_f32(0x01, Dtype::kFp8E5m2), std::ldexp(1.0f, -16));
  EXPECT_TRUE(std::isinf(fp8_to_f32(0x7c, Dtype::kFp8E5m2)));
}

TEST(Fp8, CastsBitForBitAsTheNearestCodeSearch) {
  std::mt19937 rng(7);
  for (Dtype d : {Dtype::kFp8E4m3, Dtype::kFp8E5m2}) {
    Ref r = reference(d);
    const double max = d == Dtype::kFp8E5m2 ? 57344.0 : 448.0;
    std::vector<float> xs = {0.0f, -0.0f, INFINITY, -INFINITY, 1e30f, -1e30f, 1e-30f, -1e-30f};
    // Every finite code, the midpoints between neighbours (the ties) and a hair either side.
    std::vector<double> finite;
    for (int c = 0; c < 128; ++c)
      if (std::isfinite(r.value[c])) finite.push_back(r.value[c]);
    std::sort(finite.begin(), finite.end());
    for (size_t i = 0; i < finite.size(); ++i) {
      for (float s : {1.0f, -1.0f}) {
        xs.push_back(s * float(finite[i]));
        if (i + 1 < finite.size()) {
          float mid = float((finite[i] + finite[i + 1]) / 2);
          xs.push_back(s * mid);
          xs.push_back(s * std::nextafter(mid, 0.0f));
          xs.push_back(s * std::nextafter(mid, INFINITY));
        }
      }
    }
    xs.push_back(float(max) * 1.03f);  // beyond max: saturates
    // Random values over every binade the format covers and beyond.
    std::uniform_real_distribution<float> mant(1.0f, 2.0f);
    std::uniform_int_distribution<int> expo(-26, 20);
    for (int i = 0; i < 200000; ++i)
      xs.push_back((i & 1 ? -1.0f : 1.0f) * std::ldexp(mant(rng), expo(rng)));
    int64_t bad = 0;
    for (float x : xs) {
      uint8_t want = search(r, x, max), got = f32_to_fp8(x, d);
      if (got != want && ++bad <= 5)
        ADD_FAILURE() << name_of(d) << ": " << x << " -> " << int(got) << ", want " << int(want);
    }
    EXPECT_EQ(bad, 0) << name_of(d) << " over " << xs.size() << " values";
    EXPECT_EQ(f32_to_fp8(NAN, d) & 0x7f, 0x7f);
  }
  // Known roundings: 464 is the tie between 448 and e4m3fn's NaN code's place (480), kept at max;
  // 17 lies between 16 and 18 in e4m3 (tie: 16, mantissa 000 even).
  EXPECT_EQ(f32_to_fp8(464.0f, Dtype::kFp8E4m3), 0x7e);
  EXPECT_EQ(fp8_to_f32(f32_to_fp8(17.0f, Dtype::kFp8E4m3), Dtype::kFp8E4m3), 16.0f);
  EXPECT_EQ(fp8_to_f32(f32_to_fp8(19.0f, Dtype::kFp8E4m3), Dtype::kFp8E4m3), 20.0f);
}

}  // namespace
}  // namespace np
