// The draw's vocabulary loops in 512-bit registers (sampling_internal.h), AVX-512F only: 16
// tokens' scaled logits and noise bits at a time, the 64-bit hash multiplied in 32-bit halves.
// A token goes to the exact scalar step (DrawState::consider) only when the bound of its noise
// says it could win, the test the scalar loop makes, so both loops return the same token.
#include <immintrin.h>

#include <cstdint>

#include "cpu/sampling_internal.h"

#if defined(__GNUC__) && !defined(__clang__)
// GCC 12 reports its own _mm512_undefined_* placeholders inside the AVX-512 intrinsics.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#endif

namespace met::cpu::detail {
namespace {

// a * c mod 2^64 per lane from 32-bit products: lo*lo + ((hi*lo + lo*hi) << 32).
__m512i mul64(__m512i a, uint64_t c) {
  const __m512i c_lo = _mm512_set1_epi64(static_cast<int64_t>(c & 0xFFFFFFFFull));
  const __m512i c_hi = _mm512_set1_epi64(static_cast<int64_t>(c >> 32));
  const __m512i lo = _mm512_mul_epu32(a, c_lo);
  const __m512i cross =
      _mm512_add_epi64(_mm512_mul_epu32(_mm512_srli_epi64(a, 32), c_lo), _mm512_mul_epu32(a, c_hi));
  return _mm512_add_epi64(lo, _mm512_slli_epi64(cross, 32));
}

// kernels::mix64 on 8 lanes.
__m512i mix64(__m512i x) {
  x = _mm512_xor_si512(x, _mm512_srli_epi64(x, 30));
  x = mul64(x, 0xBF58476D1CE4E5B9ull);
  x = _mm512_xor_si512(x, _mm512_srli_epi64(x, 27));
  x = mul64(x, 0x94D049BB133111EBull);
  return _mm512_xor_si512(x, _mm512_srli_epi64(x, 31));
}

// kernels::sample_bits of tokens first .. first + 7.
__m256i bits8(uint64_t row_key, uint32_t first) {
  const __m512i token =
      _mm512_add_epi64(_mm512_set1_epi64(first), _mm512_setr_epi64(0, 1, 2, 3, 4, 5, 6, 7));
  const __m512i salted =
      _mm512_add_epi64(mul64(token, 0xD1B54A32D192ED03ull), _mm512_set1_epi64(1));
  const __m512i x =
      mix64(_mm512_xor_si512(_mm512_set1_epi64(static_cast<int64_t>(row_key)), salted));
  return _mm512_cvtepi64_epi32(_mm512_srli_epi64(x, 64 - kernels::kSampleBits));
}

// noise_bound on 16 lanes, in noise_bound's operations and order.
__m512 bound16(__m512i bits) {
  const __m512i top = _mm512_set1_epi32(static_cast<int32_t>((1u << kernels::kSampleBits) - 1u));
  const __m512 y =
      _mm512_add_ps(_mm512_cvtepi32_ps(_mm512_sub_epi32(top, bits)), _mm512_set1_ps(0.5f));
  const __m512 whole = _mm512_sub_ps(_mm512_set1_ps(kernels::kSampleBits), _mm512_getexp_ps(y));
  return _mm512_add_ps(_mm512_mul_ps(whole, _mm512_set1_ps(kLn2)), _mm512_set1_ps(0.01f));
}

float scale(const float* logits, float* z, int32_t vocab, float inv_t) {
  const __m512 scale = _mm512_set1_ps(inv_t), minus_inf = _mm512_set1_ps(-kInf);
  __m512 best = minus_inf;
  int32_t i = 0;
  for (; i + 16 <= vocab; i += 16) {
    __m512 v =
        _mm512_add_ps(_mm512_mul_ps(_mm512_loadu_ps(logits + i), scale), _mm512_setzero_ps());
    v = _mm512_mask_blend_ps(_mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q), v, minus_inf);
    _mm512_storeu_ps(z + i, v);
    best = _mm512_max_ps(best, v);
  }
  const float head = _mm512_reduce_max_ps(best);
  const float tail = scale_scalar(logits + i, z + i, vocab - i, inv_t);
  return head > tail ? head : tail;
}

void draw(DrawState& s, int32_t vocab) {
  const __m512 m = _mm512_set1_ps(s.m), noise_max = _mm512_set1_ps(kNoiseMax);
  const __m512 floor = _mm512_set1_ps(s.floor);
  int32_t i = 0;
  for (; i + 16 <= vocab; i += 16) {
    // needed = best - (z - m): the noise each token needs to beat the best so far.
    const __m512 z = _mm512_loadu_ps(s.z + i);
    const __m512 needed = _mm512_sub_ps(_mm512_set1_ps(s.best), _mm512_sub_ps(z, m));
    __mmask16 live = _mm512_cmp_ps_mask(needed, noise_max, _CMP_LE_OQ) &
                     _mm512_cmp_ps_mask(z, floor, _CMP_GE_OQ);
    if (live == 0) continue;
    const __m512i bits =
        _mm512_inserti64x4(_mm512_castsi256_si512(bits8(s.row_key, static_cast<uint32_t>(i))),
                           bits8(s.row_key, static_cast<uint32_t>(i + 8)), 1);
    live &= _mm512_cmp_ps_mask(needed, bound16(bits), _CMP_LE_OQ);
    alignas(64) uint32_t lane_bits[16];
    _mm512_store_si512(lane_bits, bits);
    s.consider_lanes(i, live, lane_bits);
  }
  draw_scalar(s, i, vocab);
}

}  // namespace

const DrawLoops& draw_loops_avx512() {
  static const DrawLoops loops = {scale, draw};
  return loops;
}

}  // namespace met::cpu::detail
