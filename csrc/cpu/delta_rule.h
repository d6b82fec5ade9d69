// Owns: the gated delta rule of Gated DeltaNet layers (Qwen3.5 / Qwen3-Next) on fp32: one token's
//   recurrent step for a batch of rows, and the chunkwise form over one row's prefill tokens.
//   Per value head, with state S [k_dim, v_dim]:
//     S <- exp(g) S;  S <- S + k (beta (v - S^T k))^T;  o = S^T q.
// Called by: csrc/bindings/cpu_kernels.cpp (_core.cpu.delta_rule_step / delta_rule_chunk, which
//   python/met/model/deltanet.py runs for CPU float32 models) and tests/cpp/test_delta_rule.cc.
// Invariants: a head's output and state depend only on its own inputs, summed in one fixed order
//   (over k_dim, then over a chunk's tokens), so a row's result is bitwise the same whatever
//   batch or thread runs it. The scalar, avx2 and avx512 steps round the same operations in the
//   same order (no fused multiply-add: the files build with -ffp-contract=off), so they give the
//   same bits. The chunk form equals the step applied token by token up to rounding. Nothing is
//   validated here: the caller guarantees shapes, strides and distinct state slots per row.
#pragma once

#include <cstdint>

#include "cpu/isa.h"

namespace met::cpu {

struct DeltaShape {
  int64_t heads, k_dim, v_dim;
};

// One token of `rows` rows. Row r reads q[r], k[r] [heads, k_dim], v[r] [heads, v_dim], g[r],
// beta[r] [heads] (each row's tensors contiguous, rows `heads * dim` apart), updates
// states + slots[r] * heads * k_dim * v_dim in place and writes out[r] [heads, v_dim]. q is
// already L2-normalised and scaled; k L2-normalised; g the log decay (<= 0).
void delta_rule_step(const float* q, const float* k, const float* v, const float* g,
                     const float* beta, float* states, const int64_t* slots, float* out,
                     int64_t rows, DeltaShape shape, CpuPath path);

// The same rule over `tokens` tokens of one row (the layout as above, token-major), chunkwise:
// within a chunk of up to `chunk` tokens the updates u_t = beta_t (v_t - S_t^T k_t) solve one
// unit-lower-triangular system by forward substitution; the state carries between chunks.
// state [heads, k_dim, v_dim] is updated in place.
void delta_rule_chunk(const float* q, const float* k, const float* v, const float* g,
                      const float* beta, float* state, float* out, int64_t tokens, DeltaShape shape,
                      int64_t chunk, CpuPath path = CpuPath::kScalar);

// One value head over one chunk of c.n tokens, pointers at its first token: q and k qk_stride
// floats apart token to token, v v_stride, out out_stride, g and beta gb_stride; the state
// [k_dim, v_dim] is updated in place. scratch: delta_chunk_scratch(n, v_dim) floats. (The
// forward runs these per (row, head) on its own team; delta_rule_chunk is a row's heads.)
struct DeltaChunk {
  const float *q, *k, *v, *g, *beta;
  float *state, *out;
  int64_t n, k_dim, v_dim, qk_stride, v_stride, out_stride, gb_stride;
};
void delta_rule_chunk_head(const DeltaChunk& c, float* scratch);
int64_t delta_chunk_scratch(int64_t chunk, int64_t v_dim);
// The chunk kernel a path runs: delta_rule_chunk_head or its build in 256- or 512-bit registers,
// which give the same bits.
using DeltaChunkHead = void (*)(const DeltaChunk& c, float* scratch);
DeltaChunkHead delta_chunk_head_for(CpuPath path);

// The per-head step kernels behind delta_rule_step (scratch holds v_dim floats), and the one a
// path runs.
using DeltaStepHead = void (*)(const float* q, const float* k, const float* v, float g, float beta,
                               float* state, float* out, int64_t k_dim, int64_t v_dim,
                               float* scratch);
DeltaStepHead delta_step_head_for(CpuPath path);
void delta_step_head_scalar(const float* q, const float* k, const float* v, float g, float beta,
                            float* state, float* out, int64_t k_dim, int64_t v_dim, float* scratch);
void delta_step_head_avx2(const float* q, const float* k, const float* v, float g, float beta,
                          float* state, float* out, int64_t k_dim, int64_t v_dim, float* scratch);
void delta_step_head_avx512(const float* q, const float* k, const float* v, float g, float beta,
                            float* state, float* out, int64_t k_dim, int64_t v_dim, float* scratch);
void delta_chunk_head_avx2(const DeltaChunk& c, float* scratch);
void delta_chunk_head_avx512(const DeltaChunk& c, float* scratch);

}  // namespace met::cpu
