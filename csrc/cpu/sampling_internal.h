// Owns: the draw's state and its per-token step, shared by the scalar loops (sampling.cpp) and
//   their AVX2 and AVX-512 builds (sampling_avx2.cpp, sampling_avx512.cpp).
// Called by: sampling.cpp, sampling_avx2.cpp, sampling_avx512.cpp.
// Invariants: consider() is exact (the token's score against the best so far, ties to the
//   smaller index); a loop may skip a token only when noise_bound proves it cannot win, so every
//   loop that skips more or fewer tokens returns the same token.
#pragma once

#include <cmath>
#include <cstdint>
#include <limits>

#include "cpu/isa.h"
#include "kernels/sample_hash.h"

namespace met::cpu::detail {

constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr float kLn2 = 0.6931472f;  // rounded up: the bound stays above the noise

// An upper bound of the Gumbel noise -log(-log(u)) of u = uniform_of(bits), from the bits alone:
// the noise is at most -log(1 - u) = log(2^23 / (y + 1/2)) with y = 2^23 - 1 - bits, and the
// exponent of y + 1/2 (exact in a float) bounds its log2 from below. The 0.01 covers the
// rounding of the logarithms.
inline float noise_bound(uint32_t bits) {
  const float y = static_cast<float>((1u << kernels::kSampleBits) - 1u - bits) + 0.5f;
  return static_cast<float>(kernels::kSampleBits - std::ilogb(y)) * kLn2 + 0.01f;
}
// The largest bound, that of y = 0: no token trailing the best by more can win.
inline const float kNoiseMax = noise_bound((1u << kernels::kSampleBits) - 1u);

struct DrawState {
  const float* z;      // scaled logits, NaN as -inf, no -0
  float floor;         // truncation: tokens with a lower scaled logit are out
  float m;             // the largest scaled logit
  float min_p;         // <= 0: off
  uint64_t row_key;    // kernels::sample_row_key(seed, step)
  float best = -kInf;  // the best score so far
  int32_t best_i = std::numeric_limits<int32_t>::max();

  // Token i, its noise bits given: scored and kept when it beats the best so far.
  void consider(int32_t i, uint32_t bits) {
    const float zi = z[i];
    if (zi == -kInf || zi < floor) return;
    if (zi < m && min_p > 0.0f && std::exp(zi - m) < min_p) return;
    const float score = (zi - m) - std::log(-std::log(kernels::uniform_of(bits)));
    if (score > best || (score == best && i < best_i)) best = score, best_i = i;
  }
  // The SIMD loops' lanes: token first + l for each set bit l of `live`, its bits in bits[l].
  void consider_lanes(int32_t first, uint32_t live, const uint32_t* bits) {
    for (; live != 0; live &= live - 1) {
      const int lane = __builtin_ctz(live);
      consider(first + lane, bits[lane]);
    }
  }
};

// The scalar loop over tokens [begin, end) (the SIMD loops finish their rows with it).
void draw_scalar(DrawState& s, int32_t begin, int32_t end);
// z[i] = logits[i] * inv_t with NaN as -inf and -0 as +0 (so that equal scaled logits tie at
// the truncation thresholds, signed zeros included); returns the largest (-inf for none).
float scale_scalar(const float* logits, float* z, int32_t vocab, float inv_t);

// A path's build of the vocabulary loops; every build returns the same token.
struct DrawLoops {
  float (*scale)(const float* logits, float* z, int32_t vocab, float inv_t);  // scale_scalar's
  void (*draw)(DrawState& s, int32_t vocab);  // draw_scalar's over the whole row
};
// The widest build `path` runs (avx512 and amx: 512-bit registers).
const DrawLoops& draw_loops_for(CpuPath path);
const DrawLoops& draw_loops_avx2();
const DrawLoops& draw_loops_avx512();

}  // namespace met::cpu::detail
