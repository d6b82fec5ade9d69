// Owns: the CPU model's per-token elementwise kernels on fp32 rows: RMSNorm, rotate-half RoPE,
//   and the gated activations, logit soft-cap and sampler's exponential, these built at each
//   register width (Activations, activations.inc).
// Called by: llama_forward.cpp and its layer files (inside its OpenMP team, one token per call,
//   so they never thread themselves), sampling.cpp (exp_shifted), csrc/bindings/cpu_model.cpp
//   and tests/cpp/test_cpu_model.cc.
// Invariants: every result depends only on its own row (fixed summation order per row), so a
//   token's activations are bitwise the same whatever batch it runs in, and on every path.
#pragma once

#include <cmath>
#include <cstdint>

#include "cpu/isa.h"

namespace met::cpu {

// out = x / sqrt(mean(x^2) + eps) * weight. out may alias x.
void rms_norm_row(const float* x, const float* weight, float* out, int64_t dim, float eps);

// Rotates one head vector in place: pair i is (v[i], v[i + head_dim / 2]) turned by the angle
// whose cos / sin are cos[i] / sin[i] (one position's row of the RoPE tables).
void rope_rotate_half(float* v, const float* cos, const float* sin, int64_t head_dim);

// out[i] = silu(gate[i]) * up[i], silu(g) = g / (1 + e^-g). out may alias gate or up.
void silu_mul_row(const float* gate, const float* up, float* out, int64_t n);

// gpt-oss's clamped SwiGLU: g = min(gate[i], limit), u = clamp(up[i], -limit, limit),
// out[i] = g * sigmoid(alpha * g) * (u + 1). out may alias gate.
void clamped_swiglu_row(const float* gate, const float* up, float* out, int64_t n, float limit,
                        float alpha);

// out[i] = gelu(gate[i]) * up[i] with GeLU's tanh approximation (Gemma's MLP, PyTorch's
// approximate="tanh"). out may alias gate.
void gelu_tanh_mul_row(const float* gate, const float* up, float* out, int64_t n);

inline float sigmoid(float x) { return 1.0f / (1.0f + std::exp(-x)); }

// torch's softplus (beta 1, threshold 20): x itself above 20, else log(1 + e^x).
inline float softplus(float x) { return x > 20.0f ? x : std::log1p(std::exp(x)); }

// x[i] = cap * tanh(x[i] / cap) in place (Gemma's logit soft-capping).
void softcap_row(float* x, float cap, int64_t n);

// The functions above from silu_mul_row on, built for one register width (activations.inc). The
// free functions are the scalar build; every build gives the same bits.
struct Activations {
  void (*silu_mul)(const float* gate, const float* up, float* out, int64_t n);
  void (*silu)(float* x, int64_t n);  // x[i] = silu(x[i]) in place, silu_mul_row's rounding
  void (*clamped_swiglu)(const float* gate, const float* up, float* out, int64_t n, float limit,
                         float alpha);
  void (*gelu_tanh_mul)(const float* gate, const float* up, float* out, int64_t n);
  void (*softcap)(float* x, float cap, int64_t n);
  // out[i] = e^(x[i] - shift), e^x rounded once from double (the sampler's probabilities).
  void (*exp_shifted)(const float* x, float shift, float* out, int64_t n);
};
// The widest build `path` runs (avx512 and amx: 512-bit registers).
const Activations& activations_for(CpuPath path);
const Activations& activations_avx2();
const Activations& activations_avx512();

}  // namespace met::cpu
