// Work sharing, the choice of SIMD path and the portable path of paged_attention (attention.h).
#include "attention.h"

#include <algorithm>
#include <vector>

#ifdef _OPENMP
#include <omp.h>
#endif

#include "attention_internal.h"

#define MET_ATTN_ITEM attend_item_portable
#include "attention_item.inc"
#undef MET_ATTN_ITEM

namespace met::cpu {

namespace detail {

int64_t attn_scratch_floats(const AttnShape& shape) {
  const int64_t group = shape.n_heads / shape.n_kv_heads;
  const int64_t padded = (shape.block_size + kLanes - 1) / kLanes * kLanes;
  // With an fp16 pool, one block's K and V widened to fp32.
  const int64_t widened = shape.kv_half ? 2 * shape.block_size * shape.head_dim : 0;
  return kAttnTile * group * (2 * shape.head_dim + padded + 2) + widened;
}

std::vector<AttnPath> attention_paths() {
  std::vector<AttnPath> paths{{"portable", attend_item_portable}};
#if defined(__x86_64__) || defined(_M_X64)
  if (path_supported(CpuPath::kAvx2)) paths.push_back({"avx2", attend_item_avx2});
  if (path_supported(CpuPath::kAvx512)) paths.push_back({"avx512", attend_item_avx512});
#endif
  return paths;
}

AttnItemFn attention_item_for(CpuPath path) {
#if defined(__x86_64__) || defined(_M_X64)
  if (path == CpuPath::kAvx2) return attend_item_avx2;
  if (path == CpuPath::kAvx512 || path == CpuPath::kAmx) return attend_item_avx512;
#endif
  (void)path;
  return attend_item_portable;
}

void paged_attention_with(AttnItemFn item, const float* q, const void* k_cache, const void* v_cache,
                          float* out, const AttnRows& rows, const AttnShape& shape) {
  // Grown once per thread, then reused by every call: no allocation on the hot path.
  thread_local std::vector<float> scratch;
  thread_local std::vector<int64_t> first_tile;  // per row, then the total
  const size_t need = static_cast<size_t>(attn_scratch_floats(shape));
  if (scratch.size() < need) scratch.resize(need);
  if (first_tile.size() < static_cast<size_t>(rows.n_rows + 1)) first_tile.resize(rows.n_rows + 1);
  float* const mine = scratch.data();

  const int32_t* cu = rows.cu_seqlens;
  const int64_t* tiles = first_tile.data();
  first_tile[0] = 0;
  for (int64_t b = 0; b < rows.n_rows; ++b) {
    first_tile[b + 1] = first_tile[b] + (cu[b + 1] - cu[b] + kAttnTile - 1) / kAttnTile;
  }
  const int64_t group = shape.n_heads / shape.n_kv_heads;
  int threads = 1;
#ifdef _OPENMP
  threads = omp_get_num_threads();
#endif
  // Too few tiles to keep the team busy (a few decode rows): one item per query head instead of
  // per kv head. A head's arithmetic never depends on the other heads of its group.
  const int64_t head_parts =
      tiles[rows.n_rows] * shape.n_kv_heads < 4 * static_cast<int64_t>(threads) ? group : 1;
  const int64_t heads_per_item = group / head_parts;
  const int64_t per_tile = shape.n_kv_heads * head_parts;
  const int64_t n_items = tiles[rows.n_rows] * per_tile;
  // Items run from the last tile back: within a prefill row the later (longer) queries go out
  // first, which evens out the causal imbalance under dynamic scheduling.
#ifdef _OPENMP
#pragma omp for schedule(dynamic) nowait
#endif
  for (int64_t i = 0; i < n_items; ++i) {
    const int64_t item_index = n_items - 1 - i;
    const int64_t tile_index = item_index / per_tile;
    const int64_t part = item_index % per_tile;
    const int64_t row = std::upper_bound(tiles, tiles + rows.n_rows + 1, tile_index) - tiles - 1;
    const int64_t q_len = cu[row + 1] - cu[row];
    const int64_t offset = (tile_index - tiles[row]) * kAttnTile;  // within the row
    AttnTile tile;
    tile.table = rows.block_tables + row * rows.table_stride;
    tile.token = cu[row] + offset;
    tile.n_queries = std::min<int64_t>(kAttnTile, q_len - offset);
    tile.n_keys = rows.seq_lens[row] - q_len + offset + 1;
    tile.kv_head = part / head_parts;
    tile.head_begin = part % head_parts * heads_per_item;
    tile.head_end = tile.head_begin + heads_per_item;
    item(q, k_cache, v_cache, out, shape, tile, mine);
  }
}

}  // namespace detail

void paged_attention(const float* q, const void* k_cache, const void* v_cache, float* out,
                     const AttnRows& rows, const AttnShape& shape) {
  detail::paged_attention_with(detail::attention_item_for(active_path()), q, k_cache, v_cache, out,
                               rows, shape);
}

}  // namespace met::cpu
