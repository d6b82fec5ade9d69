// Owns: one packed forward of a decoder (each layer as python/met/model/families plans it:
//   attention or a Gated DeltaNet recurrent mixer (deltanet_forward.cpp), window, RoPE full,
//   partial or none, Q/K norms per head or over the projection, a gated attention output,
//   pre/post/sandwich norms, dense or mixture-of-experts MLP with an optional shared expert, or
//   both side by side) on the CPU with the linear weights kept in GGUF blocks (llama_weights.h
//   says what the forward takes): the whole layer loop runs in C++ inside one OpenMP team, so a
//   decode step costs no per-op trip through Python.
// Called by: csrc/bindings/cpu_model.cpp and cpu_weights.cpp (python/met/model/cpu_llama.py),
//   tests/cpp.
// Invariants: every stage is per token (RMSNorm, RoPE, SiLU, the activation quantization, the
//   quantized matmul's rows, paged attention's per-query order), so a token's logits are bitwise
//   the same whatever else is in the batch, whichever chunk of its prompt it came in and however
//   many threads run. A recurrent layer's prefill runs its rule in chunks aligned to absolute
//   positions (multiples of kDeltaChunk), so a prompt split at such multiples gives the same
//   bits; a decode or verify token takes the one-token step (not the chunk form's rounding).
//   The caller owns the weights, the KV pool and the recurrent state and keeps them alive.
#pragma once

#include <cstdint>
#include <vector>

#include "cpu/attention.h"
#include "cpu/attention_internal.h"
#include "cpu/column_claims.h"
#include "cpu/isa.h"
#include "cpu/llama_weights.h"
#include "cpu/ops.h"
#include "cpu/quant_matmul.h"
#include "cpu/team_barrier.h"

namespace met::cpu {

namespace detail {
// Throws std::invalid_argument unless w is [n, k] in GGUF blocks.
void check_weight(const QuantWeight& w, int64_t n, int64_t k, const char* name);
// Row `id` of a [rows, width] table held as blocks (blocks.data set) or float32 (dense), into
// out.
void table_row(const QuantWeight& blocks, const float* dense, int64_t id, int64_t width,
               float* out);
}  // namespace detail

constexpr int64_t kDeltaChunk = 64;  // tokens per chunk of a recurrent layer's prefill

struct ForwardBatch {
  const int64_t* ids = nullptr;  // [n_tokens], row after row
  // Rows as paged attention reads them; a row's tokens sit at positions seq_len - q_len ..
  // seq_len - 1 and their K/V go to the matching slots of its block table.
  AttnRows rows{};
  const int64_t* logits_rows = nullptr;  // packed tokens whose logits are wanted
  int64_t n_logits = 0;
  // With recurrent layers: each row's state slot (distinct; a row starting at position 0 starts
  // from a zeroed state) and, null or 0 for none, which rows verify drafts (their state after
  // each token is kept in RecurrentState's snapshots).
  const int32_t* state_slots = nullptr;
  const uint8_t* verify = nullptr;
  // (row, position, index) triples in (row, position) order: the row's state as of `position`
  // (inside a prefill row of 2+ tokens) is written into checkpoint `index`.
  const int64_t* checkpoints = nullptr;
  int64_t n_checkpoints = 0;
};

class LlamaForward {
 public:
  // k_cache, v_cache: [n_layers, num_blocks, block_size, n_kv_heads, head_dim], fp32 or, with
  // dims.kv_half, fp16 (K/V are rounded to nearest even as they are stored); a layer with its
  // own k_pages/v_pages (in the same element type) uses those instead.
  // Throws std::invalid_argument on inconsistent shapes (std::runtime_error on a bad
  // MET_CPU_ISA). n_threads <= 0: OpenMP's default. Every step runs the kernel path active now.
  LlamaForward(const LlamaDims& dims, LlamaWeights weights, void* k_cache, void* v_cache,
               int n_threads);

  // Writes this step's K/V into the pool and logits [n_logits, vocab]. Throws
  // std::invalid_argument (before touching anything) on a token id, position, block id or
  // logits row out of range.
  void forward(const ForwardBatch& batch, float* logits);

  // Where the recurrent layers' state lives (the model must have recurrent layers); set again
  // whenever the snapshots are reallocated.
  void set_recurrent_state(const RecurrentState& state);
  bool has_recurrent() const { return has_recurrent_; }
  // What set_recurrent_state gave (all null and 0 before).
  const RecurrentState& recurrent_state() const { return state_; }
  // Checkpoint `index` takes state slot `slot`'s state over every recurrent layer: as it is now
  // (token < 0), or as it was after token `token` of the slot's last verify row.
  void keep_checkpoint(int64_t index, int64_t slot, int64_t token);
  // Slot `slot` goes back to its state after the first `tokens` tokens of its last verify row.
  void restore_verified(int64_t slot, int64_t tokens);

  // Greedy tokens of the last forward's logits rows (torch.argmax's choice: the first maximum,
  // or the first NaN), found while the rows are still in cache.
  const std::vector<int64_t>& argmax() const { return argmax_; }

  int n_threads() const { return n_threads_; }
  int64_t vocab() const { return dims_.vocab; }
  // Wall time spent inside forward() since construction: what a caller subtracts from its step
  // time to measure its own (host) overhead.
  double kernel_seconds() const { return kernel_seconds_; }
  int64_t calls() const { return calls_; }
  // The matmul kernel and the kernel path (cpu/isa.h) fixed at construction.
  const char* isa() const { return isa_name(isa_); }
  const char* path() const { return path_name(path_); }

 private:
  void plan(const ForwardBatch& batch);
  void ensure_scratch(int64_t n_tokens, int64_t n_logits);
  void embed(const ForwardBatch& batch, int64_t n_tokens);
  void attention_block(const LayerWeights& w, const ForwardBatch& batch, int64_t layer,
                       int64_t n_tokens);
  // The residual stream into a mixer: the previous layer's output added, normed, quantized.
  void mixer_input(const LayerWeights& w, int64_t layer, int64_t n_tokens);
  // A Gated DeltaNet layer (deltanet_forward.cpp): projection, causal conv, the delta rule per
  // (row, value head), gated norm and output projection into delta_.
  void recurrent_block(const LayerWeights& w, const ForwardBatch& batch, int64_t n_tokens);
  void check_recurrent(const LayerWeights& l) const;
  void plan_recurrent(const ForwardBatch& batch);
  void plan_checkpoints(const ForwardBatch& batch);
  void reset_new_rows(const ForwardBatch& batch);
  void conv_channels(const LayerWeights& w, const ForwardBatch& batch);
  void delta_inputs(const LayerWeights& w, int64_t n_tokens);
  void delta_items(const LayerWeights& w, const ForwardBatch& batch);
  void gated_output(const LayerWeights& w, int64_t n_tokens);
  // The shared expert of a MoE layer, into shexp_out_ (moe_forward.cpp).
  void shared_expert(const LayerWeights& w, int64_t n_tokens);
  // Per-layer embeddings (per_layer_inputs.cpp): every layer's inputs of the step's tokens into
  // ple_inputs_, and a layer's step after its MLP (the MLP's output joined to the residual, the
  // per-layer output left in delta_ for the next layer to add through ple_norm).
  void check_per_layer(const LayerWeights& l) const;
  void per_layer_inputs(const ForwardBatch& batch, int64_t n_tokens);
  void per_layer_block(const LayerWeights& w, int64_t layer, int64_t n_tokens);
  // The norm the next layer applies to delta_ before adding it: the per-layer output's, else
  // the MLP output's (null: none).
  static const float* pending_norm(const LayerWeights& w) {
    return w.per_layer_input ? w.ple_norm : w.post_mlp_norm;
  }
  // The dense MLP and Gemma 4's dense MLP beside the experts (mlp_forward.cpp), into delta_;
  // gated_row: one row's activation of its gate/up [2 * f] into out [f], as the model's MLPs
  // gate (SiLU, GeLU(tanh) or the clamped SwiGLU).
  void mlp_block(const LayerWeights& w, int64_t n_tokens);
  void dense_and_moe_block(const LayerWeights& w, int64_t n_tokens);
  void gated_row(const float* gate_up, float* out, int64_t f) const;
  int64_t expert_ffn() const { return dims_.expert_ffn > 0 ? dims_.expert_ffn : dims_.ffn; }
  // The MoE MLP (moe_forward.cpp): route each token, group the (token, expert) pairs by expert,
  // run each expert's matmuls over its rows, and sum each token's k outputs into delta_.
  // routed_experts: all but the input norm, the router reading router_in, the experts h_, the
  // sum into out.
  void moe_block(const LayerWeights& w, int64_t n_tokens);
  void routed_experts(const LayerWeights& w, const float* router_in, float* out, int64_t n_tokens);
  void expert_matmuls(const LayerWeights& w, int64_t n_tokens);
  void sum_experts(const LayerWeights& w, float* out, int64_t n_tokens);
  void route_tokens(const LayerWeights& w, const float* router_in, int64_t n_tokens);
  // Token t's experts and weights from its router logits: gpt-oss's softmax over the top k, or
  // the top k of the softmax (renormalised with moe_norm_topk).
  void topk_softmax(const float* logits, int64_t t);
  void softmax_topk(float* logits, int64_t t);
  void group_by_expert(int64_t n_tokens);
  int64_t expert_of_row(int64_t row) const;  // the expert whose run of sorted rows holds `row`
  void check_experts(const LayerWeights& l) const;
  // Token t's residual row, after adding the last sublayer's output when add_delta, normalized
  // with `norm` into h_ and quantized there for the next matmul.
  // With post_norm, the sublayer's output is normalized by it before it joins (Gemma).
  // With scale (the previous layer's out_scale), the residual is multiplied by it after the add.
  void residual_norm_row(int64_t t, const float* norm, bool add_delta, const float* post_norm,
                         const detail::QuantActs& acts, const float* scale = nullptr);
  void rope_and_store(const LayerWeights& w, int64_t layer, int64_t n_tokens);
  // One token's Q/K norms over its n_kv K heads (0: a shared-KV layer's Q only), in place.
  void qk_norms(const LayerWeights& w, float* qkv, int64_t n_kv) const;
  // A layer's head width and KV heads (its own or the model's), and its K/V pages.
  int64_t head_dim_of(const LayerWeights& w) const;
  int64_t kv_heads_of(const LayerWeights& w) const;
  void* pages(const LayerWeights& w, bool values, int64_t layer) const;
  // Element `offset` of a pool, in its element type.
  void* kv_at(void* pool, int64_t offset) const;
  // n floats into the pool at element `offset` (rounded to fp16 with kv_half).
  void store_kv(const float* src, void* pool, int64_t offset, int64_t n) const;
  void head(const ForwardBatch& batch, float* logits);
  detail::QuantActs quant_acts();
  // y [n_tokens, whole.n] = acts x whole^T, from the one weight or its parts.
  void project(const QuantWeight& whole, const std::vector<QuantWeight>& parts,
               const detail::QuantActs& acts, float* y, int64_t n_tokens);

  LlamaDims dims_;
  LlamaWeights w_;
  void* k_cache_;
  void* v_cache_;
  int n_threads_;
  CpuPath path_;
  Isa isa_;
  detail::AttnItemFn attend_;
  Activations activations_{};  // the gated activations and soft-cap at the path's register width
  int64_t qkv_width_;          // the widest layer's Q/K/V row
  int64_t max_q_width_;        // and Q row
  int64_t max_kv_width_;
  int64_t max_k_;
  TeamBarrier barrier_;
  ColumnClaims claims_;  // the tails of the threads' column shares (column_claims.h)
  double kernel_seconds_ = 0.0;
  int64_t calls_ = 0;
  // Scratch, grown to the largest batch seen; float rows are dense [tokens, width].
  std::vector<float> x_, h_, qkv_, q_, attn_, gate_up_, act_, delta_, v_;
  std::vector<int32_t> positions_;
  std::vector<int64_t> argmax_;
  std::vector<int64_t> slots_;
  int64_t act_rows_cap_ = 0;
  std::vector<int8_t> act_qs_;
  std::vector<float> act_scales_;
  // MoE scratch: per (token, slot) pair its expert and weight, and its row in the expert-sorted
  // order; per sorted row its token; where each expert's rows start (n_experts + 1).
  std::vector<int32_t> pair_expert_, pair_row_, row_token_;
  std::vector<float> pair_weight_, router_logits_, expert_out_;
  std::vector<int64_t> expert_start_, expert_next_;
  std::vector<float> shexp_out_;
  std::vector<float> moe_out_, router_in_;  // a dense+moe layer's experts' output, router input
  std::vector<float> ple_inputs_, ple_tokens_,
      ple_gate_;  // [tokens, n_layers * D], .., [tokens, D]
  // Recurrent layers: their state, the projections one after the other ([tokens, conv_dim],
  // then z, beta and alpha's),
  // the conv output (q, k normalized in place) [tokens, conv_dim], g and beta [tokens, v_heads]
  // each, the rule's output [tokens, value_width], per-thread scratch of the chunk form.
  RecurrentState state_;
  bool has_recurrent_ = false;
  int64_t n_recurrent_ = 0;
  std::vector<int64_t> ckpt_begin_;  // each row's first checkpoint triple (n_rows + 1)
  std::vector<float> ssm_proj_, ssm_mixed_, ssm_g_, ssm_beta_, ssm_o_, ssm_scratch_;
  int64_t ssm_scratch_stride_ = 0;
};

}  // namespace met::cpu
