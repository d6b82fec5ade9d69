// Owns: met's sampling draw on the host (draw): the semantics of the CUDA sampling kernel
//   (csrc/kernels/sampling.cu, and its sort-based reference kernels::ref::sample), computed
//   without sorting the vocabulary.
// Called by: the CPU forward's direct steps (csrc/bindings/cpu_model.cpp) and
//   python/met/model/sampler.py (through _core.cpu.sample) for every sampled row on the host.
// Invariants: a row's token depends on its logits and its own parameters alone: the noise is
//   sample_hash.h's pure function of (seed, step, token), so a seeded request replays the same
//   tokens whatever shares its batch, and the host and the GPU kernel agree up to the rounding of
//   their sums and logarithms.
#pragma once

#include <cstdint>

namespace met::cpu {

struct DrawParams {
  float temperature = 1.0f;  // <= 0: greedy
  int32_t top_k = 0;         // <= 0: off; 1: greedy
  float top_p = 1.0f;        // >= 1: off
  float min_p = 0.0f;        // <= 0: off
  uint64_t seed = 0;
  uint64_t step = 0;  // the row's output count: a new draw every step
};

// One token of `logits` [vocab]: temperature, top-k (ties at the boundary all kept), top-p of
// what top-k kept (ties kept), min-p relative to the best token, then the argmax of the scaled
// logit plus Gumbel noise over the kept tokens (token i with probability p_i). NaN is never
// drawn; a row with nothing drawable gives token 0. Greedy rows give the first largest logit,
// NaN counting as the largest (torch.argmax).
// Runs on the active CPU path's loops (MET_CPU_ISA): every path draws the same token.
int32_t draw(const float* logits, int32_t vocab, const DrawParams& p);

// out[r] = draw(logits + rows[r] * vocab, vocab, params[r]) for r < n, the rows spread over the
// OpenMP threads.
void draw_rows(const float* logits, int32_t vocab, const int64_t* rows, const DrawParams* params,
               int32_t n, int32_t* out);

}  // namespace met::cpu
