// The host fp8 e4m3fn helpers (core/fp8.h), the CPU twin of the fp8 KV cache: every one of the 256 codes decoded
// and encoded back, rounding to nearest even at every midpoint, saturation, NaN, and the row scale.
#include "core/fp8.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

namespace tern {
namespace {

// The value of code b by e4m3fn's definition, in double: (-1)^s · 2^(e-7) · (1 + m/8), subnormals 2^-6 · m/8.
double e4m3_reference(int b) {
  const int s = b >> 7, e = (b >> 3) & 15, m = b & 7;
  const double mag = e == 0 ? std::ldexp(m / 8.0, -6) : std::ldexp(1.0 + m / 8.0, e - 7);
  return s ? -mag : mag;
}

TEST(Fp8E4m3, EveryCodeDecodesToItsValueAndEncodesBack) {
  for (int b = 0; b < 256; ++b) {
    const float v = fp8_e4m3_to_float(fp8_bits(b));
    if ((b & 0x7f) == 0x7f) {
      EXPECT_TRUE(std::isnan(v)) << "code " << b;
      EXPECT_EQ(float_to_fp8_e4m3(v), 0x7f) << "code " << b;
      continue;
    }
    EXPECT_EQ(double(v), e4m3_reference(b)) << "code " << b;
    EXPECT_EQ(float_to_fp8_e4m3(v), b) << "code " << b << " value " << v;  // -0 keeps its sign: 0x80
  }
  EXPECT_EQ(fp8_e4m3_to_float(0x7e), 448.0f);
  EXPECT_EQ(fp8_e4m3_to_float(0x01), std::ldexp(1.0f, -9));
}

// Between consecutive codes (of one sign, below 448): just under the midpoint rounds down, just over rounds up, the
// midpoint itself to the code with an even mantissa.
TEST(Fp8E4m3, RoundsToNearestEvenBetweenEveryPairOfCodes) {
  for (int sign = 0; sign < 2; ++sign) {
    for (int b = 0; b < 0x7e; ++b) {
      const int lo = b | (sign << 7), hi = (b + 1) | (sign << 7);
      const float a = fp8_e4m3_to_float(fp8_bits(lo)), c = fp8_e4m3_to_float(fp8_bits(hi));
      const float mid = float((double(a) + double(c)) / 2);  // exact in float: 5 significant bits at most
      ASSERT_EQ(double(mid), (double(a) + double(c)) / 2);
      const float below = std::nextafter(mid, a), above = std::nextafter(mid, c);
      EXPECT_EQ(float_to_fp8_e4m3(below), lo) << "below the midpoint of " << lo << ", " << hi;
      EXPECT_EQ(float_to_fp8_e4m3(above), hi) << "above the midpoint of " << lo << ", " << hi;
      EXPECT_EQ(float_to_fp8_e4m3(mid), (b & 1) ? hi : lo) << "the midpoint of " << lo << ", " << hi;
    }
  }
  // Below half the smallest subnormal: zero; half of it ties to 0 (even).
  EXPECT_EQ(float_to_fp8_e4m3(std::ldexp(1.0f, -10)), 0x00);
  EXPECT_EQ(float_to_fp8_e4m3(-std::ldexp(1.0f, -11)), 0x80);
  EXPECT_EQ(float_to_fp8_e4m3(std::nextafter(std::ldexp(1.0f, -10), 1.0f)), 0x01);
}

TEST(Fp8E4m3, SaturatesPast448AndKeepsNaN) {
  const float inf = std::numeric_limits<float>::infinity();
  for (float x : {448.0f, 449.0f, 464.0f, 480.0f, 1e6f, 3.0e38f, inf}) {
    EXPECT_EQ(float_to_fp8_e4m3(x), 0x7e) << x;
    EXPECT_EQ(float_to_fp8_e4m3(-x), 0xfe) << -x;
  }
  EXPECT_EQ(float_to_fp8_e4m3(std::nanf("")), 0x7f);
  EXPECT_EQ(float_to_fp8_e4m3(-std::nanf("")), 0x7f);
}

TEST(Fp8E4m3, RowScaleMapsTheLargestMagnitudeTo448) {
  EXPECT_EQ(fp8_row_scale(0.0f), 0.0f);
  EXPECT_EQ(fp8_row_scale(448.0f), 1.0f);
  EXPECT_EQ(fp8_row_scale(std::numeric_limits<float>::infinity()), std::numeric_limits<float>::max() / 448.0f);
  const std::vector<float> row = {0.3f, -1.7f, 0.0f, 1.25f, -0.001f};
  const float scale = fp8_row_scale(1.7f);
  EXPECT_EQ(fp8_row_encode(-1.7f, scale), 0xfe);  // the largest magnitude: ±448
  for (float x : row) {
    const float back = fp8_e4m3_to_float(fp8_row_encode(x, scale)) * scale;
    EXPECT_NEAR(back, x, std::fabs(x) / 16 + 1.7f * std::ldexp(1.0f, -10) / 448) << x;
  }
  // A row of zeros: scale 0, zeros back (sign kept); NaN stays NaN.
  EXPECT_EQ(fp8_row_encode(0.0f, 0.0f), 0x00);
  EXPECT_EQ(fp8_row_encode(-0.0f, 0.0f), 0x80);
  EXPECT_TRUE(std::isnan(fp8_e4m3_to_float(fp8_row_encode(std::nanf(""), scale))));
  EXPECT_TRUE(std::isnan(fp8_e4m3_to_float(fp8_row_encode(std::nanf(""), 0.0f))));
}

}  // namespace
}  // namespace tern
