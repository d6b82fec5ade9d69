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

void q4_k_block(const uint8_t* row, int64_t b, detail::Block* out) {
  const uint8_t* super = row + (b / 8) * block_bytes(QType::kQ4_K);
  const int j = static_cast<int>(b % 8);
  int scale, min;
  detail::q4_k_scale_min(super + 4, j, &scale, &min);
  out->d = fp16_to_fp32(load_u16(super)) * static_cast<float>(scale);
  out->m = -(fp16_to_fp32(load_u16(super + 2)) * static_cast<float>(min));
  // 32 bytes per pair of sub-blocks: the low nibbles are sub-block 2i, the high ones 2i + 1.
  const uint8_t* qs = super + 16 + 32 * (j / 2);
  for (int i = 0; i < kBlock; ++i) out->q[i] = (qs[i] >> (4 * (j % 2))) & 0x0F;
}

}  // namespace

namespace detail {

void read_block(QType q, const uint8_t* row, int64_t b, Block* out) {
  out->half[0] = out->half[1] = 1;
  if (q == QType::kQ4_K) return q4_k_block(row, b, out);
  if (q == QType::kQ6_K) return q6_k_block(row, b, out);
  const uint8_t* block = row + b * block_bytes(q);
  out->m = 0.0f;
  if (q == QType::kMxfp4) {
    out->d = detail::e8m0_half(block[0]);
    for (int i = 0; i < kBlock / 2; ++i) {
      out->q[i] = detail::kMxfp4Values[block[1 + i] & 0x0F];
      out->q[i + kBlock / 2] = detail::kMxfp4Values[block[1 + i] >> 4];
    }
    return;
  }
  out->d = fp16_to_fp32(load_u16(block));
  if (q == QType::kQ8_0) {
    for (int i = 0; i < kBlock; ++i) out->q[i] = static_cast<int8_t>(block[2 + i]);
    return;
  }
  if (q == QType::kQ4_1) out->m = fp16_to_fp32(load_u16(block + 2));
  const uint8_t* qs = block + (q == QType::kQ4_1 ? 4 : q == QType::kQ5_0 ? 6 : 2);
  // Q5_0: bit i of the 32 bits after d is element i's fifth bit.
  uint32_t high = 0;
  if (q == QType::kQ5_0) std::memcpy(&high, block + 2, 4);
  for (int i = 0; i < kBlock / 2; ++i) {
    out->q[i] = (qs[i] & 0x0F) | (((high >> i) & 1) << 4);
    out->q[i + kBlock / 2] = (qs[i] >> 4) | (((high >> (i + kBlock / 2)) & 1) << 4);
  }
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
  }
  throw std::invalid_argument("unknown quantization type");
}

int64_t block_elements(QType q) { return q == QType::kQ4_K || q == QType::kQ6_K ? 256 : kBlock; }

size_t row_bytes(QType q, int64_t k) {
  return block_bytes(q) * static_cast<size_t>(k / block_elements(q));
}

void dequantize_row(QType q, const uint8_t* row, float* out, int64_t k) {
  detail::Block block;
  for (int64_t b = 0; b < k / kBlock; ++b) {
    detail::read_block(q, row, b, &block);
    const int32_t offset = detail::quant_offset(q);
    if (q == QType::kQ6_K) {
      // gguf's (d * scale) * q.
      for (int i = 0; i < kBlock; ++i) {
        const float ds = block.d * static_cast<float>(block.half[i / 16]);
        out[b * kBlock + i] = ds * static_cast<float>(block.q[i]);
      }
      continue;
    }
    for (int i = 0; i < kBlock; ++i) {
      // gguf's readings: q * d for the formats without a min (MXFP4 adds no 0, which would turn
      // a -0 into +0), q * d + m for the others, and Q8_0/Q4_0/Q4_1 as they always were.
      const float w = (block.q[i] - offset) * block.d;
      out[b * kBlock + i] = q == QType::kMxfp4 ? w : w + block.m;
    }
  }
}

}  // namespace met::cpu
