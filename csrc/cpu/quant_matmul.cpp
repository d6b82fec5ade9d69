// Dispatch, threading and the portable scalar path of quant_matmul (see quant_matmul.h; the
// block formats themselves are read in quant_blocks.cpp).
#include "quant_matmul.h"

#include <atomic>
#include <cmath>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#include "column_claims.h"
#include "quant_matmul_internal.h"

#ifdef _OPENMP
#include <omp.h>
#endif

namespace met::cpu {

namespace {

// Output columns per scheduling unit: enough rows that a thread's weight slice stays in L1 while
// it sweeps the activation tiles, few enough that two threads split even a 576-column matmul.
constexpr int64_t kColumnsPerChunk = 16;

// Activation rows per panel: every 4-column tile sweeps all the rows of its panel, so a panel's
// int8 rows (k bytes each) should stay in L2 meanwhile. Without panels a prefill of 8192 rows
// streamed them from L3 for every tile, and took about twice the time per row that 512 rows take
// (the default model's shapes, Zen 4 with 1 MB of L2 per core).
constexpr int64_t kPanelBytes = 128 * 1024;
int64_t panel_rows(int64_t k) {
  const int64_t rows = kPanelBytes / k / 16 * 16;
  return rows < 64 ? 64 : rows;
}

}  // namespace

namespace detail {

float* thread_scratch_floats(int64_t count) {
  static thread_local std::vector<float> buffer;
  if (buffer.size() < static_cast<size_t>(count)) buffer.resize(count);
  return buffer.data();
}

void quantize_rows_scalar(const float* x, int64_t k, int64_t row_begin, int64_t row_end,
                          QuantActs acts) {
  const int64_t nb = k / kBlock;
  for (int64_t r = row_begin; r < row_end; ++r) {
    for (int64_t b = 0; b < nb; ++b) {
      const float* src = x + r * k + b * kBlock;
      float amax = 0.0f;
      for (int i = 0; i < kBlock; ++i) amax = std::fmax(amax, std::fabs(src[i]));
      const float inv = amax > 0.0f ? 127.0f / amax : 0.0f;
      int8_t* dst = acts.qs + r * k + b * kBlock;
      int32_t sum = 0;
      for (int i = 0; i < kBlock; ++i) {
        // nearbyint rounds half to even, as the SIMD path's cvtps does.
        dst[i] = static_cast<int8_t>(std::nearbyint(src[i] * inv));
        sum += dst[i];
      }
      const float scale = amax / 127.0f;
      acts.scale[r * nb + b] = scale;
      acts.scaled_sum[r * nb + b] = scale * static_cast<float>(sum);
    }
  }
}

// The canonical arithmetic every path reproduces bit for bit: one exact int32 per (row, column,
// block), the weights signed (Q4_0's and Q5_0's offsets taken off the quants), then in block
// order acc = fma(dot, d * scale, acc), Q2_K's acc = fma(mins, m * scale, acc), and for the
// formats with a float min acc = fma(m, scaled_sum, acc) (quant_matmul_columns.inc's epilogue).
void matmul_rows_scalar(const QuantActs& acts, const uint8_t* w, float* y, int64_t m, int64_t n,
                        int64_t k, QType q, int64_t n_begin, int64_t n_end) {
  const int64_t nb = k / kBlock;
  const int32_t offset = quant_offset(q);
  Block block;
  for (int64_t col = n_begin; col < n_end; ++col) {
    const uint8_t* row = w + col * row_bytes(q, k);
    for (int64_t r = 0; r < m; ++r) {
      float acc = 0.0f;
      for (int64_t b = 0; b < nb; ++b) {
        read_block(q, row, b, &block);
        const int8_t* a = acts.qs + r * k + b * kBlock;
        int32_t dots[2] = {0, 0}, sums[2] = {0, 0};
        for (int i = 0; i < kBlock; ++i) {
          dots[i / 16] += (block.q[i] - offset) * a[i];
          sums[i / 16] += a[i];
        }
        const int32_t dot = block.half[0] * dots[0] + block.half[1] * dots[1];
        const float scale = acts.scale[r * nb + b];
        acc = std::fma(static_cast<float>(dot), block.d * scale, acc);
        if (q == QType::kQ2_K) {
          const int32_t mins = block.half_min[0] * sums[0] + block.half_min[1] * sums[1];
          acc = std::fma(static_cast<float>(mins), block.m * scale, acc);
        }
        if (has_min(q)) acc = std::fma(block.m, acts.scaled_sum[r * nb + b], acc);
      }
      y[r * n + col] = acc;
    }
  }
}

}  // namespace detail

bool isa_supported(Isa isa) {
  const CpuFeatures& f = cpu_features();
  switch (isa) {
    case Isa::kAuto:
    case Isa::kScalar:
      return true;
#if defined(__x86_64__) || defined(_M_X64)
    case Isa::kAvx2:
      return f.avx2 && f.fma && f.f16c;
    case Isa::kAvx512Vnni:
      // 512-bit VPDPBUSD and byte shifts over 16-column panels (quant_matmul_columns.inc).
      return isa_supported(Isa::kAvx2) && f.avx512f && f.avx512bw && f.avx512vl && f.avx512vnni;
    case Isa::kAmxEmulated:
      // The tiles' packing and epilogue are AVX-512 code.
      return isa_supported(Isa::kAvx512Vnni) && f.avx512f && f.avx512bw;
    case Isa::kAmxInt8:
#ifdef MET_QMM_HAS_AMX
      return isa_supported(Isa::kAmxEmulated) && f.amx_tile && f.amx_int8 && f.amx_permitted;
#else
      return false;  // built by a compiler without -mamx-int8
#endif
#else
    default:
      return false;
#endif
  }
  return false;
}

Isa isa_for(CpuPath path) {
  switch (path) {
    case CpuPath::kScalar:
      return Isa::kScalar;
    case CpuPath::kAvx2:
      return Isa::kAvx2;
    case CpuPath::kAmx:
      if (amx_emulation() && isa_supported(Isa::kAmxEmulated)) return Isa::kAmxEmulated;
      if (isa_supported(Isa::kAmxInt8)) return Isa::kAmxInt8;
      [[fallthrough]];
    case CpuPath::kAvx512:
      return isa_supported(Isa::kAvx512Vnni) ? Isa::kAvx512Vnni : Isa::kAvx2;
  }
  return Isa::kScalar;
}

Isa best_isa() { return isa_for(active_path()); }

const char* isa_name(Isa isa) {
  switch (isa) {
    case Isa::kAuto:
      return "auto";
    case Isa::kScalar:
      return "scalar";
    case Isa::kAvx2:
      return "avx2";
    case Isa::kAvx512Vnni:
      return "avx512vnni";
    case Isa::kAmxInt8:
      return "amx-int8";
    case Isa::kAmxEmulated:
      return "amx-emulated";
  }
  return "unknown";
}

std::string isa_description(Isa isa) {
  if (isa != Isa::kAmxInt8 && isa != Isa::kAmxEmulated) return isa_name(isa);
  const char* tiles =
      isa == Isa::kAmxInt8 ? "amx-int8 tiles" : "amx-int8 tiles emulated in scalar code";
  return std::string(tiles) + " for M>=" + std::to_string(amx_min_rows()) +
         ", the same dots on avx512vnni below";
}

namespace {
std::atomic<int64_t> g_amx_min_rows{kAmxMinRows};
}  // namespace

int64_t amx_min_rows() { return g_amx_min_rows.load(std::memory_order_relaxed); }

void set_amx_min_rows(int64_t rows) {
  g_amx_min_rows.store(rows < 1 ? 1 : rows, std::memory_order_relaxed);
}

namespace {

detail::QuantizeFn quantize_fn(Isa isa) {
#if defined(__x86_64__) || defined(_M_X64)
  if (isa != Isa::kScalar) return detail::quantize_rows_avx2;
#endif
  (void)isa;
  return detail::quantize_rows_scalar;
}

detail::MatmulFn matmul_fn(Isa isa) {
#if defined(__x86_64__) || defined(_M_X64)
  if (isa == Isa::kAvx2) return detail::matmul_rows_avx2;
  if (isa == Isa::kAvx512Vnni) return detail::matmul_rows_avx512vnni;
  if (isa == Isa::kAmxEmulated) return detail::matmul_rows_amx_emulated;
#ifdef MET_QMM_HAS_AMX
  if (isa == Isa::kAmxInt8) return detail::matmul_rows_amx;
#endif
#endif
  (void)isa;
  return detail::matmul_rows_scalar;
}

// The columns kernels (avx512, amx) take a thread's whole share of columns in one call: they
// transpose the activations' scales once per call, and the tiles are programmed once.
bool takes_thread_share(Isa isa) {
  return isa == Isa::kAvx512Vnni || isa == Isa::kAmxInt8 || isa == Isa::kAmxEmulated;
}

// This thread's share [begin, end) of `chunks` column chunks, contiguous as schedule(static)
// deals them.
void thread_share(int64_t chunks, int64_t threads, int64_t me, int64_t* begin, int64_t* end) {
  const int64_t per = chunks / threads, extra = chunks % threads;
  *begin = me * per + (me < extra ? me : extra);
  *end = *begin + per + (me < extra ? 1 : 0);
}

// The part of a share that goes to the team's pool (ColumnClaims): its last eighth, rounded up.
int64_t tail_of(int64_t share) { return (share + 7) / 8; }

int64_t pool_size(int64_t chunks, int64_t threads) {
  int64_t pool = 0;
  for (int64_t t = 0; t < threads; ++t) {
    int64_t begin, end;
    thread_share(chunks, threads, t, &begin, &end);
    pool += tail_of(end - begin);
  }
  return pool;
}

// Chunk `index` of the pool: the threads' tails in thread order.
int64_t pool_chunk(int64_t chunks, int64_t threads, int64_t index) {
  for (int64_t t = 0; t < threads; ++t) {
    int64_t begin, end;
    thread_share(chunks, threads, t, &begin, &end);
    const int64_t tail = tail_of(end - begin);
    if (index < tail) return end - tail + index;
    index -= tail;
  }
  return -1;
}

// The team claims set_team_claims gave this thread, and the number of its last matmul.
thread_local ColumnClaims* team_claims = nullptr;
thread_local uint32_t team_calls = 0;

}  // namespace

void set_team_claims(ColumnClaims* claims) {
  team_claims = claims;
  team_calls = 0;
}

void quantize_act_row(const float* x, int64_t k, int64_t row, const detail::QuantActs& acts,
                      Isa isa) {
  quantize_fn(isa)(x, k, row, row + 1, acts);
}

void quantize_acts_team(const float* x, int64_t m, int64_t k, const detail::QuantActs& acts,
                        Isa isa) {
  const detail::QuantizeFn quantize = quantize_fn(isa);
#ifdef _OPENMP
#pragma omp for schedule(static) nowait
#endif
  for (int64_t r = 0; r < m; ++r) quantize(x, k, r, r + 1, acts);
}

void matmul_acts_team(const detail::QuantActs& acts, const uint8_t* w, float* y, int64_t m,
                      int64_t n, int64_t k, QType q, Isa isa, int64_t ldy) {
  // Every kernel reads its n only as y's row stride; columns index the weight's rows.
  const int64_t stride = ldy > 0 ? ldy : n;
  const int64_t chunks = (n + kColumnsPerChunk - 1) / kColumnsPerChunk;
  const int64_t nb = k / kBlock;
  const int64_t panel = panel_rows(k);
#ifdef _OPENMP
  const int64_t threads = omp_get_num_threads(), me = omp_get_thread_num();
#else
  const int64_t threads = 1, me = 0;
#endif
  const detail::MatmulFn matmul = matmul_fn(isa);
  const bool whole_share = takes_thread_share(isa);
  // Each panel is shared out on its own; the panels write disjoint rows of y, so no thread waits
  // for another between them. A row's result is the same whichever panel holds it.
  for (int64_t r0 = 0; r0 < m; r0 += panel) {
    const int64_t rows = m - r0 < panel ? m - r0 : panel;
    const detail::QuantActs part{acts.qs + r0 * k, acts.scale + r0 * nb, acts.scaled_sum + r0 * nb};
    float* out = y + r0 * stride;
    const auto run = [&](int64_t first, int64_t last) {
      const int64_t end = last * kColumnsPerChunk < n ? last * kColumnsPerChunk : n;
      matmul(part, w, out, rows, stride, k, q, first * kColumnsPerChunk, end);
    };
    // This thread's share but its tail, then pool chunks until the team has claimed them all.
    int64_t first, last;
    thread_share(chunks, threads, me, &first, &last);
    ColumnClaims* claims = threads > 1 ? team_claims : nullptr;
    const int64_t mine = claims != nullptr ? last - tail_of(last - first) : last;
    if (whole_share) {
      if (first < mine) run(first, mine);
    } else {
      for (int64_t c = first; c < mine; ++c) run(c, c + 1);
    }
    if (claims == nullptr) continue;
    const uint32_t call = ++team_calls;
    const int64_t pool = pool_size(chunks, threads);
    for (int64_t index; (index = claims->claim(call, pool)) >= 0;) {
      const int64_t c = pool_chunk(chunks, threads, index);
      run(c, c + 1);
    }
  }
}

void quant_matmul(const float* x, const uint8_t* w, float* y, int64_t m, int64_t n, int64_t k,
                  QType q, int n_threads, Isa isa) {
  block_bytes(q);  // rejects an out-of-range enum before any work
  const int64_t unit = block_elements(q);
  if (m < 0 || n < 0 || k <= 0 || k % unit != 0) {
    throw std::invalid_argument("quant_matmul: need M, N >= 0 and K a positive multiple of " +
                                std::to_string(unit) + " (K=" + std::to_string(k) + ")");
  }
  if (isa == Isa::kAuto) isa = best_isa();
  if (!isa_supported(isa)) {
    throw std::runtime_error(std::string("quant_matmul: this CPU lacks ") + isa_name(isa));
  }
  if (m == 0 || n == 0) return;

  const int64_t nb = k / kBlock;
  std::vector<int8_t> qs(static_cast<size_t>(m * k));
  std::vector<float> scales(static_cast<size_t>(2 * m * nb));
  const detail::QuantActs acts{qs.data(), scales.data(), scales.data() + m * nb};
  ColumnClaims claims;

#ifdef _OPENMP
  const int threads = n_threads > 0 ? n_threads : omp_get_max_threads();
#pragma omp parallel num_threads(threads)
#else
  (void)n_threads;
#endif
  {
    quantize_acts_team(x, m, k, acts, isa);
#ifdef _OPENMP
#pragma omp barrier
#endif
    set_team_claims(&claims);
    matmul_acts_team(acts, w, y, m, n, k, q, isa);
    set_team_claims(nullptr);
  }
}

}  // namespace met::cpu
