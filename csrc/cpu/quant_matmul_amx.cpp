// quant_matmul's AMX-INT8 path: quant_matmul_amx.inc on the real tile instructions. CMake
// compiles this file alone with the AVX-512 flags plus -mamx-tile -mamx-int8 (and only where the
// compiler knows them: MET_QMM_HAS_AMX); quant_matmul.cpp calls it only on a CPU whose cpuid
// reports amx_tile and amx_int8 and whose kernel granted tile data (isa.cpp), so building it
// never needs AMX hardware.
#include <immintrin.h>

#include "amx_tiles.h"

namespace met::cpu::detail {

namespace {

// The tile instructions take their register as an immediate (GCC's intrinsics paste it into the
// assembly), so each tile number the kernel uses gets its own branch; inlined with constant
// arguments, the branches fold away.
class HardwareTiles {
 public:
  void configure(const TileConfig& config) { _tile_loadconfig(&config); }
  void release() { _tile_release(); }

  __attribute__((always_inline)) void load(int t, const void* base, int64_t stride) {
    // TILELOADD's asm names no memory operand: keep the packing stores before it.
    asm volatile("" ::: "memory");
    switch (t) {
      case 2:
        _tile_loadd(2, base, stride);
        break;
      case 3:
        _tile_loadd(3, base, stride);
        break;
      case 4:
        _tile_loadd(4, base, stride);
        break;
      case 5:
        _tile_loadd(5, base, stride);
        break;
      default:
        __builtin_trap();
    }
  }
  __attribute__((always_inline)) void zero(int t) {
    if (t == 0) {
      _tile_zero(0);
    } else if (t == 1) {
      _tile_zero(1);
    } else {
      __builtin_trap();
    }
  }
  __attribute__((always_inline)) void dpbssd(int c, int a, int b) {
    if (c == 0 && a == 2 && b == 3) {
      _tile_dpbssd(0, 2, 3);
    } else if (c == 1 && a == 4 && b == 5) {
      _tile_dpbssd(1, 4, 5);
    } else {
      __builtin_trap();
    }
  }
  __attribute__((always_inline)) void store(int t, void* base, int64_t stride) {
    if (t == 0) {
      _tile_stored(0, base, stride);
    } else if (t == 1) {
      _tile_stored(1, base, stride);
    } else {
      __builtin_trap();
    }
  }
};

}  // namespace

}  // namespace met::cpu::detail

#define MET_QMM_TILES HardwareTiles
#define MET_QMM_AMX matmul_rows_amx
#include "quant_matmul_amx.inc"
