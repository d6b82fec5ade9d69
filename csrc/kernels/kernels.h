// Owns: the host-side entry points of met's CUDA kernels (declarations only).
// Called by: bindings/cuda.cpp (the _core.cuda functions) and nothing else; the torch side
// reaches them through python/met/kernels/cuda_ops.py.
// Invariants: every pointer is a device pointer to a contiguous array in the layout documented
// at each function; every launch goes on the given stream, never synchronizes and uses a grid
// that depends only on the size arguments, so each call is legal inside CUDA-graph capture.
// Errors in the arguments throw std::invalid_argument before anything is launched; a failed
// launch throws std::runtime_error with the CUDA error string.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "kernel_types.h"

namespace met::kernels {

// Attention of packed query rows against the paged cache (the current tokens' K/V must already
// be appended). Row b owns queries [cu_seqlens[b], cu_seqlens[b+1]) of q [T, n_heads, head_dim]
// and its context is seq_lens[b] tokens; query i of a row of q_len queries sits at position
// seq_lens[b] - q_len + i and attends to positions 0..itself (causal). A decode batch is the
// case q_len == 1 everywhere. A row with seq_lens[b] == 0 (graph padding) writes zeros.
struct AttentionArgs {
  void* out = nullptr;            // [T, n_heads, head_dim]
  const void* q = nullptr;        // [T, n_heads, head_dim], rows q_row_stride apart
  const void* k_cache = nullptr;  // one layer, KvLayout
  const void* v_cache = nullptr;
  const int32_t* block_tables = nullptr;  // [batch, max_blocks]
  const int32_t* seq_lens = nullptr;      // [batch]
  const int32_t* cu_seqlens = nullptr;    // [batch + 1]
  float* workspace = nullptr;  // attention_workspace_floats(...) floats; may be null if that is 0
  int32_t batch = 0;
  int32_t max_blocks = 0;
  int32_t n_heads = 0;
  int32_t max_query_len = 0;  // an upper bound of every row's query count (fixes the grid)
  int32_t max_seq_len = 0;    // an upper bound of every seq_lens[b] (fixes the split count)
  int64_t q_row_stride = 0;   // elements between tokens of q; 0: n_heads * head_dim
  float scale = 0.0f;         // softmax scale, usually 1/sqrt(head_dim)
  KvLayout kv;
  DType dtype = DType::kBF16;
};

// Floats of scratch paged_attention needs for these sizes (0 when no row is split).
size_t attention_workspace_floats(const AttentionArgs& a);
void paged_attention(const AttentionArgs& a, cudaStream_t stream);

// Writes k, v [n_tokens, n_kv_heads, head_dim] into the cache at flat slots
// slot_mapping[t] = block * block_size + offset; a negative slot skips the token (padding).
void kv_append(void* k_cache, void* v_cache, const void* k, const void* v,
               const int64_t* slot_mapping, int32_t n_tokens, int64_t src_row_stride,
               const KvLayout& kv, DType dtype, cudaStream_t stream);

// out[t] = x[t] / sqrt(mean(x[t]^2) + eps) * weight, rows of `hidden` elements.
void rms_norm(void* out, const void* x, const void* weight, int32_t n_tokens, int32_t hidden,
              float eps, DType dtype, cudaStream_t stream);

// Rotate-half RoPE in place on n_heads heads of each token row of x (row stride in elements,
// so Q and K inside a fused QKV row rotate in one call). cos/sin: float32 [max_positions,
// head_dim / 2]; positions: [n_tokens], each below max_positions.
void rope(void* x, const int64_t* positions, const float* cos, const float* sin, int32_t n_tokens,
          int32_t n_heads, int32_t head_dim, int64_t row_stride, DType dtype, cudaStream_t stream);

// out[t, i] = silu(x[t, i]) * x[t, ffn + i] for x [n_tokens, 2 * ffn] (gate then up).
void silu_mul(void* out, const void* x, int32_t n_tokens, int32_t ffn, DType dtype,
              cudaStream_t stream);

// out[r] = the first index of the largest logit of row r (float32 [rows, vocab]); NaN counts
// as the largest, as in torch.argmax.
void argmax(int32_t* out, const float* logits, int32_t rows, int32_t vocab, cudaStream_t stream);

// Per-row sampling parameters, device arrays of `rows` entries.
struct SampleArgs {
  int32_t* out = nullptr;
  const float* logits = nullptr;  // [rows, vocab] float32
  const float* temperature = nullptr;
  const int32_t* top_k = nullptr;  // <= 0: off
  const float* top_p = nullptr;    // >= 1: off
  const float* min_p = nullptr;    // <= 0: off
  const uint64_t* seed = nullptr;
  const uint64_t* step = nullptr;  // the row's output count: a new draw every step
  int32_t rows = 0;
  int32_t vocab = 0;
};

// met's draw (the host's is cpu/sampling.h, whose semantics python/met/model/sampler.py ends in):
// temperature, top-k, top-p on what top-k kept, min-p, then the argmax of the scaled logit plus
// Gumbel noise from sample_hash.h keyed by (seed, step, token); ties at the top-k or top-p
// boundary are all kept. Temperature <= 0 or top_k == 1 is greedy. NaN logits are never drawn.
void sample(const SampleArgs& a, cudaStream_t stream);

}  // namespace met::kernels
