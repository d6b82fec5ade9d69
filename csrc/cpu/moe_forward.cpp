// The CPU model's mixture-of-experts MLP (LlamaForward::moe_block, see llama_forward.h).
//
// A step routes every token (float32 router, softmax, top k, optional renormalisation, optional
// per-expert scales; Gemma 4's router reads the residual stream scaled instead), sorts
// the n_tokens * k (token, expert) pairs by expert with a counting sort that keeps token order,
// gathers the pairs' normalized rows in that order and quantizes them once, then runs each
// expert's gate/up and down matmuls over its contiguous run of rows. Every token then sums its k
// outputs, weighted, in its own top-k order: a token's result never depends on which other
// tokens share its experts, so the forward's batch invariance holds.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <stdexcept>
#include <string>

#include "cpu/llama_forward.h"
#include "cpu/ops.h"
#include "cpu/quant_matmul_internal.h"

namespace met::cpu {

namespace {

// Router logit: a float32 dot product with 8 independent partial sums (a fixed order, so the
// same on every path and thread count, and one the compiler can vectorize).
float dot(const float* a, const float* b, int64_t n) {
  float part[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    for (int j = 0; j < 8; ++j) part[j] += a[i + j] * b[i + j];
  }
  for (; i < n; ++i) part[0] += a[i] * b[i];
  return ((part[0] + part[1]) + (part[2] + part[3])) + ((part[4] + part[5]) + (part[6] + part[7]));
}

// The acts of rows [first, ...) of a k-wide quantized batch (rows are k / 32 blocks apart).
detail::QuantActs acts_from(const detail::QuantActs& acts, int64_t first, int64_t k) {
  const int64_t blocks = first * (k / kBlock);
  return detail::QuantActs{acts.qs + first * k, acts.scale + blocks, acts.scaled_sum + blocks};
}

// The k largest of `values` into ids (the lower expert id first among equals).
void top_k(const float* values, int64_t n_exp, int64_t k, int32_t* ids) {
  for (int64_t j = 0; j < k; ++j) {
    int32_t best = -1;
    for (int32_t e = 0; e < n_exp; ++e) {
      if (std::find(ids, ids + j, e) != ids + j) continue;
      if (best < 0 || values[e] > values[best]) best = e;
    }
    ids[j] = best;
  }
}

}  // namespace

int64_t LlamaForward::expert_of_row(int64_t row) const {
  const auto* starts = expert_start_.data();
  return std::upper_bound(starts, starts + dims_.n_experts + 1, row) - starts - 1;
}

void LlamaForward::check_experts(const LayerWeights& l) const {
  const LlamaDims& d = dims_;
  auto fail = [](const std::string& what) { throw std::invalid_argument("LlamaForward: " + what); };
  if (d.n_experts == 0) fail("a mixture-of-experts layer needs n_experts > 0");
  if (l.router == nullptr) fail("a mixture-of-experts layer needs its router");
  if (static_cast<int64_t>(l.expert_gate_up.size()) != d.n_experts ||
      static_cast<int64_t>(l.expert_down.size()) != d.n_experts) {
    fail("each MoE layer needs " + std::to_string(d.n_experts) + " experts");
  }
  const auto n_biases = static_cast<int64_t>(l.expert_b_gate_up.size());
  if ((n_biases != 0 && n_biases != d.n_experts) ||
      static_cast<int64_t>(l.expert_b_down.size()) != n_biases) {
    fail("expert biases come for every expert, gate/up and down");
  }
  for (int64_t e = 0; e < n_biases; ++e) {
    if (l.expert_b_gate_up[static_cast<size_t>(e)] == nullptr ||
        l.expert_b_down[static_cast<size_t>(e)] == nullptr) {
      fail("expert " + std::to_string(e) + "'s biases are null");
    }
  }
  if (l.shexp_gate != nullptr) {
    if (d.shared_ffn <= 0) fail("a shared expert needs shared_ffn > 0");
    detail::check_weight(l.shexp_gate_up, 2 * d.shared_ffn, d.dim, "shexp_gate_up");
    detail::check_weight(l.shexp_down, d.dim, d.shared_ffn, "shexp_down");
  }
  // A scaled router reads the residual stream, which only a dense+moe layer hands it.
  if (l.router_scale != nullptr && l.mlp != Mlp::kDenseAndMoe) {
    fail("a scaled router runs beside a dense MLP (Mlp::kDenseAndMoe)");
  }
  if (l.mlp == Mlp::kDenseAndMoe &&
      !(l.moe_norm && l.post_mlp_norm_1 && l.post_moe_norm && l.router_scale)) {
    fail("a dense+moe layer needs moe_norm, post_mlp_norm_1, post_moe_norm and router_scale");
  }
  const int64_t f = expert_ffn();
  for (int64_t e = 0; e < d.n_experts; ++e) {
    const QuantWeight& gu = l.expert_gate_up[static_cast<size_t>(e)];
    const QuantWeight& down = l.expert_down[static_cast<size_t>(e)];
    if (gu.data == nullptr || gu.n != 2 * f || gu.k != d.dim || down.data == nullptr ||
        down.n != d.dim || down.k != f) {
      fail("expert " + std::to_string(e) + " must be gate/up [" + std::to_string(2 * f) + ", " +
           std::to_string(d.dim) + "] and down [" + std::to_string(d.dim) + ", " +
           std::to_string(f) + "] in GGUF blocks");
    }
  }
}

void LlamaForward::route_tokens(const LayerWeights& w, const float* router_in, int64_t n_tokens) {
  const LlamaDims& d = dims_;
  const int64_t n_exp = d.n_experts, k = d.n_experts_used;
#ifdef _OPENMP
#pragma omp for schedule(static) nowait
#endif
  for (int64_t t = 0; t < n_tokens; ++t) {
    float* logits = router_logits_.data() + t * n_exp;
    const float* r = router_in + t * d.dim;
    for (int64_t e = 0; e < n_exp; ++e) {
      logits[e] = dot(r, w.router + e * d.dim, d.dim);
      if (w.router_bias != nullptr) logits[e] += w.router_bias[e];
    }
    if (d.moe_topk_softmax) {
      topk_softmax(logits, t);
    } else {
      softmax_topk(logits, t);
    }
    if (w.expert_scale == nullptr) continue;
    for (int64_t j = 0; j < k; ++j)
      pair_weight_[t * k + j] *= w.expert_scale[pair_expert_[t * k + j]];
  }
}

void LlamaForward::softmax_topk(float* logits, int64_t t) {
  // The softmax over all experts in place, then its k largest probabilities.
  const int64_t n_exp = dims_.n_experts, k = dims_.n_experts_used;
  const float top = *std::max_element(logits, logits + n_exp);
  float sum = 0.0f;
  for (int64_t e = 0; e < n_exp; ++e) sum += (logits[e] = std::exp(logits[e] - top));
  for (int64_t e = 0; e < n_exp; ++e) logits[e] /= sum;
  int32_t* ids = pair_expert_.data() + t * k;
  top_k(logits, n_exp, k, ids);
  float picked = 0.0f;
  for (int64_t j = 0; j < k; ++j) picked += logits[ids[j]];
  for (int64_t j = 0; j < k; ++j) {
    pair_weight_[t * k + j] = dims_.moe_norm_topk ? logits[ids[j]] / picked : logits[ids[j]];
  }
}

void LlamaForward::topk_softmax(const float* logits, int64_t t) {
  // gpt-oss: the k largest logits, then exp(l - max) over them divided by their sum; the max is
  // the first pick's.
  const int64_t n_exp = dims_.n_experts, k = dims_.n_experts_used;
  int32_t* ids = pair_expert_.data() + t * k;
  top_k(logits, n_exp, k, ids);
  float* weights = pair_weight_.data() + t * k;
  float sum = 0.0f;
  for (int64_t j = 0; j < k; ++j) sum += (weights[j] = std::exp(logits[ids[j]] - logits[ids[0]]));
  for (int64_t j = 0; j < k; ++j) weights[j] /= sum;
}

void LlamaForward::group_by_expert(int64_t n_tokens) {
  // A counting sort by expert, stable in token order: each expert's rows are contiguous.
  const int64_t n_exp = dims_.n_experts, n_pairs = n_tokens * dims_.n_experts_used;
  std::fill(expert_start_.begin(), expert_start_.end(), 0);
  for (int64_t p = 0; p < n_pairs; ++p) ++expert_start_[pair_expert_[p] + 1];
  std::partial_sum(expert_start_.begin(), expert_start_.begin() + n_exp + 1, expert_start_.begin());
  std::vector<int64_t>& next = expert_next_;
  next.assign(expert_start_.begin(), expert_start_.begin() + n_exp);
  for (int64_t p = 0; p < n_pairs; ++p) {
    const int64_t row = next[pair_expert_[p]]++;
    pair_row_[p] = static_cast<int32_t>(row);
    row_token_[row] = static_cast<int32_t>(p / dims_.n_experts_used);
  }
}

void LlamaForward::moe_block(const LayerWeights& w, int64_t n_tokens) {
  const detail::QuantActs acts = quant_acts();
#ifdef _OPENMP
#pragma omp for schedule(static) nowait
#endif
  for (int64_t t = 0; t < n_tokens; ++t) {
    residual_norm_row(t, w.mlp_norm, true, w.post_attn_norm, acts);
  }
  barrier_.wait();
  routed_experts(w, h_.data(), delta_.data(), n_tokens);
}

void LlamaForward::routed_experts(const LayerWeights& w, const float* router_in, float* out,
                                  int64_t n_tokens) {
  route_tokens(w, router_in, n_tokens);
  barrier_.wait();
#ifdef _OPENMP
#pragma omp single nowait
#endif
  group_by_expert(n_tokens);
  barrier_.wait();
  expert_matmuls(w, n_tokens);
  if (w.shexp_gate != nullptr) shared_expert(w, n_tokens);
  sum_experts(w, out, n_tokens);
}

void LlamaForward::expert_matmuls(const LayerWeights& w, int64_t n_tokens) {
  const LlamaDims& d = dims_;
  const int64_t n_pairs = n_tokens * d.n_experts_used, f = expert_ffn();
  const detail::QuantActs acts = quant_acts();
  // The pairs' rows in expert order, quantized once for every expert's gate/up matmul.
#ifdef _OPENMP
#pragma omp for schedule(static) nowait
#endif
  for (int64_t r = 0; r < n_pairs; ++r) {
    float* row = expert_out_.data() + r * d.dim;
    std::memcpy(row, h_.data() + row_token_[r] * d.dim, sizeof(float) * d.dim);
    quantize_act_row(expert_out_.data(), d.dim, r, acts, isa_);
  }
  barrier_.wait();
  // Each expert's matmul shares out its columns; consecutive experts need no barrier between
  // them (disjoint outputs, inputs complete).
  for (int64_t e = 0; e < d.n_experts; ++e) {
    const int64_t first = expert_start_[e], rows = expert_start_[e + 1] - first;
    if (rows == 0) continue;
    const QuantWeight& gu = w.expert_gate_up[static_cast<size_t>(e)];
    matmul_acts_team(acts_from(acts, first, d.dim), gu.data, gate_up_.data() + first * 2 * f, rows,
                     2 * f, d.dim, gu.q, isa_);
  }
  barrier_.wait();
#ifdef _OPENMP
#pragma omp for schedule(static) nowait
#endif
  for (int64_t r = 0; r < n_pairs; ++r) {
    float* gate = gate_up_.data() + r * 2 * f;
    if (!w.expert_b_gate_up.empty()) {
      const float* bias = w.expert_b_gate_up[static_cast<size_t>(expert_of_row(r))];
      for (int64_t i = 0; i < 2 * f; ++i) gate[i] += bias[i];
    }
    gated_row(gate, act_.data() + r * f, f);
    quantize_act_row(act_.data(), f, r, acts, isa_);
  }
  barrier_.wait();
  for (int64_t e = 0; e < d.n_experts; ++e) {
    const int64_t first = expert_start_[e], rows = expert_start_[e + 1] - first;
    if (rows == 0) continue;
    const QuantWeight& down = w.expert_down[static_cast<size_t>(e)];
    matmul_acts_team(acts_from(acts, first, f), down.data, expert_out_.data() + first * d.dim, rows,
                     d.dim, f, down.q, isa_);
  }
  barrier_.wait();
}

void LlamaForward::sum_experts(const LayerWeights& w, float* out, int64_t n_tokens) {
  const LlamaDims& d = dims_;
  const int64_t k = d.n_experts_used;
#ifdef _OPENMP
#pragma omp for schedule(static) nowait
#endif
  for (int64_t t = 0; t < n_tokens; ++t) {
    float* sum = out + t * d.dim;
    std::fill(sum, sum + d.dim, 0.0f);
    for (int64_t j = 0; j < k; ++j) {
      const float weight = pair_weight_[t * k + j];
      const float* y = expert_out_.data() + static_cast<int64_t>(pair_row_[t * k + j]) * d.dim;
      if (w.expert_b_down.empty()) {
        for (int64_t i = 0; i < d.dim; ++i) sum[i] += weight * y[i];
        continue;
      }
      // The expert's output with its bias, then weighted (the torch forward's order).
      const float* bias = w.expert_b_down[static_cast<size_t>(pair_expert_[t * k + j])];
      for (int64_t i = 0; i < d.dim; ++i) sum[i] += weight * (y[i] + bias[i]);
    }
    if (w.shexp_gate == nullptr) continue;
    // After the routed experts, as the torch forward adds it.
    const float gate = sigmoid(dot(h_.data() + t * d.dim, w.shexp_gate, d.dim));
    const float* shared = shexp_out_.data() + t * d.dim;
    for (int64_t i = 0; i < d.dim; ++i) sum[i] += gate * shared[i];
  }
  barrier_.wait();
}

void LlamaForward::shared_expert(const LayerWeights& w, int64_t n_tokens) {
  // Every token's normed row (h_, still whole) through one dense gated MLP.
  const LlamaDims& d = dims_;
  const int64_t f = d.shared_ffn;
  const detail::QuantActs acts = quant_acts();
#ifdef _OPENMP
#pragma omp for schedule(static) nowait
#endif
  for (int64_t t = 0; t < n_tokens; ++t) quantize_act_row(h_.data(), d.dim, t, acts, isa_);
  barrier_.wait();
  matmul_acts_team(acts, w.shexp_gate_up.data, gate_up_.data(), n_tokens, 2 * f, d.dim,
                   w.shexp_gate_up.q, isa_);
  barrier_.wait();
#ifdef _OPENMP
#pragma omp for schedule(static) nowait
#endif
  for (int64_t t = 0; t < n_tokens; ++t) {
    const float* gate = gate_up_.data() + t * 2 * f;
    gated_row(gate, act_.data() + t * f, f);
    quantize_act_row(act_.data(), f, t, acts, isa_);
  }
  barrier_.wait();
  matmul_acts_team(acts, w.shexp_down.data, shexp_out_.data(), n_tokens, d.dim, f, w.shexp_down.q,
                   isa_);
  barrier_.wait();
}

}  // namespace met::cpu
