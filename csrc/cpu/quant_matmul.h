// Owns: y[M, N] = x[M, K] @ W[N, K]^T on the CPU with W kept in GGUF block layout (Q8_0, Q4_0,
//   Q4_1, Q5_0, Q5_1, MXFP4, IQ4_NL, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K and IQ4_XS, read as stored), the
//   dispatch between the scalar, AVX2, AVX-512 VNNI and AMX-INT8 paths, and the OpenMP threads.
// Called by: csrc/bindings/cpu_kernels.cpp (python/met/kernels/cpu_quant.py's QuantLinear) and
//   tests/cpp/test_quant_matmul.cc and test_quant_layout.cc.
// Invariants: K is a multiple of the format's block (32; 256 for the K-quants' and IQ4_XS's
//   super-blocks); each of W's N rows is its contiguous blocks, rows packed back to back (exactly a
//   GGUF tensor's bytes); x and y are dense row-major fp32. Activations are quantized to int8 per
//   32-element block (scale max|x| / 127) before the integer dot products, so the result
//   differs from a float dot product by about 1e-3 relative. Every path quantizes
//   activations identically. The scalar, AVX-512 VNNI and AMX-INT8 paths agree bit for bit: each
//   makes one exact int32 per (row, column, block) (quant_matmul_columns.inc; tiles from
//   amx_min_rows rows on the amx path) and runs one float epilogue in block order
//   (matmul_rows_scalar spells it out). AVX2 sums the same integer dots in another float order.
//   Every path gives a row the same bits whatever the other rows of the batch (batch invariance).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "half.h"
#include "isa.h"

namespace met::cpu {

// Every format is read per 32-element block w = q * d (+ m) (Q4_0 and Q5_0 with their offsets of
// 8 and 16 in q; Q5_1 is Q4_1 with a fifth bit): MXFP4's d is its E8M0 scale halved (its E2M1
// quants are doubled to integers, as ggml's kvalues_mxfp4); IQ4_NL's q are ggml's int8
// kvalues_iq4nl looked up by nibble. A Q4_K (Q5_K: with a fifth bit) super-block's eight
// 32-element sub-blocks have d = d * scale and m = -dmin * min from their 6-bit scales and mins;
// an IQ4_XS super-block's eight have d = d * (scale - 32) from 6-bit scales and IQ4_NL's values.
// A Q6_K (Q3_K) super-block's 32-element blocks hold two 16-element halves each with its own int8
// (6-bit, minus 32) scale: their exact dot is scale_0 * dot(first 16) + scale_1 * dot(last 16),
// one int32, with d the super-block's fp16. Q2_K's halves have a 4-bit scale and a 4-bit min
// each: w = d * scale * q - dmin * min, so a block's dot is two exact int32, scale_0 * dot_0 +
// scale_1 * dot_1 (times d) and min_0 * sum_0 + min_1 * sum_1 of the activations (times -dmin).
enum class QType : int32_t {
  kQ8_0 = 0,
  kQ4_0 = 1,
  kQ4_1 = 2,
  kMxfp4 = 3,
  kQ4_K = 4,
  kQ5_0 = 5,
  kQ6_K = 6,
  kQ5_1 = 7,
  kQ5_K = 8,
  kIq4Nl = 9,
  kIq4Xs = 10,
  kQ3_K = 11,
  kQ2_K = 12
};

// kAuto takes the active CpuPath's kernel (isa.h: MET_CPU_ISA, else the best this CPU has).
// kAmxInt8 takes AMX tiles for M >= amx_min_rows() and AVX-512 VNNI registers below, both with
// one exact int32 per (row, column, block) and one epilogue; kAmxEmulated is the same with the
// tile instructions emulated in scalar code (tests, on CPUs without AMX).
enum class Isa : int32_t {
  kAuto = 0,
  kScalar = 1,
  kAvx2 = 2,
  kAvx512Vnni = 3,
  kAmxInt8 = 4,
  kAmxEmulated = 5
};

constexpr int64_t kBlock = 32;

// Rows from which the amx kernels take tiles: a 16-row tile is full from there; below it the
// same exact dots come from AVX-512 VNNI registers, through the same epilogue (the same bits).
constexpr int64_t kAmxMinRows = 16;
int64_t amx_min_rows();
// Testing hook: 1 runs every matmul of a small forward on tiles, 16 (the most it takes) none.
void set_amx_min_rows(int64_t rows);

// Bytes of one block of the file (fp16 scale, + fp16 min for Q4_1 and Q5_1, + Q5_0's and Q5_1's
// 32 high bits, and the quants; MXFP4: the E8M0 byte and the nibbles; the K-quants and IQ4_XS: a
// 256-element super-block), the elements it holds (32, or 256) and the bytes of a k-wide row.
size_t block_bytes(QType q);
int64_t block_elements(QType q);
size_t row_bytes(QType q, int64_t k);

// The matmul kernel a path takes (its best one at or below the path), and the active path's.
Isa isa_for(CpuPath path);
Isa best_isa();
bool isa_supported(Isa isa);
const char* isa_name(Isa isa);
// What `isa` runs, for `met doctor`: "avx512vnni", "amx-int8 tiles for M>=16, ...".
std::string isa_description(Isa isa);

// One row of W back to fp32: the plain reading of the format, used as the tests' reference.
void dequantize_row(QType q, const uint8_t* row, float* out, int64_t k);

// Throws std::invalid_argument on bad sizes and std::runtime_error for an unsupported forced isa.
// n_threads <= 0 means OpenMP's default.
void quant_matmul(const float* x, const uint8_t* w, float* y, int64_t m, int64_t n, int64_t k,
                  QType q, int n_threads, Isa isa = Isa::kAuto);

namespace detail {
struct QuantActs;
}

// The two halves of quant_matmul for callers that run many matmuls inside one OpenMP parallel
// region (the CPU model's layer loop): both work-share with an orphaned `omp for` without a
// closing barrier (the caller synchronizes before reading the output), so every thread of the
// enclosing team must call them (outside a region they run serially). Sizes are not checked
// here; `isa` must be a supported, resolved path (not kAuto).
void quantize_acts_team(const float* x, int64_t m, int64_t k, const detail::QuantActs& acts,
                        Isa isa);
// y's rows are ldy floats apart (0: n), so a weight stored in parts of different formats fills
// its column range of one wider output.
void matmul_acts_team(const detail::QuantActs& acts, const uint8_t* w, float* y, int64_t m,
                      int64_t n, int64_t k, QType q, Isa isa, int64_t ldy = 0);
// One row, no threading: for callers fusing quantization into their own per-row loop.
void quantize_act_row(const float* x, int64_t k, int64_t row, const detail::QuantActs& acts,
                      Isa isa);

}  // namespace met::cpu
