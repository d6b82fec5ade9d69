// The GGUF block formats quant_matmul reads, in portable code: their sizes, one 32-element block
// of a row as integers and float scales (the scalar path's and the tests' reading), and
// dequantize_row (see quant_matmul.h). The per-ISA kernels decode the same layouts with SIMD.
#include <cstring>
#include <stdexcept>

#include "quant_matmul.h"
#include "quant_matmul_internal.h"

namespace met::cpu {

namespace {

uint16_t load_u16(const uint8_t* p) {
  uint16_t v;
  std::memcpy(&v, p, 2);
  return v;
}

// Q6_K super-block: 128 bytes of low nibbles, 64 of 2-bit pairs, 16 int8 scales, fp16 d. Block b
// = 4n + t of it: elements l of the nibbles at 64n + 32(t % 2) + l (the high nibble for t >= 2)
// and bits 2t, 2t + 1 of byte 32n + l of the pairs (ggml's dequantize_row_q6_K), minus 32.
void q6_k_block(const uint8_t* row, int64_t b, detail::Block* out) {
  const uint8_t* super = row + (b / 8) * block_bytes(QType::kQ6_K);
  const int j = static_cast<int>(b % 8), n = j / 4, t = j % 4;
  const uint8_t* low = super + 64 * n + 32 * (t % 2);
  const uint8_t* high = super + 128 + 32 * n;
  for (int i = 0; i < kBlock; ++i) {
    out->q[i] = (((low[i] >> (4 * (t / 2))) & 0x0F) | (((high[i] >> (2 * t)) & 3) << 4)) - 32;
  }
  out->half[0] = static_cast<int8_t>(super[192 + 2 * j]);
  out->half[1] = static_cast<int8_t>(super[192 + 2 * j + 1]);
  out->d = fp16_to_fp32(load_u16(super + 208));
  out->m = 0.0f;
}

// Q3_K super-block: 32 bytes hmask (bit j of byte l: element l of block j's third bit), 64 of
// 2-bit quants (block j = 4n + t: bits 2t, 2t + 1 of the bytes at 32n), 12 of packed 6-bit
// scales (q3_k_scale), fp16 d. q is the two bits minus 4 where the hmask bit is clear (ggml's
// dequantize_row_q3_K).
void q3_k_block(const uint8_t* row, int64_t b, detail::Block* out) {
  const uint8_t* super = row + (b / 8) * block_bytes(QType::kQ3_K);
  const int j = static_cast<int>(b % 8), n = j / 4, t = j % 4;
  const uint8_t* qs = super + 32 + 32 * n;
  for (int i = 0; i < kBlock; ++i) {
    out->q[i] = ((qs[i] >> (2 * t)) & 3) - (((super[i] >> j) & 1) ? 0 : 4);
  }
  out->half[0] = detail::q3_k_scale(super + 96, 2 * j);
  out->half[1] = detail::q3_k_scale(super + 96, 2 * j + 1);
  out->d = fp16_to_fp32(load_u16(super + 108));
  out->m = 0.0f;
}

// Q2_K super-block: 16 bytes of 4-bit scales (low nibbles) and mins (high), one per 16
// elements, 64 of 2-bit quants (block j = 4n + t: bits 2t, 2t + 1 of the bytes at 16 + 32n),
// fp16 d and dmin (ggml's dequantize_row_q2_K).
void q2_k_block(const uint8_t* row, int64_t b, detail::Block* out) {
  const uint8_t* super = row + (b / 8) * block_bytes(QType::kQ2_K);
  const int j = static_cast<int>(b % 8), n = j / 4, t = j % 4;
  const uint8_t* qs = super + 16 + 32 * n;
  for (int i = 0; i < kBlock; ++i) out->q[i] = (qs[i] >> (2 * t)) & 3;
  for (int h = 0; h < 2; ++h) {
    out->half[h] = super[2 * j + h] & 0x0F;
    out->half_min[h] = super[2 * j + h] >> 4;
  }
  out->d = fp16_to_fp32(load_u16(super + 80));
  out->m = -fp16_to_fp32(load_u16(super + 82));
}

// Q4_K and Q5_K super-blocks: fp16 d and dmin, 12 bytes of 6-bit scales and mins, (Q5_K: 32
// bytes whose bit j is sub-block j's fifth bit of element l in byte l), then 32 bytes of nibbles
// per pair of sub-blocks: the low nibbles are sub-block 2i, the high ones 2i + 1.
void q4_k_block(QType q, const uint8_t* row, int64_t b, detail::Block* out) {
  const uint8_t* super = row + (b / 8) * block_bytes(q);
  const int j = static_cast<int>(b % 8);
  int scale, min;
  detail::q4_k_scale_min(super + 4, j, &scale, &min);
  out->d = fp16_to_fp32(load_u16(super)) * static_cast<float>(scale);
  out->m = -(fp16_to_fp32(load_u16(super + 2)) * static_cast<float>(min));
  const bool fifth = q == QType::kQ5_K;
  const uint8_t* qs = super + (fifth ? 48 : 16) + 32 * (j / 2);
  for (int i = 0; i < kBlock; ++i) {
    out->q[i] = (qs[i] >> (4 * (j % 2))) & 0x0F;
    if (fifth) out->q[i] |= ((super[16 + i] >> j) & 1) << 4;
  }
}

// IQ4_XS super-block: fp16 d, the scales' high bits and low nibbles (iq4_xs_scale), then 16
// bytes of IQ4_NL nibbles per sub-block.
void iq4_xs_block(const uint8_t* row, int64_t b, detail::Block* out) {
  const uint8_t* super = row + (b / 8) * block_bytes(QType::kIq4Xs);
  const int j = static_cast<int>(b % 8);
  out->d = fp16_to_fp32(load_u16(super)) * static_cast<float>(detail::iq4_xs_scale(super, j));
  out->m = 0.0f;
  const uint8_t* qs = super + 8 + 16 * j;
  for (int i = 0; i < kBlock / 2; ++i) {
    out->q[i] = detail::kIq4NlValues[qs[i] & 0x0F];
    out->q[i + kBlock / 2] = detail::kIq4NlValues[qs[i] >> 4];
  }
}

// The 32-element blocks: fp16 d (MXFP4: its E8M0 byte), Q4_1's and Q5_1's fp16 m, Q5_0's and
// Q5_1's 32 fifth bits (bit i for element i), then 16 bytes of nibbles (low ones elements 0-15).
void small_block(QType q, const uint8_t* block, detail::Block* out) {
  out->m = 0.0f;
  if (q == QType::kMxfp4) {
    out->d = detail::e8m0_half(block[0]);
  } else {
    out->d = fp16_to_fp32(load_u16(block));
  }
  if (q == QType::kQ8_0) {
    for (int i = 0; i < kBlock; ++i) out->q[i] = static_cast<int8_t>(block[2 + i]);
    return;
  }
  if (q == QType::kQ4_1 || q == QType::kQ5_1) out->m = fp16_to_fp32(load_u16(block + 2));
  const int quants = q == QType::kMxfp4  ? 1
                     : q == QType::kQ4_1 ? 4
                     : q == QType::kQ5_0 ? 6
                     : q == QType::kQ5_1 ? 8
                                         : 2;
  const uint8_t* qs = block + quants;
  uint32_t high = 0;
  if (q == QType::kQ5_0 || q == QType::kQ5_1) std::memcpy(&high, qs - 4, 4);
  for (int i = 0; i < kBlock / 2; ++i) {
    int32_t lo = qs[i] & 0x0F, hi = qs[i] >> 4;
    if (q == QType::kMxfp4) {
      lo = detail::kMxfp4Values[lo];
      hi = detail::kMxfp4Values[hi];
    } else if (q == QType::kIq4Nl) {
      lo = detail::kIq4NlValues[lo];
      hi = detail::kIq4NlValues[hi];
    }
    out->q[i] = lo | (((high >> i) & 1) << 4);
    out->q[i + kBlock / 2] = hi | (((high >> (i + kBlock / 2)) & 1) << 4);
  }
}

}  // namespace

namespace detail {

void read_block(QType q, const uint8_t* row, int64_t b, Block* out) {
  out->half[0] = out->half[1] = 1;
  out->half_min[0] = out->half_min[1] = 0;
  if (q == QType::kQ4_K || q == QType::kQ5_K) return q4_k_block(q, row, b, out);
  if (q == QType::kQ6_K) return q6_k_block(row, b, out);
  if (q == QType::kQ3_K) return q3_k_block(row, b, out);
  if (q == QType::kQ2_K) return q2_k_block(row, b, out);
  if (q == QType::kIq4Xs) return iq4_xs_block(row, b, out);
  small_block(q, row + b * block_bytes(q), out);
}

int32_t quant_offset(QType q) { return q == QType::kQ4_0 ? 8 : q == QType::kQ5_0 ? 16 : 0; }

}  // namespace detail

size_t block_bytes(QType q) {
  switch (q) {
    case QType::kQ8_0:
      return 2 + kBlock;
    case QType::kQ4_0:
      return 2 + kBlock / 2;
    case QType::kQ4_1:
      return 4 + kBlock / 2;
    case QType::kMxfp4:
      return 1 + kBlock / 2;
    case QType::kQ4_K:
      return 4 + 12 + 256 / 2;
    case QType::kQ5_0:
      return 2 + 4 + kBlock / 2;
    case QType::kQ6_K:
      return 128 + 64 + 16 + 2;
    case QType::kQ5_1:
      return 2 + 2 + 4 + kBlock / 2;
    case QType::kQ5_K:
      return 4 + 12 + 32 + 256 / 2;
    case QType::kIq4Nl:
      return 2 + kBlock / 2;
    case QType::kIq4Xs:
      return 2 + 2 + 4 + 256 / 2;
    case QType::kQ3_K:
      return 256 / 8 + 256 / 4 + 12 + 2;
    case QType::kQ2_K:
      return 16 + 256 / 4 + 2 + 2;
  }
  throw std::invalid_argument("unknown quantization type");
}

int64_t block_elements(QType q) {
  // The 256-element super-block formats (kSubBlocks in quant_matmul_internal.h).
  const bool super = q == QType::kQ2_K || q == QType::kQ3_K || q == QType::kQ4_K ||
                     q == QType::kQ5_K || q == QType::kQ6_K || q == QType::kIq4Xs;
  return super ? 256 : kBlock;
}

size_t row_bytes(QType q, int64_t k) {
  return block_bytes(q) * static_cast<size_t>(k / block_elements(q));
}

void dequantize_row(QType q, const uint8_t* row, float* out, int64_t k) {
  detail::Block block;
  for (int64_t b = 0; b < k / kBlock; ++b) {
    detail::read_block(q, row, b, &block);
    const int32_t offset = detail::quant_offset(q);
    if (q == QType::kQ2_K) {
      // gguf's (d * scale) * q - dmin * min.
      for (int i = 0; i < kBlock; ++i) {
        const float dl = block.d * static_cast<float>(block.half[i / 16]);
        const float ml = -block.m * static_cast<float>(block.half_min[i / 16]);
        out[b * kBlock + i] = dl * static_cast<float>(block.q[i]) - ml;
      }
      continue;
    }
    if (q == QType::kQ6_K || q == QType::kQ3_K) {
      // gguf's (d * scale) * q.
      for (int i = 0; i < kBlock; ++i) {
        const float ds = block.d * static_cast<float>(block.half[i / 16]);
        out[b * kBlock + i] = ds * static_cast<float>(block.q[i]);
      }
      continue;
    }
    for (int i = 0; i < kBlock; ++i) {
      // gguf's readings: q * d for the formats without a min (MXFP4 and the IQ4s add no 0,
      // which would turn a -0 into +0), q * d + m for the others, and Q8_0/Q4_0/Q4_1 as they
      // always were.
      const float w = (block.q[i] - offset) * block.d;
      const bool plain = q == QType::kMxfp4 || q == QType::kIq4Nl || q == QType::kIq4Xs;
      out[b * kBlock + i] = plain ? w : w + block.m;
    }
  }
}

}  // namespace met::cpu
