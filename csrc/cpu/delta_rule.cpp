// The gated delta rule's scalar step, its dispatch per path, and the chunkwise form (see
// delta_rule.h). Built with -ffp-contract=off, as delta_rule_avx2.cpp and delta_rule_avx512.cpp:
// every step kernel must round the same operations.
#include "cpu/delta_rule.h"

#include <cmath>
#include <vector>

namespace met::cpu {

void delta_step_head_scalar(const float* q, const float* k, const float* v, float g, float beta,
                            float* state, float* out, int64_t k_dim, int64_t v_dim,
                            float* scratch) {
  const float decay = std::exp(g);
  float* delta = scratch;
  for (int64_t j = 0; j < v_dim; ++j) delta[j] = 0.0f;
  for (int64_t i = 0; i < k_dim; ++i) {
    float* row = state + i * v_dim;
    for (int64_t j = 0; j < v_dim; ++j) {
      row[j] = row[j] * decay;
      delta[j] = delta[j] + row[j] * k[i];
    }
  }
  for (int64_t j = 0; j < v_dim; ++j) delta[j] = (v[j] - delta[j]) * beta;
  for (int64_t j = 0; j < v_dim; ++j) out[j] = 0.0f;
  for (int64_t i = 0; i < k_dim; ++i) {
    float* row = state + i * v_dim;
    for (int64_t j = 0; j < v_dim; ++j) {
      row[j] = row[j] + k[i] * delta[j];
      out[j] = out[j] + row[j] * q[i];
    }
  }
}

namespace {

// State elements one call must touch before it runs on a thread team.
constexpr int64_t kParallelWork = int64_t{1} << 18;

}  // namespace

#define MET_DELTA_CHUNK_HEAD delta_rule_chunk_head
#include "cpu/delta_chunk.inc"
#undef MET_DELTA_CHUNK_HEAD

DeltaStepHead delta_step_head_for(CpuPath path) {
#if defined(MET_DELTA_HAS_X86)
  if (path == CpuPath::kAvx512 || path == CpuPath::kAmx) return delta_step_head_avx512;
  if (path == CpuPath::kAvx2) return delta_step_head_avx2;
#else
  (void)path;
#endif
  return delta_step_head_scalar;
}

DeltaChunkHead delta_chunk_head_for(CpuPath path) {
#if defined(MET_DELTA_HAS_X86)
  if (path == CpuPath::kAvx512 || path == CpuPath::kAmx) return delta_chunk_head_avx512;
  if (path == CpuPath::kAvx2) return delta_chunk_head_avx2;
#else
  (void)path;
#endif
  return delta_rule_chunk_head;
}

int64_t delta_chunk_scratch(int64_t chunk, int64_t v_dim) { return chunk + (chunk + 1) * v_dim; }

void delta_rule_step(const float* q, const float* k, const float* v, const float* g,
                     const float* beta, float* states, const int64_t* slots, float* out,
                     int64_t rows, DeltaShape shape, CpuPath path) {
  const DeltaStepHead kernel = delta_step_head_for(path);
  const int64_t heads = shape.heads, dk = shape.k_dim, dv = shape.v_dim;
  const int64_t items = rows * heads;
  // A team only where the work outweighs waking it (a small decode batch is microseconds).
#pragma omp parallel if (items * dk * dv >= kParallelWork)
  {
    std::vector<float> scratch(static_cast<size_t>(dv));
#pragma omp for schedule(static)
    for (int64_t item = 0; item < items; ++item) {
      const int64_t r = item / heads, h = item % heads;
      float* state = states + (slots[r] * heads + h) * dk * dv;
      kernel(q + item * dk, k + item * dk, v + item * dv, g[item], beta[item], state,
             out + item * dv, dk, dv, scratch.data());
    }
  }
}

void delta_rule_chunk(const float* q, const float* k, const float* v, const float* g,
                      const float* beta, float* state, float* out, int64_t tokens, DeltaShape shape,
                      int64_t chunk, CpuPath path) {
  const DeltaChunkHead head = delta_chunk_head_for(path);
  const int64_t heads = shape.heads, dk = shape.k_dim, dv = shape.v_dim;
#pragma omp parallel if (tokens * heads * dk * dv >= kParallelWork)
  {
    std::vector<float> scratch(static_cast<size_t>(delta_chunk_scratch(chunk, dv)));
#pragma omp for schedule(static)
    for (int64_t h = 0; h < heads; ++h) {
      for (int64_t start = 0; start < tokens; start += chunk) {
        const int64_t n = tokens - start < chunk ? tokens - start : chunk;
        const int64_t at = start * heads + h;
        const DeltaChunk c{q + at * dk,         k + at * dk,   v + at * dv, g + at, beta + at,
                           state + h * dk * dv, out + at * dv, n,           dk,     dv,
                           heads * dk,          heads * dv,    heads * dv,  heads};
        head(c, scratch.data());
      }
    }
  }
}

}  // namespace met::cpu
