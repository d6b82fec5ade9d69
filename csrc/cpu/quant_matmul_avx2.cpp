// quant_matmul's AVX2 + FMA + F16C path; CMake compiles this file alone with those -m flags.
#define MET_QMM_MATMUL matmul_rows_avx2
#define MET_QMM_QUANTIZE quantize_rows_avx2
#include "quant_matmul_x86.inc"
