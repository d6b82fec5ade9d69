// fp16 <-> fp32 (csrc/cpu/half.h) over every fp16 value: exact widening, round-to-nearest-even
// narrowing, and the edges (overflow, subnormals, NaN, signed zero).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>

#include "cpu/half.h"

namespace met::cpu {
namespace {

bool is_nan(uint16_t h) { return (h & 0x7C00u) == 0x7C00u && (h & 0x3FFu) != 0; }

TEST(Half, EveryValueRoundTrips) {
  for (uint32_t h = 0; h <= 0xFFFFu; ++h) {
    const auto bits = static_cast<uint16_t>(h);
    const float f = fp16_to_fp32(bits);
    if (is_nan(bits)) {
      EXPECT_TRUE(std::isnan(f));
      EXPECT_TRUE(is_nan(fp32_to_fp16(f)));
    } else {
      EXPECT_EQ(fp32_to_fp16(f), bits) << std::hex << h;
    }
  }
}

TEST(Half, MidpointsRoundToEvenAndEverythingElseToNearest) {
  // Each pair of neighbouring finite positive fp16 values a < b: their midpoint (exact in fp32)
  // goes to the one with an even mantissa; a hair below or above goes to the nearer one.
  for (uint16_t a = 0; a < 0x7BFFu; ++a) {
    const auto b = static_cast<uint16_t>(a + 1);
    const float lo = fp16_to_fp32(a), hi = fp16_to_fp32(b);
    const float mid = (lo + hi) / 2;
    ASSERT_EQ(fp32_to_fp16(mid), (a & 1u) ? b : a) << std::hex << a;
    ASSERT_EQ(fp32_to_fp16(std::nextafter(mid, 0.0f)), a) << std::hex << a;
    ASSERT_EQ(fp32_to_fp16(std::nextafter(mid, 1e9f)), b) << std::hex << a;
    ASSERT_EQ(fp32_to_fp16(-mid), ((a & 1u) ? b : a) | 0x8000u) << std::hex << a;
  }
}

TEST(Half, Edges) {
  EXPECT_EQ(fp32_to_fp16(65504.0f), 0x7BFFu);   // the largest finite value
  EXPECT_EQ(fp32_to_fp16(65519.99f), 0x7BFFu);  // below the midpoint to infinity
  EXPECT_EQ(fp32_to_fp16(65520.0f), 0x7C00u);   // the midpoint: ties to even, inf
  EXPECT_EQ(fp32_to_fp16(1e30f), 0x7C00u);      // overflow
  EXPECT_EQ(fp32_to_fp16(-std::numeric_limits<float>::infinity()), 0xFC00u);
  EXPECT_EQ(fp32_to_fp16(-0.0f), 0x8000u);
  EXPECT_EQ(fp32_to_fp16(1e-10f), 0x0000u);                 // underflow to zero
  EXPECT_EQ(fp32_to_fp16(std::ldexp(1.0f, -24)), 0x0001u);  // the smallest subnormal
  EXPECT_EQ(fp32_to_fp16(std::ldexp(1.0f, -25)), 0x0000u);  // half of it: ties to even (0)
  EXPECT_EQ(fp32_to_fp16(std::ldexp(3.0f, -25)), 0x0002u);  // 1.5 of it: ties to even (2)
  EXPECT_TRUE(is_nan(fp32_to_fp16(std::numeric_limits<float>::quiet_NaN())));
}

}  // namespace
}  // namespace met::cpu
