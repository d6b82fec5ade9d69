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

// Consecutive queries of one batch row run as one tile so that each key/value block is read once
// for all of them; every query still performs exactly the arithmetic it performs alone.
constexpr int64_t kAttnTile = 8;

// Queries token .. token + n_queries - 1 (n_queries <= kAttnTile) of one row, the t-th attending
// to keys 0 .. n_keys + t - 1 (blocks in `table`), for query heads head_begin .. head_end - 1 of
// the group that shares kv head `kv_head` (0 .. n_heads / n_kv_heads).
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
#endif

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
