// CPU references of csrc/kernels (see kernel_refs.h): the direct loops, float32 arithmetic,
// rounding where the kernels store. Speed is irrelevant; clarity is the point.
#include "kernel_refs.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>

#include "../sample_hash.h"

namespace met::kernels::ref {

namespace {

float round_bf16(float x) {
  if (std::isnan(x)) return x;
  uint32_t bits;
  std::memcpy(&bits, &x, 4);
  bits = (bits + 0x7FFFu + ((bits >> 16) & 1u)) & 0xFFFF0000u;
  std::memcpy(&x, &bits, 4);
  return x;
}

float round_fp16(float x) {
  if (!std::isfinite(x)) return x;
  const float a = std::fabs(x);
  if (a >= 65520.0f) return std::copysign(std::numeric_limits<float>::infinity(), x);
  int e = 0;
  std::frexp(a, &e);     // a = f * 2^e, f in [0.5, 1): 11 significant bits leave 2^(e-11) steps
  e = std::max(e, -13);  // below 2^-14 the step stays 2^-24 (subnormals)
  const float step = std::ldexp(1.0f, e - 11);
  return std::copysign(std::nearbyint(a / step) * step, x);
}

}  // namespace

float round_to(float x, DType dtype) {
  switch (dtype) {
    case DType::kF16:
      return round_fp16(x);
    case DType::kBF16:
      return round_bf16(x);
    case DType::kF32:
      break;
  }
  return x;
}

std::vector<float> paged_attention(const Attention& a) {
  const int dim = a.kv.head_dim, groups = a.n_heads / a.kv.n_kv_heads;
  const int64_t q_stride = a.q_row_stride ? a.q_row_stride : int64_t{a.n_heads} * dim;
  std::vector<float> out(static_cast<size_t>(a.cu_seqlens[a.batch]) * a.n_heads * dim, 0.0f);
  for (int b = 0; b < a.batch; ++b) {
    const int q_begin = a.cu_seqlens[b], q_len = a.cu_seqlens[b + 1] - q_begin;
    const int ctx = a.seq_lens[b];
    for (int i = 0; i < q_len; ++i) {
      const int visible = ctx - q_len + i + 1;
      for (int h = 0; h < a.n_heads; ++h) {
        const float* q = a.q + (q_begin + i) * q_stride + int64_t{h} * dim;
        std::vector<float> scores(std::max(visible, 0));
        std::vector<int64_t> rows(scores.size());
        for (int pos = 0; pos < visible; ++pos) {
          const int64_t block = a.block_tables[int64_t{b} * a.max_blocks + pos / a.kv.block_size];
          const int64_t slot = block * a.kv.block_size + pos % a.kv.block_size;
          rows[pos] = (slot * a.kv.n_kv_heads + h / groups) * dim;
          float s = 0.0f;
          for (int d = 0; d < dim; ++d) s += q[d] * a.k_cache[rows[pos] + d];
          scores[pos] = s * a.scale;
        }
        if (scores.empty()) continue;  // no visible key: zeros, as the kernel writes
        const float top = *std::max_element(scores.begin(), scores.end());
        float total = 0.0f;
        for (float& s : scores) total += (s = std::exp(s - top));
        float* dst = out.data() + (int64_t{q_begin + i} * a.n_heads + h) * dim;
        for (int d = 0; d < dim; ++d) {
          float acc = 0.0f;
          for (size_t pos = 0; pos < scores.size(); ++pos) {
            acc += scores[pos] * a.v_cache[rows[pos] + d];
          }
          dst[d] = round_to(acc / total, a.dtype);
        }
      }
    }
  }
  return out;
}

void kv_append(float* k_cache, float* v_cache, const float* k, const float* v,
               const int64_t* slot_mapping, int32_t n_tokens, int64_t src_row_stride,
               const KvLayout& kv) {
  const int64_t row = int64_t{kv.n_kv_heads} * kv.head_dim;
  for (int t = 0; t < n_tokens; ++t) {
    if (slot_mapping[t] < 0) continue;
    std::copy_n(k + t * src_row_stride, row, k_cache + slot_mapping[t] * row);
    std::copy_n(v + t * src_row_stride, row, v_cache + slot_mapping[t] * row);
  }
}

void rms_norm(float* out, const float* x, const float* weight, int32_t n_tokens, int32_t hidden,
              float eps, DType dtype) {
  for (int t = 0; t < n_tokens; ++t) {
    const float* row = x + int64_t{t} * hidden;
    float sq = 0.0f;
    for (int i = 0; i < hidden; ++i) sq += row[i] * row[i];
    const float inv = 1.0f / std::sqrt(sq / hidden + eps);
    for (int i = 0; i < hidden; ++i) {
      out[int64_t{t} * hidden + i] = round_to(row[i] * inv * weight[i], dtype);
    }
  }
}

void rope(float* x, const int64_t* positions, const float* cos, const float* sin, int32_t n_tokens,
          int32_t n_heads, int32_t head_dim, int64_t row_stride, DType dtype) {
  const int half = head_dim / 2;
  for (int t = 0; t < n_tokens; ++t) {
    for (int h = 0; h < n_heads; ++h) {
      float* head = x + t * row_stride + int64_t{h} * head_dim;
      for (int i = 0; i < half; ++i) {
        const float c = cos[positions[t] * half + i], s = sin[positions[t] * half + i];
        const float x1 = head[i], x2 = head[i + half];
        head[i] = round_to(x1 * c - x2 * s, dtype);
        head[i + half] = round_to(x2 * c + x1 * s, dtype);
      }
    }
  }
}

void silu_mul(float* out, const float* x, int32_t n_tokens, int32_t ffn, DType dtype) {
  for (int t = 0; t < n_tokens; ++t) {
    const float* row = x + int64_t{t} * 2 * ffn;
    for (int i = 0; i < ffn; ++i) {
      const float act = round_to(row[i] / (1.0f + std::exp(-row[i])), dtype);
      out[int64_t{t} * ffn + i] = round_to(act * row[ffn + i], dtype);
    }
  }
}

int32_t argmax(const float* logits, int32_t vocab) {
  int32_t best = 0;
  for (int32_t i = 0; i < vocab; ++i) {
    if (std::isnan(logits[best])) break;
    if (std::isnan(logits[i]) || logits[i] > logits[best]) best = i;
  }
  return best;
}

int32_t sample(const float* logits, int32_t vocab, const SampleParams& p) {
  if (p.temperature <= 0.0f || p.top_k == 1) return argmax(logits, vocab);
  std::vector<float> z(vocab);
  for (int i = 0; i < vocab; ++i) {
    z[i] = logits[i] * (1.0f / p.temperature);
    if (std::isnan(z[i])) z[i] = -std::numeric_limits<float>::infinity();
  }
  const float top = *std::max_element(z.begin(), z.end());
  if (top == -std::numeric_limits<float>::infinity()) return 0;
  std::vector<int32_t> order(vocab);
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return z[a] > z[b]; });
  // Cut after the first `keep` tokens of the order, widened so equal values stay together.
  size_t keep = (p.top_k > 0 && p.top_k < vocab) ? static_cast<size_t>(p.top_k) : order.size();
  while (keep < order.size() && z[order[keep]] == z[order[keep - 1]]) ++keep;
  if (p.top_p < 1.0f) {
    float kept_mass = 0.0f;
    for (size_t j = 0; j < keep; ++j) kept_mass += std::exp(z[order[j]] - top);
    // A token stays while the mass of strictly larger values is below top_p of the kept mass.
    float ahead = 0.0f;
    size_t j = 0;
    while (j < keep && ahead < p.top_p * kept_mass) {
      size_t tie_end = j;
      float tie_mass = 0.0f;
      for (; tie_end < keep && z[order[tie_end]] == z[order[j]]; ++tie_end) {
        tie_mass += std::exp(z[order[tie_end]] - top);
      }
      ahead += tie_mass;
      j = tie_end;
    }
    keep = j;
  }
  // The best token always survives truncation (top_p or min_p at their limits keep just it).
  if (keep == 0) {
    for (keep = 1; keep < order.size() && z[order[keep]] == z[order[0]];) ++keep;
  }
  int32_t best = -1;
  float best_score = -std::numeric_limits<float>::infinity();
  for (size_t j = 0; j < keep; ++j) {
    const int32_t i = order[j];
    if (z[i] == -std::numeric_limits<float>::infinity()) continue;
    if (z[i] < top && p.min_p > 0.0f && std::exp(z[i] - top) < p.min_p) continue;
    const float u = sample_uniform(p.seed, p.step, static_cast<uint32_t>(i));
    const float score = (z[i] - top) - std::log(-std::log(u));
    if (best < 0 || score > best_score || (score == best_score && i < best)) {
      best = i;
      best_score = score;
    }
  }
  return best;
}

}  // namespace met::kernels::ref
