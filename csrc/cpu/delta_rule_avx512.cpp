// The gated delta rule's step for one head in 512-bit registers: the scalar kernel's operations
// (delta_rule.cpp) sixteen value columns at a time, in its order, so both give the same bits;
// and the chunk form (delta_chunk.inc) built for 512-bit registers.
#include <immintrin.h>

#include <cmath>

#include "cpu/delta_rule.h"

namespace met::cpu {

void delta_step_head_avx512(const float* q, const float* k, const float* v, float g, float beta,
                            float* state, float* out, int64_t k_dim, int64_t v_dim,
                            float* scratch) {
  const float decay_s = std::exp(g);
  const __m512 decay = _mm512_set1_ps(decay_s);
  float* delta = scratch;
  for (int64_t j0 = 0; j0 < v_dim; j0 += 16) {
    const int64_t left = v_dim - j0;
    const __mmask16 m = left >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << left) - 1u);
    __m512 acc = _mm512_setzero_ps();
    for (int64_t i = 0; i < k_dim; ++i) {
      float* row = state + i * v_dim + j0;
      __m512 s = _mm512_mul_ps(_mm512_maskz_loadu_ps(m, row), decay);
      _mm512_mask_storeu_ps(row, m, s);
      acc = _mm512_add_ps(acc, _mm512_mul_ps(s, _mm512_set1_ps(k[i])));
    }
    const __m512 d =
        _mm512_mul_ps(_mm512_sub_ps(_mm512_maskz_loadu_ps(m, v + j0), acc), _mm512_set1_ps(beta));
    _mm512_mask_storeu_ps(delta + j0, m, d);
    __m512 o = _mm512_setzero_ps();
    for (int64_t i = 0; i < k_dim; ++i) {
      float* row = state + i * v_dim + j0;
      __m512 s =
          _mm512_add_ps(_mm512_maskz_loadu_ps(m, row), _mm512_mul_ps(_mm512_set1_ps(k[i]), d));
      _mm512_mask_storeu_ps(row, m, s);
      o = _mm512_add_ps(o, _mm512_mul_ps(s, _mm512_set1_ps(q[i])));
    }
    _mm512_mask_storeu_ps(out + j0, m, o);
  }
}

#define MET_DELTA_CHUNK_HEAD delta_chunk_head_avx512
#include "cpu/delta_chunk.inc"
#undef MET_DELTA_CHUNK_HEAD

}  // namespace met::cpu
