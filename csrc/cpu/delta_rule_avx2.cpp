// The gated delta rule's step for one head in 256-bit registers (delta_step.inc: the scalar
// kernel's operations eight value columns at a time, in its order, so both give the same bits)
// and the chunk form (delta_chunk.inc) built for 256-bit registers, for CPUs without AVX-512.
#include <immintrin.h>

#include <cmath>

#include "cpu/delta_rule.h"

namespace met::cpu {

namespace {

struct Lanes {
  using V = __m256;
  static constexpr int kWidth = 8;
  // 4 blocks: 4 updates, 4 outputs and the broadcasts fit 16 registers without spilling.
  static constexpr int kWideBlocks = 4;
  static __m256i first(int64_t count) {
    return _mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int>(count)),
                              _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
  }
  static V load(const float* p) { return _mm256_loadu_ps(p); }
  static V load_first(const float* p, __m256i m) { return _mm256_maskload_ps(p, m); }
  static void store(float* p, V x) { _mm256_storeu_ps(p, x); }
  static void store_first(float* p, __m256i m, V x) { _mm256_maskstore_ps(p, m, x); }
  static V set1(float x) { return _mm256_set1_ps(x); }
  static V zero() { return _mm256_setzero_ps(); }
  static V add(V a, V b) { return _mm256_add_ps(a, b); }
  static V sub(V a, V b) { return _mm256_sub_ps(a, b); }
  static V mul(V a, V b) { return _mm256_mul_ps(a, b); }
};

}  // namespace

#define MET_DELTA_STEP_HEAD delta_step_head_avx2
#include "cpu/delta_step.inc"
#undef MET_DELTA_STEP_HEAD

#define MET_DELTA_CHUNK_HEAD delta_chunk_head_avx2
#include "cpu/delta_chunk.inc"
#undef MET_DELTA_CHUNK_HEAD

}  // namespace met::cpu
