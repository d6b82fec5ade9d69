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

int64_t attn_tile_queries(const AttnShape& shape) {
  const int64_t group = shape.n_heads / shape.n_kv_heads;
  return std::max<int64_t>(1, kAttnRows / group);
}

int64_t attn_scratch_floats(const AttnShape& shape) {
  const int64_t group = shape.n_heads / shape.n_kv_heads;
  const int64_t rows = attn_tile_queries(shape) * group;
  int64_t most = 0;
  // Each path's lane count (attention_item.inc): 4, 8 or 16 rows to a group.
  for (const int64_t lanes : {4, 8, 16}) {
    const int64_t n_groups = (rows + lanes - 1) / lanes;
    const int64_t dim = (shape.head_dim + lanes - 1) / lanes * lanes;
    // Per group: queries, output, max, sum, positions and its bookkeeping; then one key tile,
    // one value tile, the tile's scores and weights and two widened fp16 rows, each rounded up
    // to whole lanes.
    const int64_t group_floats = (kGroupFloats + lanes - 1) / lanes * lanes;
    const int64_t per_group = 2 * dim * lanes + 3 * lanes + group_floats;
    most = std::max(
        most, n_groups * per_group + 2 * kKeyTile * dim + 2 * kKeyTile * lanes + 2 * dim + lanes);
  }
  // The SIMD paths' decode item (attention_decode.inc): per head its query, output, max and sum.
  const int64_t decode = 2 * group * shape.head_dim + 2 * group;
  return std::max(most, decode);
}

std::vector<AttnPath> attention_paths() {
  std::vector<AttnPath> paths{{"portable", attend_item_portable}};
#if defined(__x86_64__) || defined(_M_X64)
  if (path_supported(CpuPath::kAvx2)) paths.push_back({"avx2", attend_item_avx2});
  if (path_supported(CpuPath::kAvx512)) paths.push_back({"avx512", attend_item_avx512});
  if (path_supported(CpuPath::kAvx512) && cpu_features().avx512bf16) {
    paths.push_back({"avx512bf16", attend_item_avx512bf16});
  }
#endif
  return paths;
}

AttnItemFn attention_item_for(CpuPath path) {
#if defined(__x86_64__) || defined(_M_X64)
  if (path == CpuPath::kAvx2) return attend_item_avx2;
  if (path == CpuPath::kAvx512 || path == CpuPath::kAmx) {
    return cpu_features().avx512bf16 ? attend_item_avx512bf16 : attend_item_avx512;
  }
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
  const int64_t tile_queries = attn_tile_queries(shape);
  first_tile[0] = 0;
  for (int64_t b = 0; b < rows.n_rows; ++b) {
    first_tile[b + 1] = first_tile[b] + (cu[b + 1] - cu[b] + tile_queries - 1) / tile_queries;
  }
  const int64_t group = shape.n_heads / shape.n_kv_heads;
  // An item takes the whole group: its heads share the packed key tiles and fill SIMD lanes that
  // a head alone would leave empty (a decode row's item has `group` rows).
  const int64_t per_tile = shape.n_kv_heads;
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
    const int64_t offset = (tile_index - tiles[row]) * tile_queries;  // within the row
    AttnTile tile;
    tile.table = rows.block_tables + row * rows.table_stride;
    tile.token = cu[row] + offset;
    tile.n_queries = std::min<int64_t>(tile_queries, q_len - offset);
    tile.n_keys = rows.seq_lens[row] - q_len + offset + 1;
    tile.kv_head = part;
    tile.head_begin = 0;
    tile.head_end = group;
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
