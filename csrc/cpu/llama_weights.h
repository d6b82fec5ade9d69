// Owns: the C++ CPU forward's typed inputs (python/met/model/families plans each layer; these
//   structs say what the forward of llama_forward.h runs): the model's shape and settings, each
//   layer's kind and weights (GGUF blocks and float32 tensors by address), the recurrent layers'
//   state.
// Called by: csrc/cpu/llama_forward.h, csrc/bindings/cpu_weights.cpp, tests/cpp.
// Invariants: nothing here owns memory; the caller keeps every pointed-to tensor alive as long as
//   the forward built over it.
#pragma once

#include <cstdint>
#include <vector>

#include "cpu/quant_matmul.h"

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
// kDenseAndMoe: a dense MLP and routed experts side by side on the same residual (Gemma 4's MoE).
enum class Mlp : uint8_t { kDense, kMoe, kDenseAndMoe };

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
  // w_down: the float32 router [n_experts, dim] and each expert's gate/up [2 * f, dim] and down
  // [dim, f], f the experts' width (LlamaDims::expert_ffn, else ffn).
  const float* router = nullptr;
  std::vector<QuantWeight> expert_gate_up;
  std::vector<QuantWeight> expert_down;
  // Gemma 4 (mlp kDenseAndMoe, with both MLPs' weights): the dense MLP reads mlp_norm(x), the
  // experts moe_norm(x), the router rms_norm(x) * router_scale (float32 [dim]: the learned scale
  // over sqrt(dim)), for the residual x; the layer's MLP output is post_mlp_norm_1(dense) +
  // post_moe_norm(experts), which post_mlp_norm then normalizes as any layer's. expert_scale
  // [n_experts] multiplies each chosen expert's routing weight (after the top-k renormalisation);
  // null: 1.
  const float* moe_norm = nullptr;
  const float* post_mlp_norm_1 = nullptr;
  const float* post_moe_norm = nullptr;
  const float* router_scale = nullptr;
  const float* expert_scale = nullptr;
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
  // Mixture of experts (the layers whose mlp is kMoe or kDenseAndMoe): each token's top
  // n_experts_used of the router's softmax, their weights divided by their sum when moe_norm_topk
  // (Qwen3-MoE, Mixtral).
  int64_t n_experts = 0;
  int64_t n_experts_used = 0;
  bool moe_norm_topk = true;
  // gpt-oss's routing: the top n_experts_used router logits, then a softmax over those (the
  // same numbers as softmax-then-renormalise; moe_norm_topk is not read).
  bool moe_topk_softmax = false;
  // gpt-oss's clamped SwiGLU in the gated MLPs (ops.h clamped_swiglu_row; gpt-oss's are all
  // experts) with this limit and alpha; limit 0: SiLU (or GeLU, below).
  float swiglu_limit = 0.0f;
  float swiglu_alpha = 1.702f;
  // Gemma: the attention score scale (0: 1 / sqrt(head_dim)), the final logits' tanh soft-cap
  // (0: none), the embeddings' scale and GeLU(tanh) instead of SiLU in the gated MLPs (the
  // experts' too).
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
  int64_t expert_ffn = 0;     // the experts' width beside dense MLPs of ffn (Gemma 4); 0: ffn
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

}  // namespace met::cpu
