// quant_matmul's AVX-512 VNNI path (256-bit vpdpbusd, AVX512VL); CMake compiles this file alone
// with those -m flags. Activation quantization stays on the AVX2 code, which is the same here.
#define MET_QMM_MATMUL matmul_rows_avx512vnni
#include "quant_matmul_x86.inc"
