// quant_matmul against a float reference (dequantize_row, then a double-precision dot) and each
// SIMD path against the scalar path, for Q8_0, Q4_0, Q4_1, Q5_0, MXFP4 and Q4_K blocks built here
// byte by byte (dequantize_row itself against ggml's definitions on hand-made blocks); the
// AMX-INT8 kernel (emulated tiles on every AVX-512 VNNI CPU, the real ones where the CPU has
// them) bit for bit against the VNNI kernel, and the tile emulation against the ISA's definition.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "cpu/amx_tiles.h"
#include "cpu/quant_matmul.h"

namespace met::cpu {
namespace {

uint16_t to_fp16(float f) {
  // Scales here are normal and well inside fp16's range; truncating the mantissa is exact enough
  // because the reference reads back the same bits.
  uint32_t bits;
  std::memcpy(&bits, &f, 4);
  const uint32_t sign = (bits >> 16) & 0x8000u;
  const int32_t exponent = static_cast<int32_t>((bits >> 23) & 0xFF) - 127 + 15;
  return static_cast<uint16_t>(sign | (static_cast<uint32_t>(exponent) << 10) |
                               ((bits >> 13) & 0x3FFu));
}

// K rounded up to a multiple of the format's block (Q4_K's super-blocks are 256 wide).
int64_t fit_k(QType q, int64_t k) {
  const int64_t unit = block_elements(q);
  return (k + unit - 1) / unit * unit;
}

// Random quants and scales: the kernel must read any valid block, not only a quantizer's output.
std::vector<uint8_t> random_weights(QType q, int64_t n, int64_t k, std::mt19937& rng) {
  std::vector<uint8_t> w(row_bytes(q, k) * n);
  std::uniform_real_distribution<float> scale(0.001f, 0.05f);
  std::uniform_int_distribution<int> byte(0, 255);
  const size_t bb = block_bytes(q);
  for (size_t b = 0; b < w.size() / bb; ++b) {
    uint8_t* block = w.data() + b * bb;
    if (q == QType::kMxfp4 || q == QType::kQ4_K || q == QType::kQ6_K) {
      for (size_t i = 0; i < bb; ++i) block[i] = static_cast<uint8_t>(byte(rng));
      if (q == QType::kMxfp4) {
        // E8M0 scales 2^(e - 127) from 2^-11 to 2^-2, halved against the doubled values.
        block[0] = static_cast<uint8_t>(116 + byte(rng) % 10);
      } else if (q == QType::kQ6_K) {
        // fp16 d last; the int8 scales of the halves, the nibbles and pairs stay random.
        const uint16_t d = to_fp16(scale(rng) / 16.0f);
        std::memcpy(block + 208, &d, 2);
      } else {
        // fp16 d and dmin; the 6-bit scales and mins and the nibbles stay random.
        const uint16_t d = to_fp16(scale(rng) / 16.0f), dmin = to_fp16(scale(rng) / 8.0f);
        std::memcpy(block, &d, 2);
        std::memcpy(block + 2, &dmin, 2);
      }
      continue;
    }
    const uint16_t d = to_fp16(scale(rng));
    std::memcpy(block, &d, 2);
    size_t first = 2;
    if (q == QType::kQ4_1) {
      const uint16_t m = to_fp16(-scale(rng) * 8.0f);
      std::memcpy(block + 2, &m, 2);
      first = 4;
    }
    for (size_t i = first; i < bb; ++i) block[i] = static_cast<uint8_t>(byte(rng));
    if (q == QType::kQ8_0) {
      for (size_t i = first; i < bb; ++i) block[i] = block[i] == 0x80 ? 0x81 : block[i];
    }
  }
  return w;
}

std::vector<float> reference(const std::vector<float>& x, const std::vector<uint8_t>& w, QType q,
                             int64_t m, int64_t n, int64_t k) {
  std::vector<float> row(k), y(m * n);
  for (int64_t col = 0; col < n; ++col) {
    dequantize_row(q, w.data() + col * row_bytes(q, k), row.data(), k);
    for (int64_t r = 0; r < m; ++r) {
      double acc = 0.0;
      for (int64_t i = 0; i < k; ++i) acc += static_cast<double>(x[r * k + i]) * row[i];
      y[r * n + col] = static_cast<float>(acc);
    }
  }
  return y;
}

double relative_error(const std::vector<float>& got, const std::vector<float>& want) {
  double diff = 0.0, norm = 0.0;
  for (size_t i = 0; i < want.size(); ++i) {
    diff += (got[i] - want[i]) * static_cast<double>(got[i] - want[i]);
    norm += want[i] * static_cast<double>(want[i]);
  }
  return std::sqrt(diff / norm);
}

class QuantMatmul : public ::testing::TestWithParam<QType> {};

TEST_P(QuantMatmul, MatchesDequantizedReferenceOnEveryPath) {
  const QType q = GetParam();
  std::mt19937 rng(7);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (const int64_t m : {1, 3, 5, 8}) {
    // N not a multiple of the 16-column chunk, 3 blocks per row (Q4_K: one super-block).
    const int64_t n = 37, k = fit_k(q, 96);
    const auto w = random_weights(q, n, k, rng);
    std::vector<float> x(m * k);
    for (auto& v : x) v = normal(rng);
    const auto want = reference(x, w, q, m, n, k);

    std::vector<float> scalar(m * n);
    quant_matmul(x.data(), w.data(), scalar.data(), m, n, k, q, 2, Isa::kScalar);
    // int8 activations carry about 1/254 relative error per element; over K terms with mixed
    // signs the output error stays well under 1e-2 relative.
    EXPECT_LT(relative_error(scalar, want), 1e-2) << "m=" << m;

    for (const Isa isa : {Isa::kAvx2, Isa::kAvx512Vnni, Isa::kAuto}) {
      if (!isa_supported(isa)) continue;
      std::vector<float> simd(m * n);
      quant_matmul(x.data(), w.data(), simd.data(), m, n, k, q, 2, isa);
      // The same integer dot products summed in another order: float rounding only.
      for (size_t i = 0; i < simd.size(); ++i) {
        EXPECT_NEAR(simd[i], scalar[i], 1e-4f * (1.0f + std::fabs(scalar[i])))
            << isa_name(isa) << " m=" << m << " i=" << i;
      }
    }
  }
}

TEST_P(QuantMatmul, EachRowIsBitwiseIndependentOfTheBatch) {
  // A row's output must not depend on M, on the rows tiled with it, or on which column chunk or
  // thread computes it: batched decode and prefill then agree with batch-1 runs bit for bit.
  // K = 1312 is 41 blocks: more than one d * scale table segment, a partial 8-block group and an
  // odd last block; N = 37 leaves partial column tiles in the last chunk; M = 512 spans six row
  // panels of 96 rows (quant_matmul.cpp's panel_rows), the last one partial.
  const QType q = GetParam();
  const int64_t n = 37, k = fit_k(q, 1312), max_m = 512;
  std::mt19937 rng(11);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  const auto w = random_weights(q, n, k, rng);
  std::vector<float> x(max_m * k);
  for (auto& v : x) v = normal(rng);
  for (const Isa isa : {Isa::kScalar, Isa::kAvx2, Isa::kAvx512Vnni}) {
    if (!isa_supported(isa)) continue;
    std::vector<float> single(max_m * n);
    for (int64_t r = 0; r < max_m; ++r) {
      quant_matmul(x.data() + r * k, w.data(), single.data() + r * n, 1, n, k, q, 1, isa);
    }
    std::vector<int64_t> batches;
    for (int64_t m = 1; m <= 40; ++m) batches.push_back(m);
    batches.push_back(max_m);
    for (const int64_t m : batches) {
      // Batches start at varying rows so each row meets different neighbours in its tile.
      const int64_t first = (m * 7) % (max_m - m + 1);
      std::vector<float> y(m * n);
      quant_matmul(x.data() + first * k, w.data(), y.data(), m, n, k, q, 2, isa);
      for (int64_t r = 0; r < m; ++r) {
        ASSERT_EQ(std::memcmp(y.data() + r * n, single.data() + (first + r) * n, n * sizeof(float)),
                  0)
            << isa_name(isa) << " m=" << m << " row " << first + r;
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Formats, QuantMatmul,
                         ::testing::Values(QType::kQ8_0, QType::kQ4_0, QType::kQ4_1, QType::kQ5_0,
                                           QType::kMxfp4, QType::kQ4_K, QType::kQ6_K));

// Every amx test restores the default rows from which tiles are taken.
class AmxTiles : public ::testing::TestWithParam<QType> {
 protected:
  void SetUp() override {
    if (!isa_supported(Isa::kAmxEmulated)) GTEST_SKIP() << "emulated AMX tiles need AVX-512 VNNI";
  }
  void TearDown() override { set_amx_min_rows(kAmxMinRows); }
};

// y on `isa` for the rows [0, m) of x, two threads.
std::vector<float> run(Isa isa, const std::vector<float>& x, const std::vector<uint8_t>& w, QType q,
                       int64_t m, int64_t n, int64_t k) {
  std::vector<float> y(m * n);
  quant_matmul(x.data(), w.data(), y.data(), m, n, k, q, 2, isa);
  return y;
}

TEST_P(AmxTiles, TilesAndVnniRegistersGiveEveryRowTheSameBits) {
  // M around the 16-row tile and the 8-row VNNI groups, N around the 16-column panel, K of one,
  // two, three and 41 blocks: tiles for every M (min rows 1), VNNI registers below 16 rows (the
  // default) and the avx512 path give the same bits, each row the bits it gets alone, and stay
  // within 1e-4 of the scalar path.
  const QType q = GetParam();
  std::mt19937 rng(5);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (const int64_t k_wanted : {32, 64, 96, 1312}) {
    // Q4_K: 256 once (its first three widths round up to it), then 1536.
    const int64_t k = fit_k(q, k_wanted);
    if (k != k_wanted && k == fit_k(q, 32) && k_wanted != 32) continue;
    for (const int64_t n : {1, 2, 17, 37}) {
      const auto w = random_weights(q, n, k, rng);
      std::vector<float> x(40 * k);
      for (auto& v : x) v = normal(rng);
      set_amx_min_rows(kAmxMinRows);
      std::vector<std::vector<float>> alone;
      for (int64_t r = 0; r < 40; ++r) {
        std::vector<float> row(x.begin() + r * k, x.begin() + (r + 1) * k);
        alone.push_back(run(Isa::kAmxEmulated, row, w, q, 1, n, k));
      }
      for (const int64_t m : {1, 7, 9, 15, 16, 17, 40}) {
        set_amx_min_rows(kAmxMinRows);
        const auto registers = run(Isa::kAmxEmulated, x, w, q, m, n, k);
        set_amx_min_rows(1);
        const auto tiles = run(Isa::kAmxEmulated, x, w, q, m, n, k);
        ASSERT_EQ(std::memcmp(tiles.data(), registers.data(), tiles.size() * sizeof(float)), 0)
            << "m=" << m << " n=" << n << " k=" << k;
        for (int64_t r = 0; r < m; ++r) {
          ASSERT_EQ(std::memcmp(tiles.data() + r * n, alone[r].data(), n * sizeof(float)), 0)
              << "row " << r << " m=" << m << " n=" << n << " k=" << k;
        }
        // The avx512 path runs the same VNNI-register kernel for every M.
        const auto vnni = run(Isa::kAvx512Vnni, x, w, q, m, n, k);
        ASSERT_EQ(std::memcmp(vnni.data(), tiles.data(), tiles.size() * sizeof(float)), 0)
            << "avx512 m=" << m << " n=" << n << " k=" << k;
        // The scalar and AVX2 paths sum the same exact integer dots in other float orders.
        const auto scalar = run(Isa::kScalar, x, w, q, m, n, k);
        const auto avx2 = run(Isa::kAvx2, x, w, q, m, n, k);
        for (size_t i = 0; i < scalar.size(); ++i) {
          ASSERT_NEAR(tiles[i], scalar[i], 1e-4f * (1.0f + std::fabs(scalar[i])))
              << "m=" << m << " n=" << n << " k=" << k << " i=" << i;
          ASSERT_NEAR(avx2[i], scalar[i], 1e-4f * (1.0f + std::fabs(scalar[i])))
              << "avx2 m=" << m << " n=" << n << " k=" << k << " i=" << i;
        }
      }
    }
  }
}

TEST_P(AmxTiles, RealTilesMatchTheEmulatedOnes) {
  if (!isa_supported(Isa::kAmxInt8)) {
    GTEST_SKIP() << "no AMX-INT8 here (cpuid amx_tile/amx_int8, tile permission or a compiler "
                    "with -mamx-int8): the real tiles are not tested on this machine";
  }
  const QType q = GetParam();
  std::mt19937 rng(9);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  const int64_t n = 37, k = fit_k(q, 1312);
  const auto w = random_weights(q, n, k, rng);
  std::vector<float> x(70 * k);
  for (auto& v : x) v = normal(rng);
  for (const int64_t min_rows : {int64_t{1}, kAmxMinRows}) {
    set_amx_min_rows(min_rows);
    for (const int64_t m : {1, 15, 16, 17, 70}) {
      const auto emulated = run(Isa::kAmxEmulated, x, w, q, m, n, k);
      const auto real = run(Isa::kAmxInt8, x, w, q, m, n, k);
      ASSERT_EQ(std::memcmp(real.data(), emulated.data(), real.size() * sizeof(float)), 0)
          << m << " from " << min_rows;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Formats, AmxTiles,
                         ::testing::Values(QType::kQ8_0, QType::kQ4_0, QType::kQ4_1, QType::kQ5_0,
                                           QType::kMxfp4, QType::kQ4_K, QType::kQ6_K));

TEST(AmxTileEmulation, FollowsTheIsaDefinitions) {
  // Partial shapes (7 rows, 40-byte A rows, 12-byte C rows), strided loads, int8 extremes.
  detail::TileConfig config;
  config.rows[0] = 7;
  config.colsb[0] = 12;  // C: 7 x 3 int32
  config.rows[1] = 7;
  config.colsb[1] = 40;  // A: 7 x 40 int8 (10 dwords of K)
  config.rows[2] = 10;
  config.colsb[2] = 12;  // B: 10 dword rows x 3 columns x 4 bytes
  std::mt19937 rng(3);
  std::uniform_int_distribution<int> byte(-128, 127);
  std::vector<int8_t> a(7 * 48), b(10 * 16);
  for (auto& v : a) v = static_cast<int8_t>(byte(rng));
  for (auto& v : b) v = static_cast<int8_t>(byte(rng));
  std::vector<int32_t> c(7 * 3, 5), want(7 * 3);
  for (int m = 0; m < 7; ++m) {
    for (int n = 0; n < 3; ++n) {
      int32_t acc = 5;
      for (int kk = 0; kk < 10; ++kk) {
        for (int i = 0; i < 4; ++i) acc += a[m * 48 + 4 * kk + i] * b[kk * 16 + 4 * n + i];
      }
      want[m * 3 + n] = acc;
    }
  }
  detail::EmulatedTiles tiles;
  tiles.configure(config);
  tiles.load(0, c.data(), 12);
  tiles.load(1, a.data(), 48);
  tiles.load(2, b.data(), 16);
  tiles.dpbssd(0, 1, 2);
  std::vector<int32_t> got(7 * 4, -1);  // stored with a 16-byte stride: the 4th column untouched
  tiles.store(0, got.data(), 16);
  for (int m = 0; m < 7; ++m) {
    for (int n = 0; n < 3; ++n) EXPECT_EQ(got[m * 4 + n], want[m * 3 + n]) << m << "," << n;
    EXPECT_EQ(got[m * 4 + 3], -1);
  }
  tiles.zero(0);
  tiles.store(0, got.data(), 16);
  EXPECT_EQ(got[0], 0);
}

TEST(AmxTileEmulation, TheAmxPathNamesItsKernels) {
  EXPECT_EQ(isa_description(Isa::kAvx512Vnni), "avx512vnni");
  EXPECT_EQ(isa_description(Isa::kAmxInt8),
            "amx-int8 tiles for M>=16, the same dots on avx512vnni below");
  EXPECT_STREQ(isa_name(Isa::kAmxEmulated), "amx-emulated");
}

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
