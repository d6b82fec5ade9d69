// Gemma 4's per-layer embeddings in the CPU model (E2B / E4B; see llama_forward.h and
// python/met/model/layer_extras.py): every token's D-wide input for each layer, built once per
// step from its embedding, and each layer's step after its MLP. Both are per token, so the
// forward's batch invariance holds.
#include <cmath>
#include <stdexcept>
#include <string>

#include "cpu/llama_forward.h"
#include "cpu/ops.h"
#include "cpu/quant_matmul_internal.h"

namespace met::cpu {

void LlamaForward::check_per_layer(const LayerWeights& l) const {
  const LlamaDims& d = dims_;
  if (!l.per_layer_input) return;
  auto fail = [](const std::string& what) { throw std::invalid_argument("LlamaForward: " + what); };
  if (d.per_layer_dim <= 0) fail("a per-layer-input layer needs per_layer_dim > 0");
  if (w_.ple_model_proj.data == nullptr || w_.ple_proj_norm == nullptr ||
      (w_.ple_embed.data == nullptr && w_.ple_embed_dense == nullptr)) {
    fail("per-layer embeddings need their table, model projection and projection norm");
  }
  if (l.ple_norm == nullptr) fail("a per-layer-input layer needs its norm");
  const int64_t width = d.n_layers * d.per_layer_dim;
  if (w_.ple_embed.data != nullptr) detail::check_weight(w_.ple_embed, d.vocab, width, "ple_embed");
  detail::check_weight(w_.ple_model_proj, width, d.dim, "ple_model_proj");
  detail::check_weight(l.ple_gate, d.per_layer_dim, d.dim, "ple_gate");
  detail::check_weight(l.ple_proj, d.dim, d.per_layer_dim, "ple_proj");
}

void LlamaForward::per_layer_inputs(const ForwardBatch& batch, int64_t n_tokens) {
  const LlamaDims& d = dims_;
  const int64_t D = d.per_layer_dim, width = d.n_layers * D;
  const detail::QuantActs acts = quant_acts();
  // As the torch forward rounds them: float32 sqrt(D), and Python's 1 / sqrt(hidden) and
  // 2 ** -0.5 as float32 scalars.
  const auto token_scale = static_cast<float>(std::sqrt(static_cast<double>(D)));
  const auto proj_scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(d.dim)));
  const auto half = static_cast<float>(std::sqrt(0.5));
#ifdef _OPENMP
#pragma omp for schedule(static) nowait
#endif
  for (int64_t t = 0; t < n_tokens; ++t) {
    quantize_act_row(x_.data(), d.dim, t, acts, isa_);  // the scaled embedding
    detail::table_row(w_.ple_embed, w_.ple_embed_dense, batch.ids[t], width,
                      ple_tokens_.data() + t * width);
  }
  barrier_.wait();
  matmul_acts_team(acts, w_.ple_model_proj.data, ple_inputs_.data(), n_tokens, width, d.dim,
                   w_.ple_model_proj.q, isa_);
  barrier_.wait();
#ifdef _OPENMP
#pragma omp for schedule(static) nowait
#endif
  for (int64_t t = 0; t < n_tokens; ++t) {
    for (int64_t l = 0; l < d.n_layers; ++l) {
      float* slice = ple_inputs_.data() + (t * d.n_layers + l) * D;
      const float* token = ple_tokens_.data() + (t * d.n_layers + l) * D;
      for (int64_t i = 0; i < D; ++i) slice[i] = slice[i] * proj_scale;
      rms_norm_row(slice, w_.ple_proj_norm, slice, D, d.norm_eps);
      for (int64_t i = 0; i < D; ++i) slice[i] = (slice[i] + token[i] * token_scale) * half;
    }
  }
  barrier_.wait();
}

void LlamaForward::per_layer_block(const LayerWeights& w, int64_t layer, int64_t n_tokens) {
  const LlamaDims& d = dims_;
  const int64_t D = d.per_layer_dim;
  const detail::QuantActs acts = quant_acts();
  // The MLP's output joins the residual here (not in the next layer's input norm), since the
  // gate reads the residual with it.
#ifdef _OPENMP
#pragma omp for schedule(static) nowait
#endif
  for (int64_t t = 0; t < n_tokens; ++t) {
    float* x = x_.data() + t * d.dim;
    float* delta = delta_.data() + t * d.dim;
    if (w.post_mlp_norm != nullptr) rms_norm_row(delta, w.post_mlp_norm, delta, d.dim, d.norm_eps);
    for (int64_t i = 0; i < d.dim; ++i) x[i] += delta[i];
    quantize_act_row(x_.data(), d.dim, t, acts, isa_);
  }
  barrier_.wait();
  matmul_acts_team(acts, w.ple_gate.data, ple_gate_.data(), n_tokens, D, d.dim, w.ple_gate.q, isa_);
  barrier_.wait();
#ifdef _OPENMP
#pragma omp for schedule(static) nowait
#endif
  for (int64_t t = 0; t < n_tokens; ++t) {
    float* gate = ple_gate_.data() + t * D;
    activations_.gelu_tanh_mul(gate, ple_inputs_.data() + (t * d.n_layers + layer) * D, gate, D);
    quantize_act_row(ple_gate_.data(), D, t, acts, isa_);
  }
  barrier_.wait();
  matmul_acts_team(acts, w.ple_proj.data, delta_.data(), n_tokens, d.dim, D, w.ple_proj.q, isa_);
  barrier_.wait();
}

}  // namespace met::cpu
