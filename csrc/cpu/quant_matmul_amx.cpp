// quant_matmul's AMX-INT8 path: quant_matmul_amx.inc on the real tile instructions. CMake
// compiles this file alone with the AVX-512 flags plus -mamx-tile -mamx-int8 (and only where the
// compiler knows them: MET_QMM_HAS_AMX); quant_matmul.cpp calls it only on a CPU whose cpuid
// reports amx_tile and amx_int8 and whose kernel granted tile data (isa.cpp), so building it
// never needs AMX hardware.
#include <immintrin.h>

#include "amx_tiles.h"

namespace met::cpu::detail {

namespace {

class HardwareTiles {
 public:
  void configure(const TileConfig& config) { _tile_loadconfig(&config); }
  void release() { _tile_release(); }

  // GCC's tile intrinsics paste their register number into the assembly as text, so they cannot
  // take a template argument; these print it from an immediate operand instead. No memory
  // clobbers: a "memory" clobber made GCC keep the epilogue's accumulators on the stack and
  // store them around every tile instruction. The kernel orders its own stores before the loads
  // that read them (fence()); a store names the 1 KiB it writes, so the epilogue's loads of it
  // stay after it.
  template <int T>
  __attribute__((always_inline)) void load(const void* base, int64_t stride) {
    asm volatile("tileloadd (%0,%1,1), %%tmm%c2" ::"r"(base), "r"(stride), "n"(T));
  }
  template <int T>
  __attribute__((always_inline)) void zero() {
    asm volatile("tilezero %%tmm%c0" ::"n"(T));
  }
  template <int C, int A, int B>
  __attribute__((always_inline)) void dpbssd() {
    asm volatile("tdpbssd %%tmm%c2, %%tmm%c1, %%tmm%c0" ::"n"(C), "n"(A), "n"(B));
  }
  // A whole C tile (16 rows of 16 int32) to base (stride 64).
  template <int T>
  __attribute__((always_inline)) void store(int32_t* base, int64_t stride) {
    asm volatile("tilestored %%tmm%c2, (%1,%3,1)"
                 : "=m"(*reinterpret_cast<int32_t(*)[256]>(base))
                 : "r"(base), "n"(T), "r"(stride));
  }
  // What the tile loads will read has been written: stores above stay above.
  static void fence() { asm volatile("" ::: "memory"); }
};

}  // namespace

}  // namespace met::cpu::detail

#define MET_QMM_TILES HardwareTiles
#define MET_QMM_AMX matmul_rows_amx
#include "quant_matmul_amx.inc"
