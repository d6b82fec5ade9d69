// Owns: the counter-based noise of met's draw, shared by the CUDA kernel, its CPU reference and
// the host draw (cpu/sampling.h) so all draw the same token.
// Called by: sampling.cu, reference/kernel_refs.cpp, csrc/cpu/sampling.cpp.
// Invariants: a pure function of (seed, step, token); no state, so a request replays the same
// draws whatever else shares its batch. Returns u in (0, 1), never 0 or 1, so the Gumbel noise
// -log(-log(u)) is finite: at most 16.7 (u = 1 - 2^-24), at least -2.9.
#pragma once

#include <cstdint>

#ifdef __CUDACC__
#define MET_HOST_DEVICE __host__ __device__
#else
#define MET_HOST_DEVICE
#endif

namespace met::kernels {

constexpr int kSampleBits = 23;  // bits + 1/2 is exact in a float below 2^23: u stays below 1

MET_HOST_DEVICE inline uint64_t mix64(uint64_t x) {
  // splitmix64's finaliser: every input bit flips each output bit with probability ~1/2.
  x ^= x >> 30;
  x *= 0xBF58476D1CE4E5B9ull;
  x ^= x >> 27;
  x *= 0x94D049BB133111EBull;
  x ^= x >> 31;
  return x;
}

// What a row's draws share: the noise of one (seed, step), computed once per row.
MET_HOST_DEVICE inline uint64_t sample_row_key(uint64_t seed, uint64_t step) {
  return mix64(seed * 0x9E3779B97F4A7C15ull + step);
}

// kSampleBits random bits for `token` in the row keyed `row_key`.
MET_HOST_DEVICE inline uint32_t sample_bits(uint64_t row_key, uint32_t token) {
  const uint64_t x = mix64(row_key ^ (static_cast<uint64_t>(token) * 0xD1B54A32D192ED03ull + 1));
  return static_cast<uint32_t>(x >> (64 - kSampleBits));
}

// The bits centred in their bucket: exactly representable, strictly inside (0, 1).
MET_HOST_DEVICE inline float uniform_of(uint32_t bits) {
  return (static_cast<float>(bits) + 0.5f) * (1.0f / static_cast<float>(1u << kSampleBits));
}

MET_HOST_DEVICE inline float sample_uniform(uint64_t seed, uint64_t step, uint32_t token) {
  return uniform_of(sample_bits(sample_row_key(seed, step), token));
}

// The orderable image of a float: a < b as floats iff key(a) < key(b) as unsigned (no NaN).
MET_HOST_DEVICE inline uint32_t float_key(uint32_t bits) {
  return (bits & 0x80000000u) ? ~bits : (bits | 0x80000000u);
}

MET_HOST_DEVICE inline uint32_t key_to_bits(uint32_t key) {
  return (key & 0x80000000u) ? (key & 0x7FFFFFFFu) : ~key;
}

}  // namespace met::kernels
