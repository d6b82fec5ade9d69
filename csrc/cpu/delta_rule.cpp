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

using StepHead = void (*)(const float*, const float*, const float*, float, float, float*, float*,
                          int64_t, int64_t, float*);

StepHead step_kernel(CpuPath path) {
#if defined(MET_DELTA_HAS_AVX512)
  if (path == CpuPath::kAvx512 || path == CpuPath::kAmx) return delta_step_head_avx512;
#else
  (void)path;
#endif
  return delta_step_head_scalar;
}

// One head of one chunk of n tokens: o_t and the state after the chunk. Pointers are at the
// chunk's first token and this head; `stride` floats between a token's q/k rows, `vstride`
// between its v/out rows, `hstride` between its g/beta entries.
struct ChunkHead {
  const float *q, *k, *v, *g, *beta;
  float *state, *out;
  int64_t n, k_dim, v_dim, stride, vstride, hstride;
};

float dot(const float* a, const float* b, int64_t n) {
  float sum = 0.0f;
  for (int64_t i = 0; i < n; ++i) sum = sum + a[i] * b[i];
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

void chunk_head(const ChunkHead& c, std::vector<float>& cum, std::vector<float>& u,
                std::vector<float>& read) {
  const int64_t n = c.n, dk = c.k_dim, dv = c.v_dim;
  float total = 0.0f;
  for (int64_t t = 0; t < n; ++t) cum[t] = total = total + c.g[t * c.hstride];
  // u_t = beta_t (v_t - e^{G_t} S_0^T k_t - sum_{j<t} e^{G_t - G_j} (k_t . k_j) u_j).
  for (int64_t t = 0; t < n; ++t) {
    const float* kt = c.k + t * c.stride;
    float* ut = u.data() + t * dv;
    read_state(c.state, kt, read.data(), dk, dv);
    const float start = std::exp(cum[t]);
    for (int64_t j = 0; j < dv; ++j) ut[j] = c.v[t * c.vstride + j] - start * read[j];
    for (int64_t s = 0; s < t; ++s) {
      const float w = std::exp(cum[t] - cum[s]) * dot(kt, c.k + s * c.stride, dk);
      const float* us = u.data() + s * dv;
      for (int64_t j = 0; j < dv; ++j) ut[j] = ut[j] - w * us[j];
    }
    const float beta = c.beta[t * c.hstride];
    for (int64_t j = 0; j < dv; ++j) ut[j] = ut[j] * beta;
  }
  // o_t = e^{G_t} S_0^T q_t + sum_{s<=t} e^{G_t - G_s} (q_t . k_s) u_s.
  for (int64_t t = 0; t < n; ++t) {
    const float* qt = c.q + t * c.stride;
    float* ot = c.out + t * c.vstride;
    read_state(c.state, qt, read.data(), dk, dv);
    const float start = std::exp(cum[t]);
    for (int64_t j = 0; j < dv; ++j) ot[j] = start * read[j];
    for (int64_t s = 0; s <= t; ++s) {
      const float w = std::exp(cum[t] - cum[s]) * dot(qt, c.k + s * c.stride, dk);
      const float* us = u.data() + s * dv;
      for (int64_t j = 0; j < dv; ++j) ot[j] = ot[j] + w * us[j];
    }
  }
  // S <- e^{G_n} S + sum_s e^{G_n - G_s} k_s u_s^T.
  const float end = std::exp(cum[n - 1]);
  for (int64_t i = 0; i < dk; ++i) {
    float* row = c.state + i * dv;
    for (int64_t j = 0; j < dv; ++j) row[j] = row[j] * end;
    for (int64_t s = 0; s < n; ++s) {
      const float w = std::exp(cum[n - 1] - cum[s]) * c.k[s * c.stride + i];
      const float* us = u.data() + s * dv;
      for (int64_t j = 0; j < dv; ++j) row[j] = row[j] + w * us[j];
    }
  }
}

}  // namespace

void delta_rule_step(const float* q, const float* k, const float* v, const float* g,
                     const float* beta, float* states, const int64_t* slots, float* out,
                     int64_t rows, DeltaShape shape, CpuPath path) {
  const StepHead kernel = step_kernel(path);
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
    std::vector<float> cum(static_cast<size_t>(chunk)), read(static_cast<size_t>(dv));
    std::vector<float> u(static_cast<size_t>(chunk * dv));
#pragma omp for schedule(static)
    for (int64_t h = 0; h < heads; ++h) {
      for (int64_t start = 0; start < tokens; start += chunk) {
        const int64_t n = tokens - start < chunk ? tokens - start : chunk;
        const int64_t at = start * heads + h;
        const ChunkHead c{q + at * dk,         k + at * dk,   v + at * dv, g + at, beta + at,
                          state + h * dk * dv, out + at * dv, n,           dk,     dv,
                          heads * dk,          heads * dv,    heads};
        chunk_head(c, cum, u, read);
      }
    }
  }
}

}  // namespace met::cpu
