// Owns: the counter-based noise of the sampling kernel, shared by the CUDA kernel and its CPU
// reference so both draw the same token.
// Called by: sampling.cu, reference/sampling_ref.cpp.
// Invariants: a pure function of (seed, step, token); no state, so a request replays the same
// draws whatever else shares its batch. Returns u in (0, 1), never 0 or 1.
#pragma once

#include <cstdint>

#ifdef __CUDACC__
#define MET_HOST_DEVICE __host__ __device__
#else
#define MET_HOST_DEVICE
#endif

namespace met::kernels {

MET_HOST_DEVICE inline uint64_t mix64(uint64_t x) {
  // splitmix64's finaliser: every input bit flips each output bit with probability ~1/2.
  x ^= x >> 30;
  x *= 0xBF58476D1CE4E5B9ull;
  x ^= x >> 27;
  x *= 0x94D049BB133111EBull;
  x ^= x >> 31;
  return x;
}

MET_HOST_DEVICE inline float sample_uniform(uint64_t seed, uint64_t step, uint32_t token) {
  uint64_t x = mix64(seed * 0x9E3779B97F4A7C15ull + step);
  x = mix64(x ^ (static_cast<uint64_t>(token) * 0xD1B54A32D192ED03ull + 1));
  // 24 random bits centred in their bucket: exactly representable, strictly inside (0, 1).
  return (static_cast<float>(x >> 40) + 0.5f) * (1.0f / 16777216.0f);
}

// The orderable image of a float: a < b as floats iff key(a) < key(b) as unsigned (no NaN).
MET_HOST_DEVICE inline uint32_t float_key(uint32_t bits) {
  return (bits & 0x80000000u) ? ~bits : (bits | 0x80000000u);
}

MET_HOST_DEVICE inline uint32_t key_to_bits(uint32_t key) {
  return (key & 0x80000000u) ? (key & 0x7FFFFFFFu) : ~key;
}

}  // namespace met::kernels
