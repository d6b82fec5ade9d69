// fp16 <-> fp32 in plain integer arithmetic (half.h).
#include "half.h"

#include <cmath>
#include <cstring>

namespace met::cpu {

float fp16_to_fp32(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exponent = (h >> 10) & 0x1Fu;
  const uint32_t mantissa = h & 0x3FFu;
  float magnitude;
  if (exponent == 0) {
    magnitude = std::ldexp(static_cast<float>(mantissa), -24);  // zero and subnormals
  } else if (exponent == 31) {
    magnitude = mantissa ? NAN : INFINITY;
  } else {
    magnitude = std::ldexp(static_cast<float>(mantissa | 0x400u), static_cast<int>(exponent) - 25);
  }
  uint32_t bits;
  std::memcpy(&bits, &magnitude, 4);
  bits |= sign;
  float out;
  std::memcpy(&out, &bits, 4);
  return out;
}

uint16_t fp32_to_fp16(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  const auto sign = static_cast<uint16_t>((x >> 16) & 0x8000u);
  const uint32_t magnitude = x & 0x7FFFFFFFu;
  if (magnitude >= 0x7F800000u) {  // infinity, or NaN (kept quiet)
    return sign | 0x7C00u | (magnitude > 0x7F800000u ? 0x200u : 0u);
  }
  if (magnitude >= 0x477FF000u) return sign | 0x7C00u;  // 65520 and up round past 65504
  if (magnitude < 0x38800000u) {
    // Below 2^-14: an fp16 subnormal, m * 2^-24 with m = |f| * 2^24 rounded (exact scaling;
    // nearbyint rounds ties to even; m = 1024 is the smallest normal, bit for bit).
    return sign | static_cast<uint16_t>(std::nearbyint(std::fabs(f) * 16777216.0f));
  }
  const uint32_t exponent = (magnitude >> 23) - 127 + 15;
  const uint32_t mantissa = magnitude & 0x7FFFFFu;
  uint32_t h = (exponent << 10) | (mantissa >> 13);
  const uint32_t rest = mantissa & 0x1FFFu;  // the 13 bits dropped
  // Ties to even; a carry out of the mantissa correctly bumps the exponent.
  if (rest > 0x1000u || (rest == 0x1000u && (h & 1u))) ++h;
  return static_cast<uint16_t>(sign | h);
}

}  // namespace met::cpu
