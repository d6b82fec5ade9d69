// Owns: the contract between quant_matmul.cpp (dispatch, threads, scalar path) and the per-ISA
//   translation units, which are compiled with their own -m flags and so share no inline code
//   with the rest of the build (only plain data and extern "C++" functions cross this header).
// Called by: quant_matmul.cpp, quant_matmul_avx2.cpp, quant_matmul_avx512.cpp,
//   quant_matmul_amx.cpp and quant_matmul_amx_emulated.cpp.
// Invariants: QuantActs rows are K / 32 blocks; qs holds M * K int8, scale and scaled_sum hold
//   M * K / 32 floats each; scaled_sum = scale * sum(qs of the block), which turns the Q4 formats'
//   constant term (-8 * d or m) into one multiply per block.
#pragma once

#include <cstdint>

#include "quant_matmul.h"

namespace met::cpu::detail {

struct QuantActs {
  int8_t* qs;
  float* scale;
  float* scaled_sum;
};

// Rows [row_begin, row_end) of x into acts.
using QuantizeFn = void (*)(const float* x, int64_t k, int64_t row_begin, int64_t row_end,
                            QuantActs acts);
// Output columns [n_begin, n_end) for all M rows.
using MatmulFn = void (*)(const QuantActs& acts, const uint8_t* w, float* y, int64_t m, int64_t n,
                          int64_t k, QType q, int64_t n_begin, int64_t n_end);

// The calling thread's scratch floats, at least `count` of them, kept and grown to the largest
// count the thread asked for. Defined in quant_matmul.cpp (portable): a std::vector in a per-ISA
// file would instantiate inline members under its -m flags, and the linker keeps one copy of
// those for the whole library.
float* thread_scratch_floats(int64_t count);

void quantize_rows_scalar(const float* x, int64_t k, int64_t row_begin, int64_t row_end,
                          QuantActs acts);
void matmul_rows_scalar(const QuantActs& acts, const uint8_t* w, float* y, int64_t m, int64_t n,
                        int64_t k, QType q, int64_t n_begin, int64_t n_end);

#if defined(__x86_64__) || defined(_M_X64)
void quantize_rows_avx2(const float* x, int64_t k, int64_t row_begin, int64_t row_end,
                        QuantActs acts);
void matmul_rows_avx2(const QuantActs& acts, const uint8_t* w, float* y, int64_t m, int64_t n,
                      int64_t k, QType q, int64_t n_begin, int64_t n_end);
void matmul_rows_avx512vnni(const QuantActs& acts, const uint8_t* w, float* y, int64_t m, int64_t n,
                            int64_t k, QType q, int64_t n_begin, int64_t n_end);
// Bit for bit matmul_rows_avx512vnni (the same dots and epilogue, quant_matmul_amx.inc over
// quant_matmul_columns.inc); the emulated one runs the same code
// on scalar tile arithmetic, for tests.
void matmul_rows_amx_emulated(const QuantActs& acts, const uint8_t* w, float* y, int64_t m,
                              int64_t n, int64_t k, QType q, int64_t n_begin, int64_t n_end);
#ifdef MET_QMM_HAS_AMX
void matmul_rows_amx(const QuantActs& acts, const uint8_t* w, float* y, int64_t m, int64_t n,
                     int64_t k, QType q, int64_t n_begin, int64_t n_end);
#endif
#endif

}  // namespace met::cpu::detail
