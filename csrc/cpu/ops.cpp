// Per-token elementwise kernels of the CPU model (see ops.h).
#include "ops.h"

#include <algorithm>
#include <cmath>

namespace met::cpu {

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

void silu_mul_row(const float* gate, const float* up, float* out, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    const float g = gate[i];
    out[i] = g / (1.0f + std::exp(-g)) * up[i];
  }
}

void clamped_swiglu_row(const float* gate, const float* up, float* out, int64_t n, float limit,
                        float alpha) {
  for (int64_t i = 0; i < n; ++i) {
    const float g = std::min(gate[i], limit);
    const float u = std::min(std::max(up[i], -limit), limit);
    out[i] = g * (1.0f / (1.0f + std::exp(-(g * alpha)))) * (u + 1.0f);
  }
}

void gelu_tanh_mul_row(const float* gate, const float* up, float* out, int64_t n) {
  const float k = 0.7978845608028654f;  // sqrt(2 / pi)
  for (int64_t i = 0; i < n; ++i) {
    const float g = gate[i];
    out[i] = 0.5f * g * (1.0f + std::tanh(k * (g + 0.044715f * g * g * g))) * up[i];
  }
}

void softcap_row(float* x, float cap, int64_t n) {
  for (int64_t i = 0; i < n; ++i) x[i] = cap * std::tanh(x[i] / cap);
}

}  // namespace met::cpu
