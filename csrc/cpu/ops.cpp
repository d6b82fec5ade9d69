// Per-token elementwise kernels of the CPU model (see ops.h).
#include "ops.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>

namespace met::cpu {
namespace {

#include "cpu/activations.inc"

}  // namespace

const Activations& activations_for(CpuPath path) {
#if defined(MET_HAS_X86_ACTIVATIONS)
  if (path == CpuPath::kAvx512 || path == CpuPath::kAmx) return activations_avx512();
  if (path == CpuPath::kAvx2) return activations_avx2();
#else
  (void)path;
#endif
  return kActivations;
}

void silu_mul_row(const float* gate, const float* up, float* out, int64_t n) {
  kActivations.silu_mul(gate, up, out, n);
}

void clamped_swiglu_row(const float* gate, const float* up, float* out, int64_t n, float limit,
                        float alpha) {
  kActivations.clamped_swiglu(gate, up, out, n, limit, alpha);
}

void gelu_tanh_mul_row(const float* gate, const float* up, float* out, int64_t n) {
  kActivations.gelu_tanh_mul(gate, up, out, n);
}

void softcap_row(float* x, float cap, int64_t n) { kActivations.softcap(x, cap, n); }

void rms_norm_row(const float* x, const float* weight, float* out, int64_t dim, float eps) {
  // Eight partial sums: the compiler vectorizes them and the order stays fixed per row.
  float partial[8] = {};
  int64_t i = 0;
  for (; i + 8 <= dim; i += 8) {
    for (int j = 0; j < 8; ++j) partial[j] += x[i + j] * x[i + j];
  }
  float sum = 0.0f;
  for (; i < dim; ++i) sum += x[i] * x[i];
  for (int j = 0; j < 8; ++j) sum += partial[j];
  const float inv = 1.0f / std::sqrt(sum / static_cast<float>(dim) + eps);
  for (int64_t j = 0; j < dim; ++j) out[j] = x[j] * inv * weight[j];
}

void rope_rotate_half(float* v, const float* cos, const float* sin, int64_t head_dim) {
  const int64_t half = head_dim / 2;
  float* lo = v;
  float* hi = v + half;
  for (int64_t i = 0; i < half; ++i) {
    const float a = lo[i];
    const float b = hi[i];
    lo[i] = a * cos[i] - b * sin[i];
    hi[i] = b * cos[i] + a * sin[i];
  }
}

}  // namespace met::cpu
