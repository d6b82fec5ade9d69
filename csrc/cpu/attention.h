// Owns: causal paged attention over one layer's KV pool on the CPU (fp32 or fp16 K/V; decode rows
//   and prefill chunks in one packed batch, grouped-query heads), with no torch and no allocation
//   per call.
// Called by: the C++ model layer loop, csrc/bindings/cpu_kernels.cpp (_core.cpu.paged_attention)
//   and tests/cpp/test_cpu_attention.cc.
// Invariants: batch invariant bit for bit: a query's output depends only on its own q, its
//   position and the keys/values it attends to (never on the other rows, on its row's q_len or on
//   the thread that ran it): each (query, head) row runs in a SIMD lane of its own over key tiles
//   of fixed positions with a running max and sum (attention_item.inc). Scores are fp32; values
//   and softmax weights are rounded to bf16 and their products summed in fp32 (VDPBF16PS where
//   the CPU has avx512_bf16), in one order on every SIMD path, so every path gives the same bits.
//   fp16 K/V are widened to fp32 exactly, so an fp16 pool gives the bits an fp32 pool holding the
//   same values gives. Nothing is validated here: the caller guarantees the shapes, block tables
//   and that n_heads is a multiple of n_kv_heads.
#pragma once

#include <cstdint>

namespace met::cpu {

struct AttnRows {
  int64_t n_rows;
  const int32_t* cu_seqlens;    // [n_rows + 1] packed index of each row's first query token
  const int32_t* seq_lens;      // [n_rows] context length of the row INCLUDING this step's tokens
  const int32_t* block_tables;  // [n_rows, table_stride] block ids
  int64_t table_stride;
};

struct AttnShape {
  int64_t n_heads, n_kv_heads, head_dim, block_size;
  float scale;           // usually 1/sqrt(head_dim)
  bool kv_half = false;  // the pool holds IEEE fp16 (uint16_t) K/V instead of fp32
  // Sliding window: a query at position p attends to keys max(0, p - window + 1) .. p only
  // (window counts the query's own key); 0 attends to the whole context. Blocks wholly before
  // every window of a row are never read, nor are their block_tables entries.
  int64_t window = 0;
  // Gemma 2: scores (after `scale`) squashed to softcap * tanh(score / softcap) before the
  // softmax; 0: none.
  float softcap = 0.0f;
  // gpt-oss's attention sinks: [n_heads] logits (before `scale`'s units: raw) that join each
  // head's softmax denominator with no value, so a row's weights sum to less than 1; nullptr:
  // none.
  const float* sinks = nullptr;
};

// q: [T, n_heads, head_dim] fp32 (T = cu_seqlens[n_rows]); k_cache, v_cache: ONE layer's pool,
// [num_blocks, block_size, n_kv_heads, head_dim] fp32 (fp16 with shape.kv_half), already
// holding this step's K/V;
// out: [T, n_heads * head_dim] fp32.
// Row b's q_len = cu[b+1]-cu[b] queries sit at positions seq_lens[b]-q_len .. seq_lens[b]-1 and
// attend causally to keys 0..their own position (the last shape.window of them when it is set);
// key position p lives in block
// block_tables[b*stride + p/block_size], offset p % block_size.
// Work-shares with an orphaned `#pragma omp for` so it can be called from INSIDE an enclosing
// `#pragma omp parallel` region (all threads of the team must call it) or outside one (serial).
// Inside a team it returns without a barrier: the caller synchronizes before reading `out`.
void paged_attention(const float* q, const void* k_cache, const void* v_cache, float* out,
                     const AttnRows& rows, const AttnShape& shape);

}  // namespace met::cpu
