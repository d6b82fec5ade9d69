// quant_matmul against a float reference (dequantize_row, then a double-precision dot) and each
// SIMD path against the scalar path (the avx512 and amx paths bit for bit), for every format's
// random valid blocks (quant_test_blocks.h; dequantize_row itself against ggml's definitions on
// hand-made blocks: test_quant_layout.cc); the AMX-INT8 kernel (emulated tiles on every AVX-512
// VNNI CPU, the real ones where the CPU has them) bit for bit against the VNNI kernel, and the tile
// emulation against the ISA's definition.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "cpu/amx_tiles.h"
#include "cpu/quant_matmul.h"
#include "quant_test_blocks.h"

namespace met::cpu {
namespace {

using test_blocks::fit_k;
using test_blocks::random_weights;

// Every format the kernels read: each test below runs on all of them.
constexpr QType kFormats[] = {QType::kQ8_0, QType::kQ4_0,  QType::kQ4_1,  QType::kQ5_0,
                              QType::kQ5_1, QType::kMxfp4, QType::kIq4Nl, QType::kQ2_K,
                              QType::kQ3_K, QType::kQ4_K,  QType::kQ5_K,  QType::kQ6_K,
                              QType::kIq4Xs};

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
  for (const int64_t m : {1, 15, 16, 17, 64, 512}) {
    // N not a multiple of the 16-column chunk, 3 blocks per row (the super-block formats: one).
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

    for (const Isa isa : {Isa::kAvx2, Isa::kAvx512Vnni, Isa::kAmxEmulated, Isa::kAmxInt8}) {
      if (!isa_supported(isa)) continue;
      std::vector<float> simd(m * n);
      quant_matmul(x.data(), w.data(), simd.data(), m, n, k, q, 2, isa);
      if (isa != Isa::kAvx2) {
        // The same exact int32 per block and the same epilogue as the scalar path: its bits.
        ASSERT_EQ(std::memcmp(simd.data(), scalar.data(), simd.size() * sizeof(float)), 0)
            << isa_name(isa) << " m=" << m;
        continue;
      }
      // AVX2 sums the same integer dot products in another order: float rounding only.
      for (size_t i = 0; i < simd.size(); ++i) {
        ASSERT_NEAR(simd[i], scalar[i], 1e-4f * (1.0f + std::fabs(scalar[i])))
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

INSTANTIATE_TEST_SUITE_P(Formats, QuantMatmul, ::testing::ValuesIn(kFormats));

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

INSTANTIATE_TEST_SUITE_P(Formats, AmxTiles, ::testing::ValuesIn(kFormats));

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

}  // namespace
}  // namespace met::cpu
