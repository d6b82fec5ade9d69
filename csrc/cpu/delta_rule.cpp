// The gated delta rule's scalar step, its dispatch per path, and the chunkwise form (see
// delta_rule.h). Built with -ffp-contract=off, as delta_rule_avx512.cpp: the two step kernels
// must round the same operations.
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

// Eight partial sums in a fixed order: one chain of dependent adds was the chunk form's
// bottleneck (a chunk of 64 tokens takes 64^2 dots), and eight independent ones vectorize and
// give the same bits at every register width.
float dot(const float* a, const float* b, int64_t n) {
  float partial[8] = {};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    for (int j = 0; j < 8; ++j) partial[j] = partial[j] + a[i + j] * b[i + j];
  }
  float sum = 0.0f;
  for (; i < n; ++i) sum = sum + a[i] * b[i];
  for (int j = 0; j < 8; ++j) sum = sum + partial[j];
  return sum;
}

// Row t of S^T x (x one k_dim vector) into y [v_dim].
void read_state(const float* state, const float* x, float* y, int64_t k_dim, int64_t v_dim) {
  for (int64_t j = 0; j < v_dim; ++j) y[j] = 0.0f;
  for (int64_t i = 0; i < k_dim; ++i) {
    const float* row = state + i * v_dim;
    for (int64_t j = 0; j < v_dim; ++j) y[j] = y[j] + row[j] * x[i];
  }
}

}  // namespace

DeltaStepHead delta_step_head_for(CpuPath path) {
#if defined(MET_DELTA_HAS_AVX512)
  if (path == CpuPath::kAvx512 || path == CpuPath::kAmx) return delta_step_head_avx512;
#else
  (void)path;
#endif
  return delta_step_head_scalar;
}

int64_t delta_chunk_scratch(int64_t chunk, int64_t v_dim) { return chunk + (chunk + 1) * v_dim; }

void delta_rule_chunk_head(const DeltaChunk& c, float* scratch) {
  const int64_t n = c.n, dk = c.k_dim, dv = c.v_dim;
  float* cum = scratch;
  float* u = cum + n;
  float* read = u + n * dv;
  float total = 0.0f;
  for (int64_t t = 0; t < n; ++t) cum[t] = total = total + c.g[t * c.gb_stride];
  // u_t = beta_t (v_t - e^{G_t} S_0^T k_t - sum_{j<t} e^{G_t - G_j} (k_t . k_j) u_j).
  for (int64_t t = 0; t < n; ++t) {
    const float* kt = c.k + t * c.qk_stride;
    float* ut = u + t * dv;
    read_state(c.state, kt, read, dk, dv);
    const float start = std::exp(cum[t]);
    for (int64_t j = 0; j < dv; ++j) ut[j] = c.v[t * c.v_stride + j] - start * read[j];
    for (int64_t s = 0; s < t; ++s) {
      const float w = std::exp(cum[t] - cum[s]) * dot(kt, c.k + s * c.qk_stride, dk);
      const float* us = u + s * dv;
      for (int64_t j = 0; j < dv; ++j) ut[j] = ut[j] - w * us[j];
    }
    const float beta = c.beta[t * c.gb_stride];
    for (int64_t j = 0; j < dv; ++j) ut[j] = ut[j] * beta;
  }
  // o_t = e^{G_t} S_0^T q_t + sum_{s<=t} e^{G_t - G_s} (q_t . k_s) u_s.
  for (int64_t t = 0; t < n; ++t) {
    const float* qt = c.q + t * c.qk_stride;
    float* ot = c.out + t * c.out_stride;
    read_state(c.state, qt, read, dk, dv);
    const float start = std::exp(cum[t]);
    for (int64_t j = 0; j < dv; ++j) ot[j] = start * read[j];
    for (int64_t s = 0; s <= t; ++s) {
      const float w = std::exp(cum[t] - cum[s]) * dot(qt, c.k + s * c.qk_stride, dk);
      const float* us = u + s * dv;
      for (int64_t j = 0; j < dv; ++j) ot[j] = ot[j] + w * us[j];
    }
  }
  // S <- e^{G_n} S + sum_s e^{G_n - G_s} k_s u_s^T; each token's decay once, not once per row
  // of S (`cum` is read no more).
  const float last = cum[n - 1], end = std::exp(last);
  for (int64_t s = 0; s < n; ++s) cum[s] = std::exp(last - cum[s]);
  for (int64_t i = 0; i < dk; ++i) {
    float* row = c.state + i * dv;
    for (int64_t j = 0; j < dv; ++j) row[j] = row[j] * end;
    for (int64_t s = 0; s < n; ++s) {
      const float w = cum[s] * c.k[s * c.qk_stride + i];
      const float* us = u + s * dv;
      for (int64_t j = 0; j < dv; ++j) row[j] = row[j] + w * us[j];
    }
  }
}

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
                      int64_t chunk) {
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
        delta_rule_chunk_head(c, scratch.data());
      }
    }
  }
}

}  // namespace met::cpu
