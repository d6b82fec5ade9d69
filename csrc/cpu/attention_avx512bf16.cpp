// paged_attention's AVX-512 path with VDPBF16PS for the products (CPUs with avx512_bf16);
// CMake compiles this file alone with those -m flags.
#define MET_ATTN_ITEM attend_item_avx512bf16
#include "attention_item.inc"
