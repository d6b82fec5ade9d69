// Owns: the contract between quant_matmul.cpp (dispatch, threads, scalar path) and the per-ISA
//   translation units, which are compiled with their own -m flags and so share no inline code
//   with the rest of the build (only plain data, extern "C++" functions and the internal-linkage
//   helpers below cross this header).
// Called by: quant_matmul.cpp, quant_matmul_avx2.cpp, quant_matmul_avx512.cpp,
//   quant_matmul_amx.cpp and quant_matmul_amx_emulated.cpp.
// Invariants: QuantActs rows are K / 32 blocks (a K-quant super-block's eight 32-element
//   sub-blocks are eight of them); qs holds M * K int8, scale and scaled_sum hold M * K / 32
//   floats each; scaled_sum = scale * sum(qs of the block), which turns the Q4 formats'
//   constant term (-8 * d or m) into one multiply per block.
#pragma once

#include <cstdint>
#include <cstring>

#include "quant_matmul.h"

namespace met::cpu::detail {

// Per-format constants the kernels specialize on: bytes of one block of the file, the 32-element
// blocks it holds, whether the quants are signed integers (Q8_0, MXFP4, IQ4_NL, IQ4_XS, Q3_K, Q6_K:
// w = q * d, no constant term) and whether a block has a float min m (Q4_1, Q5_1, Q4_K, Q5_K:
// w = q * d + m).
template <QType Q>
constexpr int64_t kFileBlockBytes = Q == QType::kQ8_0    ? 34
                                    : Q == QType::kQ4_0  ? 18
                                    : Q == QType::kQ4_1  ? 20
                                    : Q == QType::kMxfp4 ? 17
                                    : Q == QType::kQ5_0  ? 22
                                    : Q == QType::kQ5_1  ? 24
                                    : Q == QType::kIq4Nl ? 18
                                    : Q == QType::kQ4_K  ? 144
                                    : Q == QType::kQ5_K  ? 176
                                    : Q == QType::kIq4Xs ? 136
                                    : Q == QType::kQ3_K  ? 110
                                    : Q == QType::kQ2_K  ? 84
                                                         : 210;
template <QType Q>
constexpr int64_t kSubBlocks = Q == QType::kQ2_K || Q == QType::kQ3_K || Q == QType::kQ4_K ||
                                       Q == QType::kQ5_K || Q == QType::kQ6_K || Q == QType::kIq4Xs
                                   ? 8
                                   : 1;
template <QType Q>
constexpr bool kSignedQuants = Q == QType::kQ8_0 || Q == QType::kMxfp4 || Q == QType::kQ6_K ||
                               Q == QType::kQ3_K || Q == QType::kIq4Nl || Q == QType::kIq4Xs;
// Q6_K and Q3_K: two integer scales per 32-element block, one per 16 elements, applied to the
// integer dots.
template <QType Q>
constexpr bool kHalfScales = Q == QType::kQ6_K || Q == QType::kQ3_K || Q == QType::kQ2_K;
// Q2_K: a min per 16 elements too, its term the second exact int32 min_0 * sum_0 + min_1 * sum_1
// of the activations, times the block's m = -dmin.
template <QType Q>
constexpr bool kHalfMins = Q == QType::kQ2_K;
// Also for code that takes the format at run time (the scalar path).
constexpr bool has_min(QType q) {
  return q == QType::kQ4_1 || q == QType::kQ5_1 || q == QType::kQ4_K || q == QType::kQ5_K;
}
template <QType Q>
constexpr bool kHasMin = has_min(Q);
template <QType Q>
constexpr int64_t row_bytes_of(int64_t nb) {
  return nb / kSubBlocks<Q> * kFileBlockBytes<Q>;
}

// ggml's kvalues_mxfp4: the E2M1 values doubled, so they are integers.
constexpr int8_t kMxfp4Values[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};
// ggml's kvalues_iq4nl: IQ4_NL's and IQ4_XS's 16 non-linear levels, int8 as the file means them.
constexpr int8_t kIq4NlValues[16] = {-127, -104, -83, -65, -49, -35, -22, -10,
                                     1,    13,   25,  38,  53,  69,  89,  113};

// The helpers below are compiled into each per-ISA file on its own (internal linkage), so no copy
// built with one file's -m flags can stand in for another's.
namespace {

// ggml's GGML_E8M0_TO_FP32_HALF: 2^(e - 128), the half that the doubled values take back; e < 2
// gives the float subnormals 2^-128 and 2^-127.
inline float e8m0_half(uint8_t e) {
  const uint32_t bits = e < 2 ? 0x00200000u << e : static_cast<uint32_t>(e - 1) << 23;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

// The 6-bit scale and min of sub-block j (0..7) from a Q4_K super-block's 12 packed bytes
// (ggml's get_scale_min_k4).
inline void q4_k_scale_min(const uint8_t* packed, int j, int* scale, int* min) {
  if (j < 4) {
    *scale = packed[j] & 63;
    *min = packed[j + 4] & 63;
  } else {
    *scale = (packed[j + 4] & 0x0F) | ((packed[j - 4] >> 6) << 4);
    *min = (packed[j + 4] >> 4) | ((packed[j] >> 6) << 4);
  }
}

// IQ4_XS sub-block j's (0..7) scale as ggml reads it: 4 low bits from nibble j of the 4 bytes
// scales_l, 2 high bits from bits 2j, 2j + 1 of the 16-bit scales_h, minus 32.
inline int iq4_xs_scale(const uint8_t* super, int j) {
  const int high = (super[2 + j / 4] >> (2 * (j % 4))) & 3;
  const int low = (super[4 + j / 2] >> (4 * (j % 2))) & 0x0F;
  return (low | (high << 4)) - 32;
}

// Q3_K's 16-element sub-block i (0..15) scale as ggml unpacks its 12 bytes: 4 low bits from
// nibble i / 8 of byte i % 8, 2 high bits from bits 2(i / 4), +1 of byte 8 + i % 4, minus 32.
inline int q3_k_scale(const uint8_t* scales, int i) {
  const int low = (scales[i % 8] >> (4 * (i / 8))) & 0x0F;
  const int high = (scales[8 + i % 4] >> (2 * (i / 4))) & 3;
  return (low | (high << 4)) - 32;
}

}  // namespace

// Block b (32 elements) of a row, as quant_blocks.cpp reads it: its quants as integers in element
// order and its float d and m, so that w = q * d + m (m = 0 for the signed formats, Q4_0 and Q5_0;
// Q4_0's and Q5_0's offsets of 8 and 16 stay in q, their callers subtract them). Q6_K's, Q3_K's
// and Q2_K's two 16-element sub-blocks have their own integer scales (`half`, 1 for the other
// formats); Q2_K's m is -dmin, times `half_min`.
struct Block {
  int32_t q[kBlock];
  float d, m;
  int32_t half[2];
  int32_t half_min[2];  // Q2_K's 4-bit mins of the two halves (0 for the other formats)
};
void read_block(QType q, const uint8_t* row, int64_t b, Block* out);
// The offset Q4_0 and Q5_0 store their quants with (8, 16; else 0).
int32_t quant_offset(QType q);

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
