// The CPU model's mixture-of-experts MLP (LlamaForward::moe_block, see llama_forward.h).
//
// A step routes every token (float32 router, softmax, top k, optional renormalisation), sorts
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
  for (int64_t e = 0; e < d.n_experts; ++e) {
    const QuantWeight& gu = l.expert_gate_up[static_cast<size_t>(e)];
    const QuantWeight& down = l.expert_down[static_cast<size_t>(e)];
    if (gu.data == nullptr || gu.n != 2 * d.ffn || gu.k != d.dim || down.data == nullptr ||
        down.n != d.dim || down.k != d.ffn) {
      fail("expert " + std::to_string(e) + " must be gate/up [" + std::to_string(2 * d.ffn) + ", " +
           std::to_string(d.dim) + "] and down [" + std::to_string(d.dim) + ", " +
           std::to_string(d.ffn) + "] in GGUF blocks");
    }
  }
}

void LlamaForward::route_tokens(const LayerWeights& w, int64_t n_tokens) {
  const LlamaDims& d = dims_;
  const int64_t n_exp = d.n_experts, k = d.n_experts_used;
#ifdef _OPENMP
#pragma omp for schedule(static) nowait
#endif
  for (int64_t t = 0; t < n_tokens; ++t) {
    float* probs = router_logits_.data() + t * n_exp;
    const float* h = h_.data() + t * d.dim;
    float top = -INFINITY;
    for (int64_t e = 0; e < n_exp; ++e) {
      probs[e] = dot(h, w.router + e * d.dim, d.dim);
      if (w.router_bias != nullptr) probs[e] += w.router_bias[e];
      top = std::max(top, probs[e]);
    }
    if (d.moe_topk_softmax) {
      topk_softmax(probs, t);
      continue;
    }
    float sum = 0.0f;
    for (int64_t e = 0; e < n_exp; ++e) sum += (probs[e] = std::exp(probs[e] - top));
    for (int64_t e = 0; e < n_exp; ++e) probs[e] /= sum;
    // The k largest probabilities, the lower expert id first among equals.
    int32_t* ids = pair_expert_.data() + t * k;
    for (int64_t j = 0; j < k; ++j) {
      int32_t best = -1;
      for (int32_t e = 0; e < n_exp; ++e) {
        if (std::find(ids, ids + j, e) != ids + j) continue;
        if (best < 0 || probs[e] > probs[best]) best = e;
      }
      ids[j] = best;
    }
    float picked = 0.0f;
    for (int64_t j = 0; j < k; ++j) picked += probs[ids[j]];
    for (int64_t j = 0; j < k; ++j) {
      pair_weight_[t * k + j] = d.moe_norm_topk ? probs[ids[j]] / picked : probs[ids[j]];
    }
  }
}

void LlamaForward::topk_softmax(const float* logits, int64_t t) {
  // gpt-oss: the k largest logits (the lower expert id first among equals), then exp(l - max)
  // over them divided by their sum; the max is the first pick's.
  const int64_t n_exp = dims_.n_experts, k = dims_.n_experts_used;
  int32_t* ids = pair_expert_.data() + t * k;
  for (int64_t j = 0; j < k; ++j) {
    int32_t best = -1;
    for (int32_t e = 0; e < n_exp; ++e) {
      if (std::find(ids, ids + j, e) != ids + j) continue;
      if (best < 0 || logits[e] > logits[best]) best = e;
    }
    ids[j] = best;
  }
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
  const LlamaDims& d = dims_;
  const int64_t k = d.n_experts_used, n_pairs = n_tokens * k;
  const detail::QuantActs acts = quant_acts();
#ifdef _OPENMP
#pragma omp for schedule(static) nowait
#endif
  for (int64_t t = 0; t < n_tokens; ++t) {
    residual_norm_row(t, w.mlp_norm, true, w.post_attn_norm, acts);
  }
  barrier_.wait();
  route_tokens(w, n_tokens);
  barrier_.wait();
#ifdef _OPENMP
#pragma omp single nowait
#endif
  group_by_expert(n_tokens);
  barrier_.wait();
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
    matmul_acts_team(acts_from(acts, first, d.dim), gu.data, gate_up_.data() + first * 2 * d.ffn,
                     rows, 2 * d.ffn, d.dim, gu.q, isa_);
  }
  barrier_.wait();
#ifdef _OPENMP
#pragma omp for schedule(static) nowait
#endif
  for (int64_t r = 0; r < n_pairs; ++r) {
    float* gate = gate_up_.data() + r * 2 * d.ffn;
    if (!w.expert_b_gate_up.empty()) {
      const float* bias = w.expert_b_gate_up[static_cast<size_t>(expert_of_row(r))];
      for (int64_t i = 0; i < 2 * d.ffn; ++i) gate[i] += bias[i];
    }
    if (d.swiglu_limit > 0.0f) {
      clamped_swiglu_row(gate, gate + d.ffn, act_.data() + r * d.ffn, d.ffn, d.swiglu_limit,
                         d.swiglu_alpha);
    } else {
      silu_mul_row(gate, gate + d.ffn, act_.data() + r * d.ffn, d.ffn);
    }
    quantize_act_row(act_.data(), d.ffn, r, acts, isa_);
  }
  barrier_.wait();
  for (int64_t e = 0; e < d.n_experts; ++e) {
    const int64_t first = expert_start_[e], rows = expert_start_[e + 1] - first;
    if (rows == 0) continue;
    const QuantWeight& down = w.expert_down[static_cast<size_t>(e)];
    matmul_acts_team(acts_from(acts, first, d.ffn), down.data, expert_out_.data() + first * d.dim,
                     rows, d.dim, d.ffn, down.q, isa_);
  }
  barrier_.wait();
  if (w.shexp_gate != nullptr) shared_expert(w, n_tokens);
#ifdef _OPENMP
#pragma omp for schedule(static) nowait
#endif
  for (int64_t t = 0; t < n_tokens; ++t) {
    float* out = delta_.data() + t * d.dim;
    std::fill(out, out + d.dim, 0.0f);
    for (int64_t j = 0; j < k; ++j) {
      const float weight = pair_weight_[t * k + j];
      const float* y = expert_out_.data() + static_cast<int64_t>(pair_row_[t * k + j]) * d.dim;
      if (w.expert_b_down.empty()) {
        for (int64_t i = 0; i < d.dim; ++i) out[i] += weight * y[i];
        continue;
      }
      // The expert's output with its bias, then weighted (the torch forward's order).
      const float* bias = w.expert_b_down[static_cast<size_t>(pair_expert_[t * k + j])];
      for (int64_t i = 0; i < d.dim; ++i) out[i] += weight * (y[i] + bias[i]);
    }
    if (w.shexp_gate == nullptr) continue;
    // After the routed experts, as the torch forward adds it.
    const float gate = sigmoid(dot(h_.data() + t * d.dim, w.shexp_gate, d.dim));
    const float* shared = shexp_out_.data() + t * d.dim;
    for (int64_t i = 0; i < d.dim; ++i) out[i] += gate * shared[i];
  }
  barrier_.wait();
}

void LlamaForward::shared_expert(const LayerWeights& w, int64_t n_tokens) {
  // Every token's normed row (h_, still whole) through one dense SiLU-gated MLP.
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
    silu_mul_row(gate, gate + f, act_.data() + t * f, f);
    quantize_act_row(act_.data(), f, t, acts, isa_);
  }
  barrier_.wait();
  matmul_acts_team(acts, w.shexp_down.data, shexp_out_.data(), n_tokens, d.dim, f, w.shexp_down.q,
                   isa_);
  barrier_.wait();
}

}  // namespace met::cpu
