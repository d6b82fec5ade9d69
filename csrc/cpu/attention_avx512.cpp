// paged_attention's AVX-512F path (zmm registers); CMake compiles this file alone with those
// -m flags.
#define MET_ATTN_ITEM attend_item_avx512
#include "attention_item.inc"
