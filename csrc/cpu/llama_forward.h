// Owns: one packed forward of a decoder (each layer as python/met/model/families plans it:
//   attention or a Gated DeltaNet recurrent mixer (deltanet_forward.cpp), window, RoPE full,
//   partial or none, Q/K norms per head or over the projection, a gated attention output,
//   pre/post/sandwich norms, dense or mixture-of-experts MLP with an optional shared expert) on
//   the CPU with the linear weights kept in GGUF blocks: the
//   whole layer loop runs in C++ inside one OpenMP team, so a decode step costs no per-op trip
//   through Python.
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
#include "cpu/isa.h"
#include "cpu/quant_matmul.h"
#include "cpu/team_barrier.h"

namespace met::cpu {

struct QuantWeight {
  const uint8_t* data = nullptr;  // n rows of k / 32 GGUF blocks each
  QType q = QType::kQ8_0;
  int64_t n = 0;  // output features
  int64_t k = 0;  // input features
};

// What a layer's token mixer and MLP are (python/met/model/families/spec.py's LayerSpec); the
// forward runs each layer by these, so a stack may mix kinds.
enum class Mixer : uint8_t { kAttention, kRecurrent };  // recurrent: Gated DeltaNet
enum class Mlp : uint8_t { kDense, kMoe };

namespace detail {
// Throws std::invalid_argument unless w is [n, k] in GGUF blocks.
void check_weight(const QuantWeight& w, int64_t n, int64_t k, const char* name);
// Row `id` of a [rows, width] table held as blocks (blocks.data set) or float32 (dense), into
// out.
void table_row(const QuantWeight& blocks, const float* dense, int64_t id, int64_t width,
               float* out);
}  // namespace detail

struct LayerWeights {
  Mixer mixer = Mixer::kAttention;
  Mlp mlp = Mlp::kDense;
  // The pre-norms of attention and MLP; both null in a layer without them (OLMo 2, whose
  // sublayers read the residual stream as is and have post norms instead).
  const float* attn_norm = nullptr;
  QuantWeight wqkv;  // q rows, then k rows, then v rows (rotate-half order)
  // A fused projection whose parts a file stores in different formats (a Q4_K_M file's Q5_0 q/k
  // beside a Q8_0 v): its parts' rows in order, each matmul'd into its columns of the output;
  // wqkv / w_gate_up then give only the whole's shape. Empty: the one weight.
  std::vector<QuantWeight> wqkv_parts;
  std::vector<QuantWeight> w_gate_up_parts;
  const float* bqkv = nullptr;  // Qwen2's q/k/v biases; null when the model has none
  // Qwen3's per-head RMSNorm weights [head_dim] on Q and on K, applied before RoPE; null when the
  // model has none.
  const float* q_norm = nullptr;
  const float* k_norm = nullptr;
  // OLMo 2: q_norm [n_heads * head_dim] and k_norm [n_kv_heads * head_dim] normalize the whole
  // projection instead of each head.
  bool qk_norm_full = false;
  QuantWeight wo;
  const float* mlp_norm = nullptr;
  QuantWeight w_gate_up;  // gate rows, then up rows
  QuantWeight w_down;
  // A mixture-of-experts MLP (mlp kMoe, LlamaDims::n_experts of them) instead of w_gate_up /
  // w_down: the
  // float32 router [n_experts, dim] and each expert's gate/up [2 * ffn, dim] and down [dim, ffn].
  const float* router = nullptr;
  std::vector<QuantWeight> expert_gate_up;
  std::vector<QuantWeight> expert_down;
  // Gemma's norms of the attention and MLP outputs before they join the residual; null: none.
  const float* post_attn_norm = nullptr;
  const float* post_mlp_norm = nullptr;
  // This layer's own RoPE tables [max_positions, head_dim / 2] (Gemma 3's sliding layers);
  // null: the model's.
  const float* rope_cos = nullptr;
  const float* rope_sin = nullptr;
  bool no_rope = false;  // Q and K stay unrotated (SmolLM3's every 4th layer)
  // This layer's attention window (keys p - window + 1 .. p for a query at p); 0: the whole
  // context.
  int64_t window = 0;
  // gpt-oss: attention sinks [n_heads] (AttnShape::sinks), the output projection's bias [dim],
  // the router's bias [n_experts] and each expert's gate/up [2 * ffn] (gate, then up) and down
  // [dim] biases, in expert order; null and empty: none.
  const float* sinks = nullptr;
  const float* bo = nullptr;
  const float* router_bias = nullptr;
  std::vector<const float*> expert_b_gate_up;
  std::vector<const float*> expert_b_down;
  // Gemma 4. The layer's own head width and KV heads (0: the model's; a width of its own needs
  // its own RoPE tables). Its K/V pages [num_blocks, block_size, n_kv_heads, head_dim] (null:
  // the model's pool at this layer's index); a shared-KV layer's are an earlier layer's, which
  // it attends over: wqkv then holds Q's rows only and the layer stores nothing. k_as_v: V is
  // the K projection as it came out (wqkv holds Q and K rows). v_norm: V is RMS-normalized per
  // head with this [head_dim] weight (ones: no weight). out_scale: the layer's output (the
  // residual after its MLP) times *out_scale; null: 1.
  int64_t head_dim = 0;
  int64_t n_kv_heads = 0;
  void* k_pages = nullptr;
  void* v_pages = nullptr;
  bool shared_kv = false;
  bool k_as_v = false;
  const float* v_norm = nullptr;
  const float* out_scale = nullptr;
  // Qwen3.5 / Qwen3-Next. attn_gate: wqkv's rows end with a gate [n_heads * head_dim], the
  // attention output times its sigmoid. A shared expert beside the routed ones (mlp kMoe):
  // its gate/up [2 * shared_ffn, dim] and down [dim, shared_ffn], added times
  // sigmoid(shexp_gate . h) (shexp_gate float32 [dim]).
  bool attn_gate = false;
  QuantWeight shexp_gate_up;
  QuantWeight shexp_down;
  const float* shexp_gate = nullptr;
  // A Gated DeltaNet layer (mixer kRecurrent, shape LlamaDims::recurrent; attn_norm is its
  // input norm): its projections into the q, k, v channels [conv_dim, dim], the output gate z
  // [value_width, dim], beta and alpha [v_heads, dim] (each in its own format: a file may keep
  // the small ones wider); the conv [conv_dim, kernel], dt bias and A = -exp(A_log) [v_heads],
  // the gated norm [v_dim]; ssm_out [dim, value_width]. state_index: its place among the
  // recurrent layers in RecurrentState.
  QuantWeight ssm_qkv;
  QuantWeight ssm_z;
  QuantWeight ssm_beta;
  QuantWeight ssm_alpha;
  const float* ssm_conv = nullptr;
  const float* ssm_dt = nullptr;
  const float* ssm_a = nullptr;
  const float* ssm_norm = nullptr;
  QuantWeight ssm_out;
  int64_t state_index = 0;
  // Gemma 4's per-layer embeddings (LlamaDims::per_layer_dim D): after the MLP, the residual
  // gets ple_norm(ple_proj(gelu_tanh(ple_gate(x)) * the token's input for this layer)), with
  // ple_gate [D, dim] and ple_proj [dim, D] in blocks and ple_norm float32 [dim].
  bool per_layer_input = false;
  QuantWeight ple_gate;
  QuantWeight ple_proj;
  const float* ple_norm = nullptr;
};

// A Gated DeltaNet layer's shape (python/met/model/config.py RecurrentShape): value head j reads
// key head j % k_heads when tiled (llama.cpp's layout), else j / (v_heads / k_heads).
struct RecurrentDims {
  int64_t k_heads = 0;
  int64_t v_heads = 0;
  int64_t k_dim = 0;
  int64_t v_dim = 0;
  int64_t kernel = 0;
  bool tiled = false;
  int64_t conv_dim() const { return 2 * k_heads * k_dim + v_heads * v_dim; }
  int64_t value_width() const { return v_heads * v_dim; }
};

// The recurrent layers' state per sequence slot (python/met/model/deltanet.py RecurrentState,
// float32): conv [layers, slots, conv_dim, kernel - 1], delta [layers, slots, v_heads, k_dim,
// v_dim]; a verify row's state after each of its tokens in snap_conv / snap_delta [layers,
// slots, snap_depth, ...] (null, depth 0: none kept yet); checkpoints, one sequence's state as
// of some position each (a prefix cache resumes from them), in ckpt_conv / ckpt_delta
// [n_checkpoints, layers, ...] (null, 0: none).
struct RecurrentState {
  float* conv = nullptr;
  float* delta = nullptr;
  float* snap_conv = nullptr;
  float* snap_delta = nullptr;
  int64_t n_slots = 0;
  int64_t snap_depth = 0;
  float* ckpt_conv = nullptr;
  float* ckpt_delta = nullptr;
  int64_t n_checkpoints = 0;
};

constexpr int64_t kDeltaChunk = 64;  // tokens per chunk of a recurrent layer's prefill

struct LlamaDims {
  int64_t dim = 0;
  int64_t n_layers = 0;
  int64_t n_heads = 0;
  int64_t n_kv_heads = 0;
  int64_t head_dim = 0;
  int64_t ffn = 0;
  int64_t vocab = 0;
  float norm_eps = 1e-5f;
  int64_t max_positions = 0;  // rows of the RoPE tables
  int64_t num_blocks = 0;     // KV pool
  int64_t block_size = 0;
  bool kv_half = false;  // the pool holds fp16 K/V (llama.cpp's default: half the memory)
  // Mixture of experts (the layers whose mlp is kMoe): each token's top n_experts_used of the
  // router's softmax, their weights divided by their sum when moe_norm_topk (Qwen3-MoE, Mixtral).
  int64_t n_experts = 0;
  int64_t n_experts_used = 0;
  bool moe_norm_topk = true;
  // gpt-oss's routing: the top n_experts_used router logits, then a softmax over those (the
  // same numbers as softmax-then-renormalise; moe_norm_topk is not read).
  bool moe_topk_softmax = false;
  // gpt-oss's clamped SwiGLU in the experts (ops.h clamped_swiglu_row) with this limit and
  // alpha; limit 0: SiLU.
  float swiglu_limit = 0.0f;
  float swiglu_alpha = 1.702f;
  // Gemma: the attention score scale (0: 1 / sqrt(head_dim)), the final logits' tanh soft-cap
  // (0: none), the embeddings' scale and GeLU(tanh) instead of SiLU in the gated MLP.
  float attn_scale = 0.0f;
  float attn_softcap = 0.0f;  // Gemma 2: tanh soft-cap of attention scores (0: none)
  float final_softcap = 0.0f;
  float embed_scale = 1.0f;
  bool gelu = false;
  // Query temperature (Ministral 3): queries at position p scaled after RoPE by
  // 1 + attn_temp_scale * ln(1 + floor(p / attn_temp_length)); 0: none.
  double attn_temp_scale = 0.0;
  int64_t attn_temp_length = 0;
  // Partial RoPE (Qwen3.5): the first rope_dims of each head rotate (the model's tables are
  // [max_positions, rope_dims / 2]); 0: all of them.
  int64_t rope_dims = 0;
  int64_t shared_ffn = 0;     // the shared expert's width (LayerWeights::shexp_*)
  RecurrentDims recurrent;    // the Gated DeltaNet layers' shape (all zero: none)
  int64_t per_layer_dim = 0;  // Gemma 4's per-layer embeddings' width D (0: none)
};

struct LlamaWeights {
  QuantWeight embed;                   // blocks; or data null and embed_dense set
  const float* embed_dense = nullptr;  // [vocab, dim]
  QuantWeight lm_head;
  const float* norm = nullptr;
  std::vector<LayerWeights> layers;
  const float* rope_cos = nullptr;  // [max_positions, head_dim / 2]
  const float* rope_sin = nullptr;
  // Per-layer embeddings (LlamaDims::per_layer_dim D > 0): each token's inputs for every layer
  // are (ple_proj_norm per layer slice of ple_model_proj(embedded) / sqrt(dim) + its row of the
  // [vocab, n_layers * D] table (blocks, or ple_embed_dense) * sqrt(D)) / sqrt(2).
  QuantWeight ple_embed;
  const float* ple_embed_dense = nullptr;
  QuantWeight ple_model_proj;            // [n_layers * D, dim]
  const float* ple_proj_norm = nullptr;  // [D]
};

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

  // Greedy tokens of the last forward's logits rows (torch.argmax's choice: the first maximum,
  // or the first NaN), found while the rows are still in cache.
  const std::vector<int64_t>& argmax() const { return argmax_; }

  int n_threads() const { return n_threads_; }
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
  void mlp_block(const LayerWeights& w, int64_t n_tokens);
  // The MoE MLP (moe_forward.cpp): route each token, group the (token, expert) pairs by expert,
  // run each expert's matmuls over its rows, and sum each token's k outputs into delta_.
  void moe_block(const LayerWeights& w, int64_t n_tokens);
  void route_tokens(const LayerWeights& w, int64_t n_tokens);
  void topk_softmax(const float* logits, int64_t t);  // token t's experts and weights
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
  int64_t qkv_width_;    // the widest layer's Q/K/V row
  int64_t max_q_width_;  // and Q row
  int64_t max_kv_width_;
  int64_t max_k_;
  TeamBarrier barrier_;
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
