// The CPU model's attention sublayer (see llama_forward.h): the QKV projection, Q/K norms,
// RoPE, the K/V stores into the paged pool (a layer's own pages, or its source's for a shared-KV
// layer), paged attention and the output projection.
#include <cmath>
#include <cstdint>
#include <cstring>

#include "cpu/llama_forward.h"
#include "cpu/ops.h"
#include "cpu/quant_matmul_internal.h"

namespace met::cpu {

void LlamaForward::mixer_input(const LayerWeights& w, int64_t layer, int64_t n_tokens) {
  const detail::QuantActs acts = quant_acts();
  const LayerWeights* prev = layer > 0 ? &w_.layers[static_cast<size_t>(layer - 1)] : nullptr;
  const float* post_mlp = prev != nullptr ? pending_norm(*prev) : nullptr;
  const float* prev_scale = prev != nullptr ? prev->out_scale : nullptr;
#ifdef _OPENMP
#pragma omp for schedule(static) nowait
#endif
  for (int64_t t = 0; t < n_tokens; ++t) {
    // The previous layer's MLP output joins the residual stream here, fused with the norm.
    residual_norm_row(t, w.attn_norm, layer > 0, post_mlp, acts, prev_scale);
  }
  barrier_.wait();
}

void LlamaForward::attention_block(const LayerWeights& w, const ForwardBatch& batch, int64_t layer,
                                   int64_t n_tokens) {
  const LlamaDims& d = dims_;
  const detail::QuantActs acts = quant_acts();
  project(w.wqkv, w.wqkv_parts, acts, qkv_.data(), n_tokens);
  barrier_.wait();
  rope_and_store(w, layer, n_tokens);
  barrier_.wait();

  const int64_t hd = head_dim_of(w);
  AttnShape shape{d.n_heads,
                  kv_heads_of(w),
                  hd,
                  d.block_size,
                  d.attn_scale > 0.0f ? d.attn_scale : 1.0f / std::sqrt(static_cast<float>(hd)),
                  d.kv_half};
  shape.window = w.window;
  shape.softcap = d.attn_softcap;
  shape.sinks = w.sinks;
  detail::paged_attention_with(attend_, q_.data(), pages(w, false, layer), pages(w, true, layer),
                               attn_.data(), batch.rows, shape);
  barrier_.wait();

  const int64_t q_width = d.n_heads * hd;
  // A gated layer's gate rows follow Q's, K's and V's in its projection.
  const int64_t gate_at = q_width + 2 * kv_heads_of(w) * hd;
#ifdef _OPENMP
#pragma omp for schedule(static) nowait
#endif
  for (int64_t t = 0; t < n_tokens; ++t) {
    if (w.attn_gate) {
      float* out = attn_.data() + t * q_width;
      const float* gate = qkv_.data() + t * w.wqkv.n + gate_at;
      for (int64_t i = 0; i < q_width; ++i) out[i] = out[i] * sigmoid(gate[i]);
    }
    quantize_act_row(attn_.data(), q_width, t, acts, isa_);
  }
  barrier_.wait();
  matmul_acts_team(acts, w.wo.data, delta_.data(), n_tokens, d.dim, q_width, w.wo.q, isa_);
  barrier_.wait();
  if (w.bo != nullptr) {
#ifdef _OPENMP
#pragma omp for schedule(static) nowait
#endif
    for (int64_t t = 0; t < n_tokens; ++t) {
      float* row = delta_.data() + t * d.dim;
      for (int64_t i = 0; i < d.dim; ++i) row[i] += w.bo[i];
    }
    barrier_.wait();
  }
}

void LlamaForward::rope_and_store(const LayerWeights& w, int64_t layer, int64_t n_tokens) {
  const LlamaDims& d = dims_;
  const int64_t hd = head_dim_of(w);
  const int64_t n_kv = w.shared_kv ? 0 : kv_heads_of(w);  // the K heads this layer projects
  const int64_t kv_width = kv_heads_of(w) * hd;
  const int64_t q_width = d.n_heads * hd;
  const int64_t width = w.wqkv.n;
  void* k_pool = pages(w, false, layer);
  void* v_pool = pages(w, true, layer);
#ifdef _OPENMP
#pragma omp for schedule(static) nowait
#endif
  for (int64_t t = 0; t < n_tokens; ++t) {
    float* qkv = qkv_.data() + t * width;
    if (w.bqkv != nullptr) {
      for (int64_t i = 0; i < width; ++i) qkv[i] += w.bqkv[i];
    }
    // V as it came out of the projection: its own rows, or (K as V) K's before their norm.
    float* v = qkv + q_width + kv_width;
    if (w.k_as_v) {
      v = v_.data() + t * kv_width;
      std::memcpy(v, qkv + q_width, sizeof(float) * kv_width);
    }
    qk_norms(w, qkv, n_kv);
    if (!w.no_rope) {
      // A layer's own tables span its heads; the model's may rotate only the first rope_dims.
      const int64_t rotated = w.rope_cos != nullptr || d.rope_dims == 0 ? hd : d.rope_dims;
      const int64_t row = static_cast<int64_t>(positions_[t]) * (rotated / 2);
      const float* cos = (w.rope_cos != nullptr ? w.rope_cos : w_.rope_cos) + row;
      const float* sin = (w.rope_sin != nullptr ? w.rope_sin : w_.rope_sin) + row;
      for (int64_t h = 0; h < d.n_heads + n_kv; ++h) {
        rope_rotate_half(qkv + h * hd, cos, sin, rotated);
      }
    }
    float* q = q_.data() + t * q_width;
    std::memcpy(q, qkv, sizeof(float) * q_width);
    if (d.attn_temp_scale != 0.0) {
      // In double, then rounded once, as the torch forward computes the factor.
      const double steps = std::floor(static_cast<double>(positions_[t]) / d.attn_temp_length);
      const auto scale = static_cast<float>(1.0 + d.attn_temp_scale * std::log1p(steps));
      for (int64_t i = 0; i < q_width; ++i) q[i] *= scale;
    }
    if (w.shared_kv) continue;  // its source layer stored the K/V it reads
    if (w.v_norm != nullptr) {
      for (int64_t h = 0; h < n_kv; ++h)
        rms_norm_row(v + h * hd, w.v_norm, v + h * hd, hd, d.norm_eps);
    }
    const int64_t slot = slots_[t] * kv_width;
    store_kv(qkv + q_width, k_pool, slot, kv_width);
    store_kv(v, v_pool, slot, kv_width);
  }
}

void LlamaForward::qk_norms(const LayerWeights& w, float* qkv, int64_t n_kv) const {
  const LlamaDims& d = dims_;
  const int64_t hd = head_dim_of(w);
  const int64_t q_width = d.n_heads * hd;
  if (w.qk_norm_full) {
    if (w.q_norm != nullptr) rms_norm_row(qkv, w.q_norm, qkv, q_width, d.norm_eps);
    if (w.k_norm != nullptr && n_kv > 0) {
      rms_norm_row(qkv + q_width, w.k_norm, qkv + q_width, n_kv * hd, d.norm_eps);
    }
    return;
  }
  if (w.q_norm != nullptr) {
    for (int64_t h = 0; h < d.n_heads; ++h)
      rms_norm_row(qkv + h * hd, w.q_norm, qkv + h * hd, hd, d.norm_eps);
  }
  if (w.k_norm != nullptr) {
    for (int64_t h = 0; h < n_kv; ++h) {
      float* head = qkv + q_width + h * hd;
      rms_norm_row(head, w.k_norm, head, hd, d.norm_eps);
    }
  }
}

int64_t LlamaForward::head_dim_of(const LayerWeights& w) const {
  return w.head_dim > 0 ? w.head_dim : dims_.head_dim;
}

int64_t LlamaForward::kv_heads_of(const LayerWeights& w) const {
  return w.n_kv_heads > 0 ? w.n_kv_heads : dims_.n_kv_heads;
}

void* LlamaForward::pages(const LayerWeights& w, bool values, int64_t layer) const {
  if (w.k_pages != nullptr) return values ? w.v_pages : w.k_pages;
  const LlamaDims& d = dims_;
  return kv_at(values ? v_cache_ : k_cache_,
               layer * d.num_blocks * d.block_size * d.n_kv_heads * d.head_dim);
}

void* LlamaForward::kv_at(void* pool, int64_t offset) const {
  return dims_.kv_half ? static_cast<void*>(static_cast<uint16_t*>(pool) + offset)
                       : static_cast<void*>(static_cast<float*>(pool) + offset);
}

void LlamaForward::store_kv(const float* src, void* pool, int64_t offset, int64_t n) const {
  if (!dims_.kv_half) {
    std::memcpy(static_cast<float*>(pool) + offset, src, sizeof(float) * n);
    return;
  }
  uint16_t* dst = static_cast<uint16_t*>(pool) + offset;
  for (int64_t i = 0; i < n; ++i) dst[i] = fp32_to_fp16(src[i]);
}

}  // namespace met::cpu
