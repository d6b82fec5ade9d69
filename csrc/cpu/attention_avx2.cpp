// paged_attention's AVX2 + FMA path; CMake compiles this file alone with those -m flags.
#define MET_ATTN_ITEM attend_item_avx2
#include "attention_item.inc"
