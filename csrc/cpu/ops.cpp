// Per-token elementwise kernels of the CPU model (see ops.h).
#include "ops.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>

namespace met::cpu {
namespace {

// e^x without a libm call, so the loops below vectorize (ops.cpp is built with
// -fno-trapping-math for that: the clamp's compares become selects). x = n ln2 + r with |r| <=
// ln2 / 2; e^r by a degree-7 polynomial (Cephes' expf coefficients), 2^n put into the exponent
// bits. Within 1.4 ulp of e^x on [-87, 88]; x outside is clamped there (e^-87 ~ 1.6e-38,
// e^88 ~ 1.7e38, so 1 / (1 + e^x) still reaches 1 and 0).
inline float exp_poly(float x) {
  x = std::min(std::max(x, -87.0f), 88.0f);
  const float shifter = 12582912.0f;  // 1.5 * 2^23: adding it rounds to the nearest integer
  const float t = x * 1.44269504088896341f + shifter;
  const float n = t - shifter;
  const float r = (x - n * 0.693359375f) - n * -2.12194440e-4f;  // ln2 in two parts
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  int32_t bits;
  std::memcpy(&bits, &t, sizeof bits);
  bits = (bits - 0x4B400000 + 127) << 23;  // t's low mantissa bits hold n
  float scale;
  std::memcpy(&scale, &bits, sizeof scale);
  return p * scale;
}

}  // namespace

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
  // 0.5 * (1 + tanh(u)) = 1 / (1 + e^(-2u)): one exponential, and no cancellation where tanh
  // nears -1.
  for (int64_t i = 0; i < n; ++i) {
    const float g = gate[i];
    const float u = k * (g + 0.044715f * g * g * g);
    out[i] = g / (1.0f + exp_poly(-2.0f * u)) * up[i];
  }
}

void softcap_row(float* x, float cap, int64_t n) {
  // tanh(y) = sign(y) (1 - 2 / (e^(2|y|) + 1)): the subtraction from 1 loses nothing where tanh
  // nears +-1, and near 0 it stays within ~1e-7 of tanh absolutely, which is what a logit scaled
  // by cap needs. A 262k vocabulary's row took ~2.6 ms through libm's tanhf.
  const float inv = 1.0f / cap;
  for (int64_t i = 0; i < n; ++i) {
    const float y = x[i] * inv;
    const float t = 1.0f - 2.0f / (exp_poly(2.0f * std::fabs(y)) + 1.0f);
    x[i] = cap * std::copysign(t, y);
  }
}

}  // namespace met::cpu
