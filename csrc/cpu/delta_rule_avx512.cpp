// The gated delta rule's step for one head in 512-bit registers: the scalar kernel's operations
// (delta_rule.cpp) sixteen value columns at a time, in its order, so both give the same bits;
// and the chunk form (delta_chunk.inc) built for 512-bit registers.
#include <immintrin.h>

#include <cmath>

#include "cpu/delta_rule.h"

namespace met::cpu {

namespace {

// The step over `NB` blocks of sixteen value columns from j0 (the last block masked by `m`).
// Each column's operations and their order are the scalar kernel's; the blocks only interleave
// independent columns, so that NB chains of dependent adds run at once instead of one. The
// first pass does not store the decayed state: the second computes it again (the same rounding)
// and stores the updated one, so the state is written once a step.
template <int NB>
void step_columns(const float* q, const float* k, const float* v, __m512 decay, __m512 beta,
                  float* state, float* out, int64_t k_dim, int64_t v_dim, int64_t j0, __mmask16 m) {
  __m512 acc[NB];
  for (int b = 0; b < NB; ++b) acc[b] = _mm512_setzero_ps();
  for (int64_t i = 0; i < k_dim; ++i) {
    float* row = state + i * v_dim + j0;
    const __m512 ki = _mm512_set1_ps(k[i]);
    for (int b = 0; b < NB; ++b) {
      const __mmask16 mb = b == NB - 1 ? m : __mmask16(0xFFFF);
      const __m512 s = _mm512_mul_ps(_mm512_maskz_loadu_ps(mb, row + 16 * b), decay);
      acc[b] = _mm512_add_ps(acc[b], _mm512_mul_ps(s, ki));
    }
  }
  __m512 d[NB], o[NB];
  for (int b = 0; b < NB; ++b) {
    const __mmask16 mb = b == NB - 1 ? m : __mmask16(0xFFFF);
    d[b] = _mm512_mul_ps(_mm512_sub_ps(_mm512_maskz_loadu_ps(mb, v + j0 + 16 * b), acc[b]), beta);
    o[b] = _mm512_setzero_ps();
  }
  for (int64_t i = 0; i < k_dim; ++i) {
    float* row = state + i * v_dim + j0;
    const __m512 ki = _mm512_set1_ps(k[i]), qi = _mm512_set1_ps(q[i]);
    for (int b = 0; b < NB; ++b) {
      const __mmask16 mb = b == NB - 1 ? m : __mmask16(0xFFFF);
      const __m512 decayed = _mm512_mul_ps(_mm512_maskz_loadu_ps(mb, row + 16 * b), decay);
      const __m512 s = _mm512_add_ps(decayed, _mm512_mul_ps(ki, d[b]));
      _mm512_mask_storeu_ps(row + 16 * b, mb, s);
      o[b] = _mm512_add_ps(o[b], _mm512_mul_ps(s, qi));
    }
  }
  for (int b = 0; b < NB; ++b) {
    _mm512_mask_storeu_ps(out + j0 + 16 * b, b == NB - 1 ? m : __mmask16(0xFFFF), o[b]);
  }
}

}  // namespace

void delta_step_head_avx512(const float* q, const float* k, const float* v, float g, float beta,
                            float* state, float* out, int64_t k_dim, int64_t v_dim,
                            float* /*scratch*/) {
  const __m512 decay = _mm512_set1_ps(std::exp(g)), beta_v = _mm512_set1_ps(beta);
  // 128 columns a pass (Qwen3.5's v_dim), then 64, then 16: the widest pass the columns fill.
  int64_t j0 = 0;
  for (; j0 + 128 <= v_dim; j0 += 128) {
    step_columns<8>(q, k, v, decay, beta_v, state, out, k_dim, v_dim, j0, 0xFFFF);
  }
  for (; j0 + 64 <= v_dim; j0 += 64) {
    step_columns<4>(q, k, v, decay, beta_v, state, out, k_dim, v_dim, j0, 0xFFFF);
  }
  for (; j0 < v_dim; j0 += 16) {
    const int64_t left = v_dim - j0;
    const __mmask16 m = left >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << left) - 1u);
    step_columns<1>(q, k, v, decay, beta_v, state, out, k_dim, v_dim, j0, m);
  }
}

#define MET_DELTA_CHUNK_HEAD delta_chunk_head_avx512
#include "cpu/delta_chunk.inc"
#undef MET_DELTA_CHUNK_HEAD

}  // namespace met::cpu
