// quant_matmul's AVX-512 VNNI path: the columns kernel of quant_matmul_columns.inc for every M
// (one exact int32 per row, column and block from 512-bit VPDPBUSD, 16 columns in the lanes),
// the same dots and epilogue as the amx path's tiles, so the two paths give a row the same bits.
// CMake compiles this file alone with the AVX-512 flags. Activation quantization stays on the
// AVX2 code, which is the same here.
#include <immintrin.h>

#include <cstdint>
#include <cstring>
#include <new>

#include "quant_matmul_internal.h"

#if defined(__GNUC__) && !defined(__clang__)
// GCC 12 reports its own _mm512_undefined_* placeholders inside the AVX-512 intrinsics.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#endif

namespace met::cpu::detail {

namespace {

#include "quant_matmul_columns.inc"

}  // namespace

void matmul_rows_avx512vnni(const QuantActs& acts, const uint8_t* w, float* y, int64_t m, int64_t n,
                            int64_t k, QType q, int64_t n_begin, int64_t n_end) {
  switch (q) {
    case QType::kQ8_0:
      return vnni_columns<QType::kQ8_0>(acts, w, y, m, n, k, n_begin, n_end);
    case QType::kQ4_0:
      return vnni_columns<QType::kQ4_0>(acts, w, y, m, n, k, n_begin, n_end);
    case QType::kQ4_1:
      return vnni_columns<QType::kQ4_1>(acts, w, y, m, n, k, n_begin, n_end);
    case QType::kMxfp4:
      return vnni_columns<QType::kMxfp4>(acts, w, y, m, n, k, n_begin, n_end);
    case QType::kQ4_K:
      return vnni_columns<QType::kQ4_K>(acts, w, y, m, n, k, n_begin, n_end);
    case QType::kQ5_0:
      return vnni_columns<QType::kQ5_0>(acts, w, y, m, n, k, n_begin, n_end);
    case QType::kQ6_K:
      return vnni_columns<QType::kQ6_K>(acts, w, y, m, n, k, n_begin, n_end);
    case QType::kQ5_1:
      return vnni_columns<QType::kQ5_1>(acts, w, y, m, n, k, n_begin, n_end);
    case QType::kQ5_K:
      return vnni_columns<QType::kQ5_K>(acts, w, y, m, n, k, n_begin, n_end);
    case QType::kIq4Nl:
      return vnni_columns<QType::kIq4Nl>(acts, w, y, m, n, k, n_begin, n_end);
    case QType::kIq4Xs:
      return vnni_columns<QType::kIq4Xs>(acts, w, y, m, n, k, n_begin, n_end);
    case QType::kQ3_K:
      return vnni_columns<QType::kQ3_K>(acts, w, y, m, n, k, n_begin, n_end);
    case QType::kQ2_K:
      return vnni_columns<QType::kQ2_K>(acts, w, y, m, n, k, n_begin, n_end);
  }
}

}  // namespace met::cpu::detail
