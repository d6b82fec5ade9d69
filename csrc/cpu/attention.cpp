// Work sharing, the choice of SIMD path and the portable path of paged_attention (attention.h).
#include "attention.h"

#include <algorithm>
#include <vector>

#include "attention_internal.h"

#define MET_ATTN_ITEM attend_item_portable
#include "attention_item.inc"
#undef MET_ATTN_ITEM

namespace met::cpu {

namespace detail {

int64_t attn_scratch_floats(const AttnShape& shape) {
  const int64_t group = shape.n_heads / shape.n_kv_heads;
  const int64_t padded = (shape.block_size + kLanes - 1) / kLanes * kLanes;
  return group * (2 * shape.head_dim + padded + 2);
}

std::vector<AttnPath> attention_paths() {
  std::vector<AttnPath> paths{{"portable", attend_item_portable}};
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) {
    paths.push_back({"avx2", attend_item_avx2});
  }
  if (__builtin_cpu_supports("avx512f")) paths.push_back({"avx512", attend_item_avx512});
#endif
  return paths;
}

void paged_attention_with(AttnItemFn item, const float* q, const float* k_cache,
                          const float* v_cache, float* out, const AttnRows& rows,
                          const AttnShape& shape) {
  // Grown once per thread, then reused by every call: no allocation on the hot path.
  thread_local std::vector<float> scratch;
  const size_t need = static_cast<size_t>(attn_scratch_floats(shape));
  if (scratch.size() < need) scratch.resize(need);
  float* const mine = scratch.data();

  const int32_t* cu = rows.cu_seqlens;
  const int64_t n_items = static_cast<int64_t>(cu[rows.n_rows]) * shape.n_kv_heads;
  // Items run from the last token back: within a prefill row the later (longer) queries go out
  // first, which evens out the causal imbalance under dynamic scheduling.
#ifdef _OPENMP
#pragma omp for schedule(dynamic)
#endif
  for (int64_t i = 0; i < n_items; ++i) {
    const int64_t item_index = n_items - 1 - i;
    const int64_t token = item_index / shape.n_kv_heads;
    const int64_t kv_head = item_index % shape.n_kv_heads;
    const int64_t row = std::upper_bound(cu, cu + rows.n_rows + 1, token) - cu - 1;
    const int64_t after = cu[row + 1] - token;  // this token and the row's later ones
    const int64_t n_keys = rows.seq_lens[row] - after + 1;
    item(q, k_cache, v_cache, out, shape, rows.block_tables + row * rows.table_stride, n_keys,
         token, kv_head, mine);
  }
}

}  // namespace detail

void paged_attention(const float* q, const float* k_cache, const float* v_cache, float* out,
                     const AttnRows& rows, const AttnShape& shape) {
  static const detail::AttnItemFn best = detail::attention_paths().back().fn;
  detail::paged_attention_with(best, q, k_cache, v_cache, out, rows, shape);
}

}  // namespace met::cpu
