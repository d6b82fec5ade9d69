// Greedy argmax and seeded top-k / top-p / min-p sampling (kernels.h), one CTA per logits row.
//
// Truncation never sorts the vocabulary: top-k and top-p become thresholds on the orderable
// key of the scaled logit (sample_hash.h), each found by bisecting the 32-bit key space with
// one counting (top-k) or mass-summing (top-p) pass per step; the draw is then an argmax of
// logit + Gumbel noise over the kept tokens, which picks token i with probability p_i.
#include <cstdint>

#include "common.cuh"
#include "sample_hash.h"

namespace met::kernels {
namespace {

constexpr int kThreads = 1024;

struct Best {
  float value;
  int index;
};

// NaN beats everything (torch.argmax), then the larger value, then the smaller index.
__device__ __forceinline__ bool better(Best a, Best b) {
  const bool an = isnan(a.value), bn = isnan(b.value);
  if (an != bn) return an;
  if (!an && a.value != b.value) return a.value > b.value;
  return a.index < b.index;
}

__device__ Best block_best(Best v, Best* scratch) {
  for (int o = 16; o > 0; o >>= 1) {
    const Best other{__shfl_xor_sync(0xffffffffu, v.value, o),
                     __shfl_xor_sync(0xffffffffu, v.index, o)};
    if (better(other, v)) v = other;
  }
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  __syncthreads();
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  v = lane < static_cast<int>(blockDim.x >> 5) ? scratch[lane] : Best{-INFINITY, INT32_MAX};
  for (int o = 16; o > 0; o >>= 1) {
    const Best other{__shfl_xor_sync(0xffffffffu, v.value, o),
                     __shfl_xor_sync(0xffffffffu, v.index, o)};
    if (better(other, v)) v = other;
  }
  return v;
}

__device__ int row_argmax(const float* row, int vocab, Best* scratch) {
  Best best{-INFINITY, INT32_MAX};
  for (int i = threadIdx.x; i < vocab; i += blockDim.x) {
    const Best here{row[i], i};
    if (better(here, best)) best = here;
  }
  return block_best(best, scratch).index;
}

__global__ void __launch_bounds__(kThreads)
    argmax_kernel(int32_t* out, const float* logits, int32_t vocab) {
  __shared__ Best scratch[32];
  const int token = row_argmax(logits + int64_t{blockIdx.x} * vocab, vocab, scratch);
  if (threadIdx.x == 0) out[blockIdx.x] = token;
}

// The scaled logit the truncation sees; NaN becomes -inf so it is never kept or drawn.
__device__ __forceinline__ float scaled(const float* row, int i, float inv_t) {
  const float z = row[i] * inv_t;
  return isnan(z) ? -INFINITY : z;
}

__device__ __forceinline__ uint32_t key_of(float z) { return float_key(__float_as_uint(z)); }

// Sum over the vocabulary of f(z_i) for tokens whose key is at least `floor` and above `above`.
template <typename F>
__device__ float masked_sum(const float* row, int vocab, float inv_t, uint32_t floor,
                            uint32_t above, bool strict, float* scratch, F f) {
  float acc = 0.0f;
  for (int i = threadIdx.x; i < vocab; i += blockDim.x) {
    const float z = scaled(row, i, inv_t);
    const uint32_t k = key_of(z);
    if (k >= floor && (strict ? k > above : k >= above)) acc += f(z);
  }
  return block_sum(acc, scratch);
}

__global__ void __launch_bounds__(kThreads) sample_kernel(SampleArgs a) {
  __shared__ Best best_scratch[32];
  __shared__ float scratch[32];
  const int r = blockIdx.x;
  const float* row = a.logits + int64_t{r} * a.vocab;
  const float temperature = a.temperature[r];
  const int top_k = a.top_k[r];
  if (temperature <= 0.0f || top_k == 1) {
    const int token = row_argmax(row, a.vocab, best_scratch);
    if (threadIdx.x == 0) a.out[r] = token;
    return;
  }
  const float inv_t = 1.0f / temperature;
  float m = -INFINITY;
  for (int i = threadIdx.x; i < a.vocab; i += blockDim.x) m = fmaxf(m, scaled(row, i, inv_t));
  m = block_max(m, scratch);
  if (m == -INFINITY) {  // nothing can be drawn: fall back to token 0, as argmax would
    if (threadIdx.x == 0) a.out[r] = 0;
    return;
  }
  const auto count = [](float) { return 1.0f; };
  const auto mass = [m](float z) { return expf(z - m); };

  uint32_t floor = 0;
  if (top_k > 0 && top_k < a.vocab) {
    // The largest key with at least top_k tokens at or above it (ties there are all kept).
    uint32_t lo = 0, hi = 0xFFFFFFFFu;
    while (lo < hi) {
      const uint32_t mid = lo + (hi - lo) / 2 + 1;
      const float n = masked_sum(row, a.vocab, inv_t, 0, mid, false, scratch, count);
      if (n >= static_cast<float>(top_k)) {
        lo = mid;
      } else {
        hi = mid - 1;
      }
    }
    floor = lo;
  }
  const float top_p = a.top_p[r];
  if (top_p < 1.0f) {
    // Keep token j while the mass strictly ahead of it is below top_p of what top-k kept: the
    // smallest key whose mass strictly above is under that budget.
    const float budget = top_p * masked_sum(row, a.vocab, inv_t, floor, 0, false, scratch, mass);
    uint32_t lo = floor, hi = 0xFFFFFFFFu;
    while (lo < hi) {
      const uint32_t mid = lo + (hi - lo) / 2;
      const float ahead = masked_sum(row, a.vocab, inv_t, floor, mid, true, scratch, mass);
      if (ahead < budget) {
        hi = mid;
      } else {
        lo = mid + 1;
      }
    }
    floor = lo;
  }
  // The best token always survives truncation (top_p or min_p at their limits keep just it).
  floor = min(floor, key_of(m));
  const float min_p = a.min_p[r];
  const uint64_t seed = a.seed[r], step = a.step[r];
  Best best{-INFINITY, INT32_MAX};
  for (int i = threadIdx.x; i < a.vocab; i += blockDim.x) {
    const float z = scaled(row, i, inv_t);
    if (z == -INFINITY || key_of(z) < floor) continue;
    if (z < m && min_p > 0.0f && expf(z - m) < min_p) continue;
    const float u = sample_uniform(seed, step, static_cast<uint32_t>(i));
    const Best here{(z - m) - logf(-logf(u)), i};
    if (better(here, best)) best = here;
  }
  best = block_best(best, best_scratch);
  if (threadIdx.x == 0) a.out[r] = best.index;
}

}  // namespace

void argmax(int32_t* out, const float* logits, int32_t rows, int32_t vocab, cudaStream_t stream) {
  if (rows <= 0) return;
  require(vocab > 0, "argmax: vocab must be positive");
  argmax_kernel<<<rows, kThreads, 0, stream>>>(out, logits, vocab);
  check_launch("argmax");
}

void sample(const SampleArgs& a, cudaStream_t stream) {
  if (a.rows <= 0) return;
  require(a.vocab > 0, "sample: vocab must be positive");
  sample_kernel<<<a.rows, kThreads, 0, stream>>>(a);
  check_launch("sample");
}

}  // namespace met::kernels
