// dequantize_row (the kernels' reading of each GGUF block format, and the reference of every
// path's tests) against ggml's dequantize_row_* definitions, on blocks made here byte by byte;
// the sizes of blocks and rows, and K checked against the block.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "cpu/quant_matmul.h"
#include "quant_test_blocks.h"

namespace met::cpu {
namespace {

using test_blocks::to_fp16;

TEST(QuantMatmulLayout, NibbleOrderAndConstants) {
  // Q4_0, one block: low nibble of byte i is element i, high nibble element i + 16; value (q-8)*d.
  uint8_t block[18] = {};
  const uint16_t d = to_fp16(0.5f);
  std::memcpy(block, &d, 2);
  block[2] = 0x9A;  // element 0 -> 10, element 16 -> 9
  float out[32];
  dequantize_row(QType::kQ4_0, block, out, 32);
  EXPECT_FLOAT_EQ(out[0], 1.0f);
  EXPECT_FLOAT_EQ(out[16], 0.5f);
  EXPECT_FLOAT_EQ(out[1], -4.0f);
  EXPECT_EQ(block_bytes(QType::kQ8_0), 34u);
  EXPECT_EQ(block_bytes(QType::kQ4_0), 18u);
  EXPECT_EQ(block_bytes(QType::kQ4_1), 20u);
}

TEST(QuantMatmulLayout, Mxfp4FollowsGgml) {
  // E8M0 e gives 2^(e - 128) per doubled E2M1 value (ggml's GGML_E8M0_TO_FP32_HALF and
  // kvalues_mxfp4); low nibble of byte i is element i, high nibble element i + 16.
  uint8_t block[17] = {};
  block[0] = 130;   // 2^3, halved: 4 per unit
  block[1] = 0xF7;  // element 0 -> index 7 (12), element 16 -> index 15 (-12)
  block[2] = 0x39;  // element 1 -> index 9 (-1), element 17 -> index 3 (3)
  float out[32];
  dequantize_row(QType::kMxfp4, block, out, 32);
  EXPECT_EQ(out[0], 48.0f);
  EXPECT_EQ(out[16], -48.0f);
  EXPECT_EQ(out[1], -4.0f);
  EXPECT_EQ(out[17], 12.0f);
  EXPECT_EQ(out[2], 0.0f);
  EXPECT_FALSE(std::signbit(out[2]));
  // e = 0 and 1 are the float subnormals 2^-128 and 2^-127; 255 is 2^127.
  block[1] = 0x01;  // element 0 -> 1
  for (const auto& [e, want] : {std::pair<uint8_t, float>{0, std::ldexp(1.0f, -128)},
                                {1, std::ldexp(1.0f, -127)},
                                {255, std::ldexp(1.0f, 127)}}) {
    block[0] = e;
    dequantize_row(QType::kMxfp4, block, out, 32);
    EXPECT_EQ(out[0], want) << static_cast<int>(e);
  }
  EXPECT_EQ(block_bytes(QType::kMxfp4), 17u);
  EXPECT_EQ(row_bytes(QType::kMxfp4, 64), 34u);
}

TEST(QuantMatmulLayout, Q4KFollowsGgml) {
  // One super-block: w = d * scale_j * q - dmin * min_j per 32-element sub-block j, the 6-bit
  // scales and mins packed as ggml's get_scale_min_k4 reads them; 32 bytes per pair of
  // sub-blocks, the even one in the low nibbles.
  uint8_t block[144] = {};
  const uint16_t d = to_fp16(0.5f), dmin = to_fp16(0.25f);
  std::memcpy(block, &d, 2);
  std::memcpy(block + 2, &dmin, 2);
  uint8_t* packed = block + 4;
  packed[0] = 3 | (2 << 6);  // scale 0 = 3; bits 4-5 of scale 4 = 2
  packed[4] = 5 | (1 << 6);  // min 0 = 5; bits 4-5 of min 4 = 1
  packed[8] = 7 | (9 << 4);  // scale 4 low bits 7, min 4 low bits 9
  packed[3] = 63;            // scale 3 = 63
  packed[7] = 1;             // min 3 = 1
  uint8_t* qs = block + 16;
  qs[0] = 0x2A;        // sub-block 0 element 0 -> 10, sub-block 1 element 0 -> 2
  qs[32 + 31] = 0xF0;  // sub-block 2 element 31 -> 0, sub-block 3 element 31 -> 15
  qs[64 + 5] = 0x04;   // sub-block 4 element 5 -> 4
  float out[256];
  dequantize_row(QType::kQ4_K, block, out, 256);
  EXPECT_EQ(out[0], 0.5f * 3 * 10 - 0.25f * 5);
  EXPECT_EQ(out[32], 0.5f * 0 * 2 - 0.0f);  // scale 1 and min 1 are 0
  EXPECT_EQ(out[64 + 31], 0.0f);            // scale 2 = 0, min 2 = 0
  EXPECT_EQ(out[96 + 31], 0.5f * 63 * 15 - 0.25f * 1);
  // scale 4 = 7 | 2 << 4 = 39, min 4 = 9 | 1 << 4 = 25.
  EXPECT_EQ(out[128 + 5], 0.5f * 39 * 4 - 0.25f * 25);
  EXPECT_EQ(out[128 + 6], -0.25f * 25);
  EXPECT_EQ(block_bytes(QType::kQ4_K), 144u);
  EXPECT_EQ(block_elements(QType::kQ4_K), 256);
  EXPECT_EQ(row_bytes(QType::kQ4_K, 512), 288u);
}

TEST(QuantMatmulLayout, Q6KFollowsGgml) {
  // One super-block: w = d * scale[l / 16] * (q - 32) per 16 elements, q = 4 bits of the low
  // nibbles | 2 bits of the pairs << 4, laid out as ggml's dequantize_row_q6_K reads them.
  uint8_t block[210] = {};
  const uint16_t d = to_fp16(0.5f);
  std::memcpy(block + 208, &d, 2);
  int8_t* scales = reinterpret_cast<int8_t*>(block + 192);
  for (int i = 0; i < 16; ++i) scales[i] = static_cast<int8_t>(i - 5);
  block[0] = 0x3A;              // elements 0 (low nibble 10) and 64 (high nibble 3)
  block[33] = 0x07;             // element 33 (low nibble 7), element 97 (high 0)
  block[128] = 0xE4;            // pairs of element l = 0: 0 -> 0, 32 -> 1, 64 -> 2, 96 -> 3
  block[64 + 17] = 0x0F;        // element 128 + 17 low nibble 15
  block[128 + 32 + 17] = 0x02;  // its pair: 2
  float out[256];
  dequantize_row(QType::kQ6_K, block, out, 256);
  const auto scale = [&](int element) { return 0.5f * static_cast<float>(scales[element / 16]); };
  EXPECT_EQ(out[0], scale(0) * static_cast<float>((10 | 0 << 4) - 32));
  EXPECT_EQ(out[32], scale(32) * static_cast<float>((0 | 1 << 4) - 32));
  EXPECT_EQ(out[64], scale(64) * static_cast<float>((3 | 2 << 4) - 32));
  EXPECT_EQ(out[96], scale(96) * static_cast<float>((0 | 3 << 4) - 32));
  EXPECT_EQ(out[33], scale(33) * static_cast<float>(7 - 32));
  EXPECT_EQ(out[128 + 17], scale(128 + 17) * static_cast<float>((15 | 2 << 4) - 32));
  EXPECT_EQ(out[200], scale(200) * -32.0f);
  EXPECT_EQ(block_bytes(QType::kQ6_K), 210u);
  EXPECT_EQ(row_bytes(QType::kQ6_K, 512), 420u);
}

TEST(QuantMatmulLayout, Q50FollowsGgml) {
  // w = (q - 16) * d, q = nibble | bit i of the 32 bits after d << 4 (element i); low nibble of
  // byte i is element i, high nibble element i + 16.
  uint8_t block[22] = {};
  const uint16_t d = to_fp16(0.5f);
  std::memcpy(block, &d, 2);
  const uint32_t high = (1u << 0) | (1u << 17) | (1u << 31);
  std::memcpy(block + 2, &high, 4);
  block[6] = 0x3A;   // element 0 -> 10 | 16, element 16 -> 3
  block[7] = 0x5F;   // element 1 -> 15, element 17 -> 5 | 16
  block[21] = 0xF0;  // element 15 -> 0, element 31 -> 15 | 16
  float out[32];
  dequantize_row(QType::kQ5_0, block, out, 32);
  EXPECT_EQ(out[0], (26 - 16) * 0.5f);
  EXPECT_EQ(out[16], (3 - 16) * 0.5f);
  EXPECT_EQ(out[1], (15 - 16) * 0.5f);
  EXPECT_EQ(out[17], (21 - 16) * 0.5f);
  EXPECT_EQ(out[15], -8.0f);
  EXPECT_EQ(out[31], (31 - 16) * 0.5f);
  EXPECT_EQ(block_bytes(QType::kQ5_0), 22u);
}

TEST(QuantMatmulLayout, Q51FollowsGgml) {
  // w = q * d + m, q = nibble | bit i of the 32 bits after d and m << 4 (element i); low nibble
  // of byte i is element i, high nibble element i + 16.
  uint8_t block[24] = {};
  const uint16_t d = to_fp16(0.5f), m = to_fp16(-2.0f);
  std::memcpy(block, &d, 2);
  std::memcpy(block + 2, &m, 2);
  const uint32_t high = (1u << 0) | (1u << 17) | (1u << 31);
  std::memcpy(block + 4, &high, 4);
  block[8] = 0x3A;   // element 0 -> 10 | 16, element 16 -> 3
  block[9] = 0x5F;   // element 1 -> 15, element 17 -> 5 | 16
  block[23] = 0xF0;  // element 15 -> 0, element 31 -> 15 | 16
  float out[32];
  dequantize_row(QType::kQ5_1, block, out, 32);
  EXPECT_EQ(out[0], 26 * 0.5f - 2.0f);
  EXPECT_EQ(out[16], 3 * 0.5f - 2.0f);
  EXPECT_EQ(out[1], 15 * 0.5f - 2.0f);
  EXPECT_EQ(out[17], 21 * 0.5f - 2.0f);
  EXPECT_EQ(out[15], -2.0f);
  EXPECT_EQ(out[31], 31 * 0.5f - 2.0f);
  EXPECT_EQ(block_bytes(QType::kQ5_1), 24u);
}

TEST(QuantMatmulLayout, Q5KFollowsGgml) {
  // Q4_K's scales and mins, then 32 bytes qh (bit j of byte l: element l of sub-block j's fifth
  // bit), then Q4_K's nibbles: w = d * scale_j * q - dmin * min_j.
  uint8_t block[176] = {};
  const uint16_t d = to_fp16(0.5f), dmin = to_fp16(0.25f);
  std::memcpy(block, &d, 2);
  std::memcpy(block + 2, &dmin, 2);
  uint8_t* packed = block + 4;
  packed[0] = 3;           // scale 0
  packed[4] = 5;           // min 0
  packed[1] = 2;           // scale 1 (min 1 = 0)
  packed[8] = 7 | 1 << 4;  // scale 4 = 7, min 4 = 1
  uint8_t* qh = block + 16;
  qh[0] = 1 | 2;    // element 0 of sub-blocks 0 and 1
  qh[31] = 1 << 4;  // element 31 of sub-block 4
  uint8_t* qs = block + 48;
  qs[0] = 0x2A;        // sub-block 0 element 0 -> 10, sub-block 1 element 0 -> 2
  qs[64 + 31] = 0x0C;  // sub-block 4 element 31 -> 12
  float out[256];
  dequantize_row(QType::kQ5_K, block, out, 256);
  EXPECT_EQ(out[0], 0.5f * 3 * (10 + 16) - 0.25f * 5);
  EXPECT_EQ(out[1], 0.5f * 3 * 0 - 0.25f * 5);
  EXPECT_EQ(out[32], 0.5f * 2 * (2 + 16));
  EXPECT_EQ(out[33], 0.0f);
  EXPECT_EQ(out[128 + 31], 0.5f * 7 * (12 + 16) - 0.25f * 1);
  EXPECT_EQ(out[128 + 30], -0.25f * 1);
  EXPECT_EQ(block_bytes(QType::kQ5_K), 176u);
  EXPECT_EQ(block_elements(QType::kQ5_K), 256);
}

TEST(QuantMatmulLayout, Iq4NlFollowsGgml) {
  // w = d * kvalues_iq4nl[nibble]; low nibble of byte i is element i, high nibble element i + 16.
  uint8_t block[18] = {};
  const uint16_t d = to_fp16(0.5f);
  std::memcpy(block, &d, 2);
  block[2] = 0xF0;  // element 0 -> -127, element 16 -> 113
  block[3] = 0x78;  // element 1 -> 1, element 17 -> -10
  float out[32];
  dequantize_row(QType::kIq4Nl, block, out, 32);
  EXPECT_EQ(out[0], -127 * 0.5f);
  EXPECT_EQ(out[16], 113 * 0.5f);
  EXPECT_EQ(out[1], 0.5f);
  EXPECT_EQ(out[17], -5.0f);
  EXPECT_EQ(out[2], -127 * 0.5f);
  EXPECT_EQ(block_bytes(QType::kIq4Nl), 18u);
}

TEST(QuantMatmulLayout, Iq4XsFollowsGgml) {
  // fp16 d, 16-bit scales_h (2 bits per sub-block), 4 bytes scales_l (a nibble per sub-block),
  // then IQ4_NL's nibbles, 16 bytes per sub-block: w = d * (scale_j - 32) * kvalues_iq4nl[q].
  uint8_t block[136] = {};
  const uint16_t d = to_fp16(0.5f);
  std::memcpy(block, &d, 2);
  const uint16_t scales_h = 2 | 3 << 14;  // sub-block 0: high bits 2; sub-block 7: 3
  std::memcpy(block + 2, &scales_h, 2);
  block[4] = 0x51;                // sub-block 0 low nibble 1, sub-block 1: 5
  block[7] = 0xF0;                // sub-block 7: 15 (sub-block 6: 0)
  block[8] = 0x9F;                // sub-block 0: element 0 -> 113, element 16 -> 13
  block[8 + 16] = 0x08;           // sub-block 1: element 0 -> 1
  block[8 + 7 * 16 + 15] = 0x03;  // sub-block 7: element 15 -> -65, element 31 -> -127
  float out[256];
  dequantize_row(QType::kIq4Xs, block, out, 256);
  EXPECT_EQ(out[0], 0.5f * static_cast<float>((1 | 2 << 4) - 32) * 113);
  EXPECT_EQ(out[16], 0.5f * static_cast<float>((1 | 2 << 4) - 32) * 13);
  EXPECT_EQ(out[32], 0.5f * static_cast<float>(5 - 32) * 1);
  EXPECT_EQ(out[224 + 15], 0.5f * static_cast<float>((15 | 3 << 4) - 32) * -65);
  EXPECT_EQ(out[224 + 31], 0.5f * static_cast<float>((15 | 3 << 4) - 32) * -127);
  EXPECT_EQ(out[192], 0.5f * -32.0f * -127);  // sub-block 6: scale 0, nibble 0
  EXPECT_EQ(block_bytes(QType::kIq4Xs), 136u);
  EXPECT_EQ(row_bytes(QType::kIq4Xs, 512), 272u);
}

TEST(QuantMatmulLayout, Q3KFollowsGgml) {
  // 32 bytes hmask, 64 of 2-bit quants, 12 of scales, fp16 d: w = d * (scale_i - 32) * q per 16
  // elements, q = 2 bits - (hmask bit clear ? 4 : 0), laid out as ggml's dequantize_row_q3_K.
  uint8_t block[110] = {};
  const uint16_t d = to_fp16(0.5f);
  std::memcpy(block + 108, &d, 2);
  uint8_t* scales = block + 96;
  // Every scale's low 4 bits 1 (elements 0..127: bytes 0..7's low nibbles), its high bits 2:
  // (1 | 2 << 4) - 32 = 1; sub-block 8's (elements 128..143) low nibble 3, high bits 0: -29.
  for (int i = 0; i < 8; ++i) scales[i] = 0x11;
  scales[0] = 0x31;
  for (int i = 8; i < 12; ++i) scales[i] = 0xAA;
  scales[8] = 0x8A;        // sub-block 8's high bits (bits 4-5 of byte 8) 2 -> 0
  block[0] = 1 | 1 << 4;   // element 0's third bit; element 128's (block 4)
  block[32] = 3 | 2 << 2;  // element 0 -> 3, element 32 -> 2
  block[64] = 1;           // element 128 -> 1
  float out[256];
  dequantize_row(QType::kQ3_K, block, out, 256);
  EXPECT_EQ(out[0], 0.5f * 1 * 3);         // 3 + 4 - 4
  EXPECT_EQ(out[32], 0.5f * 1 * (2 - 4));  // hmask bit 1 of byte 0 clear
  EXPECT_EQ(out[1], 0.5f * 1 * -4);
  EXPECT_EQ(out[128], 0.5f * -29 * 1);  // sub-block 8: scale (3 | 0 << 4) - 32
  EXPECT_EQ(out[144], 0.5f * 1 * -4);   // sub-block 9: scale 1, q -4
  EXPECT_EQ(block_bytes(QType::kQ3_K), 110u);
  EXPECT_EQ(row_bytes(QType::kQ3_K, 512), 220u);
}

TEST(QuantMatmulLayout, Q2KFollowsGgml) {
  // 16 bytes of 4-bit scales (low) and mins (high) per 16 elements, 64 of 2-bit quants, fp16 d
  // and dmin: w = d * scale_i * q - dmin * min_i, laid out as ggml's dequantize_row_q2_K.
  uint8_t block[84] = {};
  const uint16_t d = to_fp16(0.5f), dmin = to_fp16(0.25f);
  std::memcpy(block + 80, &d, 2);
  std::memcpy(block + 82, &dmin, 2);
  block[0] = 3 | 5 << 4;   // elements 0..15: scale 3, min 5
  block[1] = 7 | 1 << 4;   // elements 16..31: scale 7, min 1
  block[10] = 2 | 9 << 4;  // elements 160..175 (block 5, first half): scale 2, min 9
  block[16] = 2 | 3 << 2;  // element 0 -> 2, element 32 -> 3
  block[16 + 17] = 1;      // element 17 -> 1
  block[48] = 3 << 2;      // element 128 + 32 = 160 -> 3
  float out[256];
  dequantize_row(QType::kQ2_K, block, out, 256);
  EXPECT_EQ(out[0], 0.5f * 3 * 2 - 0.25f * 5);
  EXPECT_EQ(out[1], -0.25f * 5);
  EXPECT_EQ(out[17], 0.5f * 7 * 1 - 0.25f * 1);
  EXPECT_EQ(out[32], 0.0f);  // scale 2 = 0, min 2 = 0
  EXPECT_EQ(out[160], 0.5f * 2 * 3 - 0.25f * 9);
  EXPECT_EQ(block_bytes(QType::kQ2_K), 84u);
  EXPECT_EQ(row_bytes(QType::kQ2_K, 512), 168u);
}

TEST(QuantMatmulLayout, RejectsKNotAMultipleOfTheBlock) {
  float x[40] = {}, y[1] = {};
  uint8_t w[68] = {};
  EXPECT_THROW(quant_matmul(x, w, y, 1, 1, 40, QType::kQ8_0, 1), std::invalid_argument);
  std::vector<float> x2(288);
  std::vector<uint8_t> w2(288);
  EXPECT_THROW(quant_matmul(x2.data(), w2.data(), y, 1, 1, 288, QType::kQ4_K, 1),
               std::invalid_argument);
}

TEST(QuantMatmulLayout, Fp16Conversion) {
  EXPECT_EQ(fp16_to_fp32(0x3C00), 1.0f);
  EXPECT_EQ(fp16_to_fp32(0xC000), -2.0f);
  EXPECT_EQ(fp16_to_fp32(0x0001), std::ldexp(1.0f, -24));
  EXPECT_TRUE(std::isinf(fp16_to_fp32(0x7C00)));
}

}  // namespace
}  // namespace met::cpu
