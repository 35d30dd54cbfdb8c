#include <gtest/gtest.h>

#include <cmath>

#include "core/bf16.h"
#include "core/check.h"

namespace tern {

TEST(Check, ThrowsWithMessageAndLocation) {
  try {
    TERN_CHECK(1 + 1 == 3, "arithmetic is broken: ", 42);
    FAIL() << "TERN_CHECK did not throw";
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("arithmetic is broken: 42"), std::string::npos) << m;
    EXPECT_NE(m.find("check_test.cpp"), std::string::npos) << m;
  }
}

TEST(Bf16, RoundTripAndRounding) {
  EXPECT_EQ(bf16_to_float(float_to_bf16(1.0f)), 1.0f);
  EXPECT_EQ(bf16_to_float(float_to_bf16(-2.5f)), -2.5f);
  // 1 + 2^-8 is exactly half-way between two bf16 values: ties to even -> 1.0.
  EXPECT_EQ(round_bf16(1.0f + 1.0f / 256.0f), 1.0f);
  EXPECT_EQ(round_bf16(1.0f + 3.0f / 256.0f), 1.0f + 4.0f / 256.0f);
  EXPECT_TRUE(std::isnan(bf16_to_float(float_to_bf16(std::nanf("")))));
  EXPECT_EQ(f16_to_float(0x3c00), 1.0f);
  EXPECT_EQ(f16_to_float(0xc000), -2.0f);
}

}  // namespace tern
