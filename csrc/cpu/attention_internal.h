// Owns: the contract between attention.cpp (work sharing, path choice) and the per-ISA
//   translation units that compile attention_item.inc with their own -m flags.
// Called by: attention.cpp, attention_avx2.cpp, attention_avx512.cpp and
//   tests/cpp/test_cpu_attention.cc (which checks every path the CPU can run).
// Invariants: an AttnItemFn computes one tile from its own arguments alone, each query's bits
//   independent of the tile around it; scratch holds at least attn_scratch_floats(shape) floats
//   owned by the calling thread.
#pragma once

#include <cstdint>
#include <vector>

#include "attention.h"
#include "isa.h"

namespace met::cpu::detail {

// An item's rows are (query, head) pairs of consecutive queries of one batch row and the heads of
// one kv head's group, so that each key/value tile is packed once for all of them; every row
// still performs exactly the arithmetic it performs alone. An item takes at most
// max(kAttnRows, group) rows: attn_tile_queries(shape) queries with all the group's heads.
constexpr int64_t kAttnRows = 96;
// Keys per softmax tile; tiles start at multiples of kKeyTile positions.
constexpr int64_t kKeyTile = 64;
// Floats of scratch reserved for each group's bookkeeping (attention_item.inc's Group).
constexpr int64_t kGroupFloats = 16;

// Queries token .. token + n_queries - 1 (n_queries <= attn_tile_queries) of one row, the t-th
// attending to keys 0 .. n_keys + t - 1 (blocks in `table`; the last shape.window of them when
// set), for query heads head_begin .. head_end - 1 of the group that shares kv head `kv_head`
// (0 .. n_heads / n_kv_heads).
struct AttnTile {
  const int32_t* table;
  int64_t token, n_queries, n_keys, kv_head, head_begin, head_end;
};

using AttnItemFn = void (*)(const float* q, const void* k_cache, const void* v_cache, float* out,
                            const AttnShape& shape, const AttnTile& tile, float* scratch);

void attend_item_portable(const float* q, const void* k_cache, const void* v_cache, float* out,
                          const AttnShape& shape, const AttnTile& tile, float* scratch);
#if defined(__x86_64__) || defined(_M_X64)
void attend_item_avx2(const float* q, const void* k_cache, const void* v_cache, float* out,
                      const AttnShape& shape, const AttnTile& tile, float* scratch);
void attend_item_avx512(const float* q, const void* k_cache, const void* v_cache, float* out,
                        const AttnShape& shape, const AttnTile& tile, float* scratch);
// VDPBF16PS for the products (the avx512 path where the CPU has avx512_bf16): the same bits as
// attend_item_avx512's emulation.
void attend_item_avx512bf16(const float* q, const void* k_cache, const void* v_cache, float* out,
                            const AttnShape& shape, const AttnTile& tile, float* scratch);
#endif

// Queries per item of a prefill row.
int64_t attn_tile_queries(const AttnShape& shape);
int64_t attn_scratch_floats(const AttnShape& shape);

struct AttnPath {
  const char* name;
  AttnItemFn fn;
};
// The paths this CPU can run, fastest last.
std::vector<AttnPath> attention_paths();
// The item function a kernel path takes (its best one at or below the path); paged_attention
// uses the active path's.
AttnItemFn attention_item_for(CpuPath path);

// paged_attention with the item function chosen by the caller.
void paged_attention_with(AttnItemFn item, const float* q, const void* k_cache, const void* v_cache,
                          float* out, const AttnRows& rows, const AttnShape& shape);

}  // namespace met::cpu::detail
