// The CPU model's layer loop (see llama_forward.h); its attention sublayer is llama_attention.cpp.
#include "llama_forward.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <stdexcept>
#include <string>
#include <utility>

#include "cpu/delta_rule.h"
#include "cpu/ops.h"
#include "cpu/quant_matmul_internal.h"

#ifdef _OPENMP
#include <omp.h>
#endif

namespace met::cpu {

namespace {

void require(bool ok, const std::string& what) {
  if (!ok) throw std::invalid_argument("LlamaForward: " + what);
}

// A weight given as parts: theirs rows add up to the whole's, each as wide and in blocks.
void check_parts(const QuantWeight& whole, const std::vector<QuantWeight>& parts,
                 const char* name) {
  if (parts.empty()) return;
  int64_t rows = 0;
  for (const QuantWeight& p : parts) {
    require(p.data != nullptr && p.k == whole.k && p.k % block_elements(p.q) == 0,
            std::string(name) + ": each part [rows, " + std::to_string(whole.k) + "] in blocks");
    rows += p.n;
  }
  require(rows == whole.n, std::string(name) + ": the parts' rows must add up to the whole's");
}

}  // namespace

void detail::table_row(const QuantWeight& blocks, const float* dense, int64_t id, int64_t width,
                       float* out) {
  if (blocks.data == nullptr) {
    std::memcpy(out, dense + id * width, sizeof(float) * width);
    return;
  }
  dequantize_row(blocks.q, blocks.data + id * row_bytes(blocks.q, width), out, width);
}

void detail::check_weight(const QuantWeight& w, int64_t n, int64_t k, const char* name) {
  require(w.data != nullptr && w.n == n && w.k == k && k % block_elements(w.q) == 0,
          std::string(name) + " must be [" + std::to_string(n) + ", " + std::to_string(k) +
              "] in GGUF blocks, got [" + std::to_string(w.n) + ", " + std::to_string(w.k) + "]");
}

LlamaForward::LlamaForward(const LlamaDims& dims, LlamaWeights weights, void* k_cache,
                           void* v_cache, int n_threads)
    : dims_(dims), w_(std::move(weights)), k_cache_(k_cache), v_cache_(v_cache) {
  const LlamaDims& d = dims_;
  require(d.dim > 0 && d.n_layers > 0 && d.head_dim > 0 && d.head_dim % 2 == 0 && d.ffn > 0 &&
              d.vocab > 0 && d.n_kv_heads > 0 && d.n_heads % d.n_kv_heads == 0,
          "model dimensions must be positive, head_dim even and heads a multiple of kv heads");
  require(d.max_positions > 0 && d.num_blocks > 0 && d.block_size > 0, "empty RoPE table or pool");
  require(static_cast<int64_t>(w_.layers.size()) == d.n_layers, "one LayerWeights per layer");
  require(w_.embed.data != nullptr || w_.embed_dense != nullptr, "no embedding");
  require(d.per_layer_dim >= 0 && d.per_layer_dim % kBlock == 0,
          "per_layer_dim must be a multiple of 32 (the matmuls' blocks)");
  if (w_.embed.data != nullptr) detail::check_weight(w_.embed, d.vocab, d.dim, "embed");
  detail::check_weight(w_.lm_head, d.vocab, d.dim, "lm_head");
  require(w_.norm && w_.rope_cos && w_.rope_sin && k_cache && v_cache, "null pointer");
  qkv_width_ = 0;
  max_q_width_ = 0;
  max_kv_width_ = 0;
  require(d.n_experts == 0 || (d.n_experts_used > 0 && d.n_experts_used <= d.n_experts),
          "experts used per token must be 1..n_experts");
  require(d.attn_temp_scale == 0.0 || d.attn_temp_length > 0,
          "query temperature needs a positive length");
  require(d.expert_ffn >= 0, "expert_ffn must be >= 0");
  max_k_ = std::max({d.dim, d.ffn, expert_ffn(), d.shared_ffn});
  int64_t n_recurrent = 0;
  for (const LayerWeights& l : w_.layers) {
    require((l.attn_norm != nullptr) == (l.mlp_norm != nullptr), "one pre-norm weight is null");
    require(l.attn_norm != nullptr || (l.post_attn_norm && l.post_mlp_norm),
            "a layer without pre-norms needs post norms");
    check_parts(l.wqkv, l.wqkv_parts, "wqkv");
    check_parts(l.w_gate_up, l.w_gate_up_parts, "w_gate_up");
    if (l.mlp != Mlp::kDense) check_experts(l);
    if (l.mlp != Mlp::kMoe) {
      detail::check_weight(l.w_gate_up, 2 * d.ffn, d.dim, "w_gate_up");
      detail::check_weight(l.w_down, d.dim, d.ffn, "w_down");
    }
    check_per_layer(l);
    if (l.mixer == Mixer::kRecurrent) {
      require(l.state_index == n_recurrent++, "recurrent layers index the state in layer order");
      check_recurrent(l);
      has_recurrent_ = true;
      max_k_ = std::max(max_k_, d.recurrent.value_width());
      continue;
    }
    require(l.window >= 0, "a layer's window must be >= 0");
    const int64_t hd = head_dim_of(l);
    const int64_t n_kv = kv_heads_of(l);
    require(hd > 0 && hd % 2 == 0 && n_kv > 0 && d.n_heads % n_kv == 0,
            "a layer's head_dim must be even and its heads a multiple of its kv heads");
    require(hd == d.head_dim || l.no_rope || (l.rope_cos && l.rope_sin),
            "a layer of its own head width needs its own RoPE tables");
    require(!l.shared_kv || (l.k_pages && l.v_pages), "a shared-KV layer needs its source's pages");
    require((l.k_pages == nullptr) == (l.v_pages == nullptr), "one of a layer's pages is null");
    require(!l.shared_kv || l.bqkv == nullptr, "a shared-KV layer has no K/V biases");
    require(!l.attn_gate || !l.shared_kv, "a gated attention layer projects its own K/V");
    require(d.rope_dims % 2 == 0 && d.rope_dims <= d.head_dim, "rope_dims: even, <= head_dim");
    const int64_t q_width = d.n_heads * hd;
    const int64_t kv_rows = l.shared_kv ? 0 : (l.k_as_v ? 1 : 2) * n_kv * hd;
    const int64_t rows = q_width + kv_rows + (l.attn_gate ? q_width : 0);
    detail::check_weight(l.wqkv, rows, d.dim, "wqkv");
    detail::check_weight(l.wo, d.dim, q_width, "wo");
    qkv_width_ = std::max(qkv_width_, rows);
    max_q_width_ = std::max(max_q_width_, q_width);
    max_kv_width_ = std::max(max_kv_width_, n_kv * hd);
  }
  max_k_ = std::max({max_k_, max_q_width_, d.per_layer_dim});
#ifdef _OPENMP
  n_threads_ = n_threads > 0 ? n_threads : omp_get_max_threads();
#else
  (void)n_threads;
  n_threads_ = 1;
#endif
  path_ = active_path();
  isa_ = isa_for(path_);
  attend_ = detail::attention_item_for(path_);
  activations_ = activations_for(path_);
  n_recurrent_ = n_recurrent;
  if (has_recurrent_) {
    ssm_scratch_stride_ = delta_chunk_scratch(kDeltaChunk, d.recurrent.v_dim);
    ssm_scratch_.resize(static_cast<size_t>(n_threads_ * ssm_scratch_stride_));
  }
}

void LlamaForward::plan(const ForwardBatch& batch) {
  const AttnRows& rows = batch.rows;
  const int64_t n_tokens = rows.cu_seqlens[rows.n_rows];
  positions_.resize(static_cast<size_t>(n_tokens));
  slots_.resize(static_cast<size_t>(n_tokens));
  const int64_t bs = dims_.block_size;
  for (int64_t b = 0; b < rows.n_rows; ++b) {
    const int64_t begin = rows.cu_seqlens[b];
    const int64_t q_len = rows.cu_seqlens[b + 1] - begin;
    const int64_t ctx = rows.seq_lens[b];
    require(q_len >= 1 && ctx >= q_len, "each row needs 1..seq_len query tokens");
    require(ctx <= dims_.max_positions, "position " + std::to_string(ctx - 1) +
                                            " is past the RoPE table (" +
                                            std::to_string(dims_.max_positions) + ")");
    require(ctx <= rows.table_stride * bs, "a row's context is longer than its block table");
    for (int64_t blk = 0; blk < (ctx + bs - 1) / bs; ++blk) {
      const int32_t id = rows.block_tables[b * rows.table_stride + blk];
      require(id >= 0 && id < dims_.num_blocks, "block id " + std::to_string(id) +
                                                    " outside the pool of " +
                                                    std::to_string(dims_.num_blocks));
    }
    for (int64_t i = 0; i < q_len; ++i) {
      const int64_t pos = ctx - q_len + i;
      positions_[begin + i] = static_cast<int32_t>(pos);
      slots_[begin + i] = rows.block_tables[b * rows.table_stride + pos / bs] * bs + pos % bs;
      const int64_t id = batch.ids[begin + i];
      require(id >= 0 && id < dims_.vocab, "token id " + std::to_string(id) + " out of range");
    }
  }
  for (int64_t i = 0; i < batch.n_logits; ++i) {
    require(batch.logits_rows[i] >= 0 && batch.logits_rows[i] < n_tokens,
            "logits row out of range");
  }
  if (has_recurrent_) plan_recurrent(batch);
}

void LlamaForward::ensure_scratch(int64_t n_tokens, int64_t n_logits) {
  const LlamaDims& d = dims_;
  const int64_t t = std::max(n_tokens, n_logits);
  // A MoE MLP's rows are (token, expert) pairs, k per token.
  const int64_t mlp_rows = std::max(t, n_tokens * d.n_experts_used);
  auto grow = [](auto& v, int64_t n) {
    if (static_cast<int64_t>(v.size()) < n) v.resize(static_cast<size_t>(n));
  };
  grow(x_, t * d.dim);
  grow(h_, t * d.dim);
  grow(delta_, t * d.dim);
  grow(qkv_, t * qkv_width_);
  grow(q_, t * max_q_width_);
  grow(attn_, t * max_q_width_);
  grow(v_, n_tokens * max_kv_width_);
  // The widest of a dense MLP's, the experts' (k rows a token) and the shared expert's.
  const int64_t mlp_width = std::max({t * d.ffn, mlp_rows * expert_ffn(), n_tokens * d.shared_ffn});
  grow(gate_up_, 2 * mlp_width);
  grow(act_, mlp_width);
  if (d.shared_ffn > 0) grow(shexp_out_, n_tokens * d.dim);
  if (d.per_layer_dim > 0) {
    grow(ple_inputs_, n_tokens * d.n_layers * d.per_layer_dim);
    grow(ple_tokens_, n_tokens * d.n_layers * d.per_layer_dim);
    grow(ple_gate_, n_tokens * d.per_layer_dim);
  }
  if (has_recurrent_) {
    const RecurrentDims& r = d.recurrent;
    grow(ssm_proj_, n_tokens * (r.conv_dim() + r.value_width() + 2 * r.v_heads));
    grow(ssm_mixed_, n_tokens * r.conv_dim());
    grow(ssm_g_, n_tokens * r.v_heads);
    grow(ssm_beta_, n_tokens * r.v_heads);
    grow(ssm_o_, n_tokens * r.value_width());
  }
  if (d.n_experts > 0) {
    grow(expert_out_, mlp_rows * d.dim);
    grow(pair_expert_, mlp_rows);
    grow(pair_row_, mlp_rows);
    grow(row_token_, mlp_rows);
    grow(pair_weight_, mlp_rows);
    grow(router_logits_, n_tokens * d.n_experts);
    grow(expert_start_, d.n_experts + 1);
    grow(moe_out_, n_tokens * d.dim);
    grow(router_in_, n_tokens * d.dim);
  }
  if (mlp_rows > act_rows_cap_) {
    act_rows_cap_ = mlp_rows;
    act_qs_.resize(static_cast<size_t>(mlp_rows * max_k_));
    act_scales_.resize(static_cast<size_t>(2 * mlp_rows * (max_k_ / kBlock)));
  }
}

void LlamaForward::forward(const ForwardBatch& batch, float* logits) {
  const auto started = std::chrono::steady_clock::now();
  plan(batch);
  const int64_t n_tokens = batch.rows.cu_seqlens[batch.rows.n_rows];
  if (n_tokens == 0) return;
  ensure_scratch(n_tokens, batch.n_logits);
  argmax_.resize(static_cast<size_t>(batch.n_logits));
  if (has_recurrent_) reset_new_rows(batch);
#ifdef _OPENMP
#pragma omp parallel num_threads(n_threads_)
#endif
  {
#ifdef _OPENMP
    // The team may be smaller than asked for (e.g. when called from inside another team).
#pragma omp single
    {
      barrier_.reset(omp_get_num_threads());
      claims_.reset();
    }
#endif
    set_team_claims(&claims_);
    embed(batch, n_tokens);
    barrier_.wait();
    if (dims_.per_layer_dim > 0) per_layer_inputs(batch, n_tokens);
    for (int64_t layer = 0; layer < dims_.n_layers; ++layer) {
      const LayerWeights& w = w_.layers[static_cast<size_t>(layer)];
      mixer_input(w, layer, n_tokens);
      switch (w.mixer) {
        case Mixer::kRecurrent:
          recurrent_block(w, batch, n_tokens);
          break;
        case Mixer::kAttention:
          attention_block(w, batch, layer, n_tokens);
          break;
      }
      switch (w.mlp) {
        case Mlp::kMoe:
          moe_block(w, n_tokens);
          break;
        case Mlp::kDenseAndMoe:
          dense_and_moe_block(w, n_tokens);
          break;
        case Mlp::kDense:
          mlp_block(w, n_tokens);
          break;
      }
      if (w.per_layer_input) per_layer_block(w, layer, n_tokens);
    }
    head(batch, logits);
    set_team_claims(nullptr);
  }
  kernel_seconds_ +=
      std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  ++calls_;
}

void LlamaForward::project(const QuantWeight& whole, const std::vector<QuantWeight>& parts,
                           const detail::QuantActs& acts, float* y, int64_t n_tokens) {
  if (parts.empty()) {
    matmul_acts_team(acts, whole.data, y, n_tokens, whole.n, whole.k, whole.q, isa_);
    return;
  }
  // Disjoint columns of one complete input: no barrier between the parts.
  int64_t column = 0;
  for (const QuantWeight& part : parts) {
    matmul_acts_team(acts, part.data, y + column, n_tokens, part.n, part.k, part.q, isa_, whole.n);
    column += part.n;
  }
}

detail::QuantActs LlamaForward::quant_acts() {
  // Rows of any width k <= max_k_ fit: a row's blocks start at row * k / 32 in either half.
  return detail::QuantActs{act_qs_.data(), act_scales_.data(),
                           act_scales_.data() + act_rows_cap_ * (max_k_ / kBlock)};
}

// Each block below is called by every thread of the team. Loops and matmuls share out their work
// without OpenMP's barrier; barrier_.wait() after each stage makes its output complete before
// the next stage reads it (or overwrites its input).

void LlamaForward::embed(const ForwardBatch& batch, int64_t n_tokens) {
  const int64_t dim = dims_.dim;
#ifdef _OPENMP
#pragma omp for schedule(static) nowait
#endif
  for (int64_t t = 0; t < n_tokens; ++t) {
    float* out = x_.data() + t * dim;
    detail::table_row(w_.embed, w_.embed_dense, batch.ids[t], dim, out);
    if (dims_.embed_scale != 1.0f) {
      for (int64_t i = 0; i < dim; ++i) out[i] *= dims_.embed_scale;
    }
  }
}

void LlamaForward::residual_norm_row(int64_t t, const float* norm, bool add_delta,
                                     const float* post_norm, const detail::QuantActs& acts,
                                     const float* scale) {
  const int64_t dim = dims_.dim;
  float* x = x_.data() + t * dim;
  if (add_delta) {
    float* delta = delta_.data() + t * dim;
    if (post_norm != nullptr) rms_norm_row(delta, post_norm, delta, dim, dims_.norm_eps);
    for (int64_t i = 0; i < dim; ++i) x[i] += delta[i];
    if (scale != nullptr) {
      for (int64_t i = 0; i < dim; ++i) x[i] *= *scale;
    }
  }
  if (norm != nullptr) {
    rms_norm_row(x, norm, h_.data() + t * dim, dim, dims_.norm_eps);
  } else {
    std::memcpy(h_.data() + t * dim, x, sizeof(float) * dim);
  }
  quantize_act_row(h_.data(), dim, t, acts, isa_);
}

void LlamaForward::head(const ForwardBatch& batch, float* logits) {
  const LlamaDims& d = dims_;
  const detail::QuantActs acts = quant_acts();
#ifdef _OPENMP
#pragma omp for schedule(static) nowait
#endif
  for (int64_t i = 0; i < batch.n_logits; ++i) {
    const int64_t t = batch.logits_rows[i];
    float* out = h_.data() + i * d.dim;
    const float* x = x_.data() + t * d.dim;
    const float* delta = delta_.data() + t * d.dim;
    // Into `out`, never in place: a token may be asked for twice.
    const float* post = pending_norm(w_.layers.back());
    if (post != nullptr) {
      rms_norm_row(delta, post, out, d.dim, d.norm_eps);
      for (int64_t j = 0; j < d.dim; ++j) out[j] += x[j];
    } else {
      for (int64_t j = 0; j < d.dim; ++j) out[j] = x[j] + delta[j];
    }
    if (const float* scale = w_.layers.back().out_scale; scale != nullptr) {
      for (int64_t j = 0; j < d.dim; ++j) out[j] *= *scale;
    }
    rms_norm_row(out, w_.norm, out, d.dim, d.norm_eps);
    quantize_act_row(h_.data(), d.dim, i, acts, isa_);
  }
  barrier_.wait();
  matmul_acts_team(acts, w_.lm_head.data, logits, batch.n_logits, d.vocab, d.dim, w_.lm_head.q,
                   isa_);
  barrier_.wait();
#ifdef _OPENMP
#pragma omp for schedule(static) nowait
#endif
  for (int64_t i = 0; i < batch.n_logits; ++i) {
    float* row = logits + i * d.vocab;
    if (d.final_softcap > 0.0f) activations_.softcap(row, d.final_softcap, d.vocab);
    int64_t best = 0;
    for (int64_t v = 1; v < d.vocab; ++v) {
      const bool first_nan = row[v] != row[v] && row[best] == row[best];
      if (row[v] > row[best] || first_nan) best = v;
    }
    argmax_[static_cast<size_t>(i)] = best;
  }
}

}  // namespace met::cpu
