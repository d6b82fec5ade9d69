// What the quant_matmul tests build their weights with: fp16 scales by hand, K fitted to a
// format's block and random valid blocks of every format (test_quant_matmul.cc,
// test_quant_layout.cc).
#pragma once

#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "cpu/quant_matmul.h"

namespace met::cpu::test_blocks {

inline uint16_t to_fp16(float f) {
  // Scales here are normal and well inside fp16's range; truncating the mantissa is exact enough
  // because the reference reads back the same bits.
  uint32_t bits;
  std::memcpy(&bits, &f, 4);
  const uint32_t sign = (bits >> 16) & 0x8000u;
  const int32_t exponent = static_cast<int32_t>((bits >> 23) & 0xFF) - 127 + 15;
  return static_cast<uint16_t>(sign | (static_cast<uint32_t>(exponent) << 10) |
                               ((bits >> 13) & 0x3FFu));
}

// K rounded up to a multiple of the format's block (the super-block formats are 256 wide).
inline int64_t fit_k(QType q, int64_t k) {
  const int64_t unit = block_elements(q);
  return (k + unit - 1) / unit * unit;
}

// Where a format keeps its fp16 scale fields: d (and the second one: Q4_1's and Q5_1's m, the
// K-quants' dmin) at these byte offsets of a block; -1 where there is none. MXFP4's is a byte.
inline void scale_fields(QType q, int* d, int* second) {
  *second = -1;
  *d = q == QType::kQ6_K    ? 208
       : q == QType::kQ3_K  ? 108
       : q == QType::kQ2_K  ? 80
       : q == QType::kMxfp4 ? -1
                            : 0;
  if (q == QType::kQ4_1 || q == QType::kQ5_1 || q == QType::kQ4_K || q == QType::kQ5_K) *second = 2;
  if (q == QType::kQ2_K) *second = 82;
}

// Random quants and scales: the kernel must read any valid block, not only a quantizer's output.
// Every byte is random but the fp16 fields, which get small normal values (Q4_1's and Q5_1's m
// negative, as a quantizer's minimum is), and MXFP4's E8M0 byte, kept from 2^-11 to 2^-2.
inline std::vector<uint8_t> random_weights(QType q, int64_t n, int64_t k, std::mt19937& rng) {
  std::vector<uint8_t> w(row_bytes(q, k) * n);
  std::uniform_real_distribution<float> scale(0.001f, 0.05f);
  std::uniform_int_distribution<int> byte(0, 255);
  for (auto& v : w) v = static_cast<uint8_t>(byte(rng));
  const size_t bb = block_bytes(q);
  // The super-blocks' d multiplies 6-bit (or int8) sub-block scales: smaller, for like magnitudes.
  const float shrink = block_elements(q) == 256 ? 16.0f : 1.0f;
  int d_at, second_at;
  scale_fields(q, &d_at, &second_at);
  for (size_t b = 0; b < w.size() / bb; ++b) {
    uint8_t* block = w.data() + b * bb;
    if (q == QType::kMxfp4) block[0] = static_cast<uint8_t>(116 + byte(rng) % 10);
    if (d_at >= 0) {
      const uint16_t d = to_fp16(scale(rng) / shrink);
      std::memcpy(block + d_at, &d, 2);
    }
    if (second_at >= 0) {
      const bool min = q == QType::kQ4_1 || q == QType::kQ5_1;
      const uint16_t v = to_fp16(min ? -scale(rng) * 8.0f : scale(rng) / 8.0f);
      std::memcpy(block + second_at, &v, 2);
    }
    if (q == QType::kQ8_0) {
      for (size_t i = 2; i < bb; ++i) block[i] = block[i] == 0x80 ? 0x81 : block[i];
    }
  }
  return w;
}

}  // namespace met::cpu::test_blocks
