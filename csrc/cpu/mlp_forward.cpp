// The CPU model's dense MLP sublayer, and Gemma 4's dense MLP beside the routed experts
// (LlamaForward::mlp_block and dense_and_moe_block, see llama_forward.h; the experts are
// moe_forward.cpp's).
//
// A dense+moe layer runs the dense MLP as any layer does (which adds the attention output to the
// residual x_ and leaves its output in delta_), then the experts over moe_norm(x) routed by
// rms_norm(x) * router_scale, and joins the two outputs, each under its own norm, in delta_: the
// torch forward's order (python/met/model/llama.py _mlp_out), every stage per token.
#include "cpu/llama_forward.h"
#include "cpu/ops.h"
#include "cpu/quant_matmul_internal.h"

namespace met::cpu {

void LlamaForward::gated_row(const float* gate_up, float* out, int64_t f) const {
  const LlamaDims& d = dims_;
  if (d.swiglu_limit > 0.0f) {
    activations_.clamped_swiglu(gate_up, gate_up + f, out, f, d.swiglu_limit, d.swiglu_alpha);
  } else if (d.gelu) {
    activations_.gelu_tanh_mul(gate_up, gate_up + f, out, f);
  } else {
    activations_.silu_mul(gate_up, gate_up + f, out, f);
  }
}

void LlamaForward::mlp_block(const LayerWeights& w, int64_t n_tokens) {
  const LlamaDims& d = dims_;
  const detail::QuantActs acts = quant_acts();
#ifdef _OPENMP
#pragma omp for schedule(static) nowait
#endif
  for (int64_t t = 0; t < n_tokens; ++t) {
    residual_norm_row(t, w.mlp_norm, true, w.post_attn_norm, acts);
  }
  barrier_.wait();
  project(w.w_gate_up, w.w_gate_up_parts, acts, gate_up_.data(), n_tokens);
  barrier_.wait();
#ifdef _OPENMP
#pragma omp for schedule(static) nowait
#endif
  for (int64_t t = 0; t < n_tokens; ++t) {
    gated_row(gate_up_.data() + t * 2 * d.ffn, act_.data() + t * d.ffn, d.ffn);
    quantize_act_row(act_.data(), d.ffn, t, acts, isa_);
  }
  barrier_.wait();
  matmul_acts_team(acts, w.w_down.data, delta_.data(), n_tokens, d.dim, d.ffn, w.w_down.q, isa_);
  barrier_.wait();
}

void LlamaForward::dense_and_moe_block(const LayerWeights& w, int64_t n_tokens) {
  const int64_t dim = dims_.dim;
  const float eps = dims_.norm_eps;
  mlp_block(w, n_tokens);
  // The experts' input (h_, where routed_experts gathers it) and the router's, from the residual
  // the dense MLP's pre-norm read.
#ifdef _OPENMP
#pragma omp for schedule(static) nowait
#endif
  for (int64_t t = 0; t < n_tokens; ++t) {
    const float* x = x_.data() + t * dim;
    rms_norm_row(x, w.moe_norm, h_.data() + t * dim, dim, eps);
    rms_norm_row(x, w.router_scale, router_in_.data() + t * dim, dim, eps);
  }
  barrier_.wait();
  routed_experts(w, router_in_.data(), moe_out_.data(), n_tokens);
#ifdef _OPENMP
#pragma omp for schedule(static) nowait
#endif
  for (int64_t t = 0; t < n_tokens; ++t) {
    float* dense = delta_.data() + t * dim;
    float* experts = moe_out_.data() + t * dim;
    rms_norm_row(dense, w.post_mlp_norm_1, dense, dim, eps);
    rms_norm_row(experts, w.post_moe_norm, experts, dim, eps);
    for (int64_t i = 0; i < dim; ++i) dense[i] += experts[i];
  }
  barrier_.wait();
}

}  // namespace met::cpu
