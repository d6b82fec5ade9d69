// Owns: the AMX tile state the amx matmul programs (LDTILECFG's 64-byte palette-1 layout, eight
//   tile registers of at most 16 rows x 64 bytes) and EmulatedTiles, a scalar emulation of the
//   five tile instructions the kernel uses (LDTILECFG, TILELOADD, TILEZERO, TDPBSSD, TILESTORED)
//   written from the ISA's definitions, so a CPU without AMX runs the amx path's weight packing,
//   blocking and float epilogue unchanged (quant_matmul_amx_emulated.cpp) and the tests can
//   compare it bit for bit with the VNNI path.
// Called by: quant_matmul_amx.inc (through quant_matmul_amx.cpp, the real instructions, and
//   quant_matmul_amx_emulated.cpp) and tests/cpp/test_quant_matmul.cc.
// Invariants: plain C++ with no intrinsics and only inline functions with internal linkage
//   (an anonymous namespace), so a copy compiled with -mavx512f can never replace another TU's.
//   TDPBSSD accumulates in int32 with wraparound, as the hardware does (no saturation). Tests
//   only: the production amx path runs the real instructions.
#pragma once

#include <cstdint>
#include <cstring>

namespace met::cpu::detail {

constexpr int kTileMaxRows = 16;
constexpr int kTileMaxBytes = 64;  // bytes per tile row

// LDTILECFG's memory operand, palette 1: per tile its bytes per row and its rows.
struct alignas(64) TileConfig {
  uint8_t palette = 1;
  uint8_t start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};
static_assert(sizeof(TileConfig) == 64, "LDTILECFG reads exactly 64 bytes");

namespace {

class EmulatedTiles {
 public:
  void configure(const TileConfig& config) {
    config_ = config;
    std::memset(tiles_, 0, sizeof(tiles_));  // LDTILECFG zeroes every tile
  }
  void release() { configure(TileConfig{}); }

  // TILELOADD: rows[t] rows of colsb[t] bytes from base, stride bytes apart; the rest zero.
  void load(int t, const void* base, int64_t stride) {
    std::memset(tiles_[t], 0, sizeof(tiles_[t]));
    const auto* src = static_cast<const uint8_t*>(base);
    for (int r = 0; r < config_.rows[t]; ++r) {
      std::memcpy(tiles_[t][r], src + r * stride, config_.colsb[t]);
    }
  }
  void zero(int t) { std::memset(tiles_[t], 0, sizeof(tiles_[t])); }

  // The kernel's spelling: tile numbers as template arguments, as the real instructions need.
  template <int T>
  void load(const void* base, int64_t stride) {
    load(T, base, stride);
  }
  template <int T>
  void zero() {
    zero(T);
  }
  template <int C, int A, int B>
  void dpbssd() {
    dpbssd(C, A, B);
  }
  template <int T>
  void store(void* base, int64_t stride) const {
    store(T, base, stride);
  }

  static void fence() {}

  // TDPBSSD: for each row m of c and dword n of c's rows,
  //   c[m][n] += sum over dwords k of a's row m: sum_i int8(a[m][4k+i]) * int8(b[k][4n+i]).
  void dpbssd(int c, int a, int b) {
    const int n_dwords = config_.colsb[c] / 4;
    const int k_dwords = config_.colsb[a] / 4;
    for (int m = 0; m < config_.rows[c]; ++m) {
      for (int n = 0; n < n_dwords; ++n) {
        uint32_t acc = read_dword(c, m, n);
        for (int k = 0; k < k_dwords; ++k) {
          for (int i = 0; i < 4; ++i) {
            const int32_t product = static_cast<int8_t>(tiles_[a][m][4 * k + i]) *
                                    static_cast<int8_t>(tiles_[b][k][4 * n + i]);
            acc += static_cast<uint32_t>(product);
          }
        }
        std::memcpy(&tiles_[c][m][4 * n], &acc, 4);
      }
    }
  }

  // TILESTORED: rows[t] rows of colsb[t] bytes to base, stride bytes apart.
  void store(int t, void* base, int64_t stride) const {
    auto* dst = static_cast<uint8_t*>(base);
    for (int r = 0; r < config_.rows[t]; ++r) {
      std::memcpy(dst + r * stride, tiles_[t][r], config_.colsb[t]);
    }
  }

 private:
  uint32_t read_dword(int t, int row, int dword) const {
    uint32_t v;
    std::memcpy(&v, &tiles_[t][row][4 * dword], 4);
    return v;
  }

  TileConfig config_;
  uint8_t tiles_[8][kTileMaxRows][kTileMaxBytes] = {};
};

}  // namespace

}  // namespace met::cpu::detail
