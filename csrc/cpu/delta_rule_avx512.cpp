// The gated delta rule's step for one head in 512-bit registers (delta_step.inc: the scalar
// kernel's operations sixteen value columns at a time, in its order, so both give the same bits)
// and the chunk form (delta_chunk.inc) built for 512-bit registers.
#include <immintrin.h>

#include <cmath>

#include "cpu/delta_rule.h"

namespace met::cpu {

namespace {

struct Lanes {
  using V = __m512;
  static constexpr int kWidth = 16;
  // 8 blocks: 8 accumulators, then 8 updates and 8 outputs, fit 32 registers.
  static constexpr int kWideBlocks = 8;
  static __mmask16 first(int64_t count) {
    return count >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << count) - 1u);
  }
  static V load(const float* p) { return _mm512_loadu_ps(p); }
  static V load_first(const float* p, __mmask16 m) { return _mm512_maskz_loadu_ps(m, p); }
  static void store(float* p, V x) { _mm512_storeu_ps(p, x); }
  static void store_first(float* p, __mmask16 m, V x) { _mm512_mask_storeu_ps(p, m, x); }
  static V set1(float x) { return _mm512_set1_ps(x); }
  static V zero() { return _mm512_setzero_ps(); }
  static V add(V a, V b) { return _mm512_add_ps(a, b); }
  static V sub(V a, V b) { return _mm512_sub_ps(a, b); }
  static V mul(V a, V b) { return _mm512_mul_ps(a, b); }
};

}  // namespace

#define MET_DELTA_STEP_HEAD delta_step_head_avx512
#include "cpu/delta_step.inc"
#undef MET_DELTA_STEP_HEAD

#define MET_DELTA_CHUNK_HEAD delta_chunk_head_avx512
#include "cpu/delta_chunk.inc"
#undef MET_DELTA_CHUNK_HEAD

}  // namespace met::cpu
