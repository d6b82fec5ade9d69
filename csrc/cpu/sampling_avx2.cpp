// The draw's vocabulary loops in 256-bit registers (sampling_internal.h), AVX2 only: 8 tokens'
// scaled logits and noise bits at a time, the 64-bit hash multiplied in 32-bit halves. As in
// the AVX-512 build, a token goes to the exact scalar step only when its noise bound says it
// could win, so every build returns the same token.
#include <immintrin.h>

#include <cstdint>

#include "cpu/sampling_internal.h"

namespace met::cpu::detail {
namespace {

// a * c mod 2^64 per lane from 32-bit products: lo*lo + ((hi*lo + lo*hi) << 32).
__m256i mul64(__m256i a, uint64_t c) {
  const __m256i c_lo = _mm256_set1_epi64x(static_cast<int64_t>(c & 0xFFFFFFFFull));
  const __m256i c_hi = _mm256_set1_epi64x(static_cast<int64_t>(c >> 32));
  const __m256i cross =
      _mm256_add_epi64(_mm256_mul_epu32(_mm256_srli_epi64(a, 32), c_lo), _mm256_mul_epu32(a, c_hi));
  return _mm256_add_epi64(_mm256_mul_epu32(a, c_lo), _mm256_slli_epi64(cross, 32));
}

// kernels::mix64 on 4 lanes.
__m256i mix64(__m256i x) {
  x = _mm256_xor_si256(x, _mm256_srli_epi64(x, 30));
  x = mul64(x, 0xBF58476D1CE4E5B9ull);
  x = _mm256_xor_si256(x, _mm256_srli_epi64(x, 27));
  x = mul64(x, 0x94D049BB133111EBull);
  return _mm256_xor_si256(x, _mm256_srli_epi64(x, 31));
}

// kernels::sample_bits of tokens first .. first + 3, in the low 32 bits of each lane.
__m256i bits4(uint64_t row_key, uint32_t first) {
  const __m256i token = _mm256_add_epi64(_mm256_set1_epi64x(first), _mm256_setr_epi64x(0, 1, 2, 3));
  const __m256i salted =
      _mm256_add_epi64(mul64(token, 0xD1B54A32D192ED03ull), _mm256_set1_epi64x(1));
  const __m256i x =
      mix64(_mm256_xor_si256(_mm256_set1_epi64x(static_cast<int64_t>(row_key)), salted));
  return _mm256_srli_epi64(x, 64 - kernels::kSampleBits);
}

// sample_bits of tokens first .. first + 7 as 8 int32 lanes.
__m256i bits8(uint64_t row_key, uint32_t first) {
  const __m256i low = _mm256_setr_epi32(0, 2, 4, 6, 0, 2, 4, 6);
  const __m256i a = _mm256_permutevar8x32_epi32(bits4(row_key, first), low);
  const __m256i b = _mm256_permutevar8x32_epi32(bits4(row_key, first + 4), low);
  return _mm256_blend_epi32(a, b, 0xF0);
}

// noise_bound on 8 lanes, in noise_bound's operations and order (y >= 1/2 is normal, so its
// exponent bits are ilogb(y) + 127).
__m256 bound8(__m256i bits) {
  const __m256i top = _mm256_set1_epi32(static_cast<int32_t>((1u << kernels::kSampleBits) - 1u));
  const __m256 y =
      _mm256_add_ps(_mm256_cvtepi32_ps(_mm256_sub_epi32(top, bits)), _mm256_set1_ps(0.5f));
  const __m256i exponent =
      _mm256_sub_epi32(_mm256_srli_epi32(_mm256_castps_si256(y), 23), _mm256_set1_epi32(127));
  const __m256 whole =
      _mm256_cvtepi32_ps(_mm256_sub_epi32(_mm256_set1_epi32(kernels::kSampleBits), exponent));
  return _mm256_add_ps(_mm256_mul_ps(whole, _mm256_set1_ps(kLn2)), _mm256_set1_ps(0.01f));
}

float scale(const float* logits, float* z, int32_t vocab, float inv_t) {
  const __m256 factor = _mm256_set1_ps(inv_t), minus_inf = _mm256_set1_ps(-kInf);
  __m256 best = minus_inf;
  int32_t i = 0;
  for (; i + 8 <= vocab; i += 8) {
    __m256 v =
        _mm256_add_ps(_mm256_mul_ps(_mm256_loadu_ps(logits + i), factor), _mm256_setzero_ps());
    v = _mm256_blendv_ps(v, minus_inf, _mm256_cmp_ps(v, v, _CMP_UNORD_Q));
    _mm256_storeu_ps(z + i, v);
    best = _mm256_max_ps(best, v);
  }
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, best);
  float m = scale_scalar(logits + i, z + i, vocab - i, inv_t);
  for (const float lane : lanes) m = lane > m ? lane : m;
  return m;
}

void draw(DrawState& s, int32_t vocab) {
  const __m256 m = _mm256_set1_ps(s.m), noise_max = _mm256_set1_ps(kNoiseMax);
  const __m256 floor = _mm256_set1_ps(s.floor);
  int32_t i = 0;
  for (; i + 8 <= vocab; i += 8) {
    // needed = best - (z - m): the noise each token needs to beat the best so far.
    const __m256 z = _mm256_loadu_ps(s.z + i);
    const __m256 needed = _mm256_sub_ps(_mm256_set1_ps(s.best), _mm256_sub_ps(z, m));
    int live = _mm256_movemask_ps(_mm256_and_ps(_mm256_cmp_ps(needed, noise_max, _CMP_LE_OQ),
                                                _mm256_cmp_ps(z, floor, _CMP_GE_OQ)));
    if (live == 0) continue;
    const __m256i bits = bits8(s.row_key, static_cast<uint32_t>(i));
    live &= _mm256_movemask_ps(_mm256_cmp_ps(needed, bound8(bits), _CMP_LE_OQ));
    alignas(32) uint32_t lane_bits[8];
    _mm256_store_si256(reinterpret_cast<__m256i*>(lane_bits), bits);
    s.consider_lanes(i, static_cast<uint32_t>(live), lane_bits);
  }
  draw_scalar(s, i, vocab);
}

}  // namespace

const DrawLoops& draw_loops_avx2() {
  static const DrawLoops loops = {scale, draw};
  return loops;
}

}  // namespace met::cpu::detail
