// met::cpu::draw (sampling.h). The kernel finds its top-k and top-p thresholds by bisecting the
// 32-bit key space with a pass over the vocabulary per step. Here the threshold is searched among
// a few candidates that provably hold it (the tokens near the top for top-k, those above a mass
// for top-p), sorted when few, else narrowed by a histogram of their keys' top bits first.
#include "cpu/sampling.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <limits>
#include <utility>
#include <vector>

#include "cpu/isa.h"
#include "cpu/ops.h"
#include "cpu/sampling_internal.h"
#include "kernels/sample_hash.h"

namespace met::cpu {
namespace {

using detail::kInf;
using Item = std::pair<float, float>;  // a candidate's scaled logit and weight

constexpr int kBucketShift = 20;  // 4096 buckets: sign, exponent and 3 mantissa bits
constexpr size_t kBuckets = size_t{1} << (32 - kBucketShift);
constexpr size_t kSortMax = 1024;  // fewer candidates than this are sorted outright
// Top-k's candidates: the tokens within a window below the best, from 4 wide up to this.
constexpr float kTopKWindowMax = 32.0f;

uint32_t bucket_of(float z) {
  uint32_t bits;
  std::memcpy(&bits, &z, sizeof bits);
  return kernels::float_key(bits) >> kBucketShift;
}

// The row's scaled logits and (for top-p) unnormalised probabilities, and the candidates, kept
// from row to row on each thread.
struct Scratch {
  std::vector<float> z;
  std::vector<float> kept;  // the scaled logits top-k kept
  std::vector<float> mass;
  std::vector<Item> items;
  std::vector<Item> bucket;
  std::array<double, kBuckets> weight{};
  std::array<uint32_t, kBuckets> count{};
};

Scratch& thread_scratch() {
  thread_local Scratch s;
  return s;
}

int32_t argmax(const float* logits, int32_t vocab) {
  int32_t best = 0;
  for (int32_t i = 0; i < vocab; ++i) {
    if (std::isnan(logits[i])) return i;
    if (logits[i] > logits[best]) best = i;
  }
  return best;
}

// Walks `items` from the largest value: the lowest value whose weight strictly above it, plus
// `ahead`, stays below `budget` (ties kept or cut together); +inf when there is none.
float lowest_kept(std::vector<Item>& items, double ahead, double budget) {
  std::sort(items.begin(), items.end(),
            [](const Item& a, const Item& b) { return a.first > b.first; });
  float lowest = kInf;
  for (size_t j = 0; j < items.size() && ahead < budget;) {
    lowest = items[j].first;
    for (; j < items.size() && items[j].first == lowest; ++j) ahead += items[j].second;
  }
  return lowest;
}

// lowest_kept of s.items from nothing ahead. Many candidates are first narrowed to the bucket
// holding the answer: the lowest bucket whose top value has less than the budget ahead of it.
float boundary(Scratch& s, double budget) {
  if (s.items.size() <= kSortMax) return lowest_kept(s.items, 0.0, budget);
  s.weight.fill(0.0);
  s.count.fill(0);
  for (const Item& item : s.items) {
    s.weight[bucket_of(item.first)] += item.second;
    ++s.count[bucket_of(item.first)];
  }
  double ahead = 0.0, ahead_of_last = 0.0;
  size_t last = kBuckets;
  for (size_t b = kBuckets; b-- > 0 && ahead < budget;) {
    if (s.count[b] == 0) continue;
    last = b;
    ahead_of_last = ahead;
    ahead += s.weight[b];
  }
  if (last == kBuckets) return kInf;
  s.bucket.clear();
  for (const Item& item : s.items) {
    if (bucket_of(item.first) == last) s.bucket.push_back(item);
  }
  return lowest_kept(s.bucket, ahead_of_last, budget);
}

// The k-th largest scaled logit (ties at it all kept), among the tokens within the narrowest
// window below the best that holds k of them (the whole row when none does).
float top_k_floor(Scratch& s, int32_t vocab, int32_t k, float m) {
  const float* z = s.z.data();  // the loops below would reload it through the thread's Scratch
  float low = -kInf;
  for (float window = 4.0f; window <= kTopKWindowMax; window *= 2.0f) {
    int32_t n = 0;
    for (int32_t i = 0; i < vocab; ++i) n += z[i] >= m - window;
    if (n >= k) {
      low = m - window;
      break;
    }
  }
  s.items.clear();
  for (int32_t i = 0; i < vocab; ++i) {
    if (z[i] >= low) s.items.emplace_back(z[i], 1.0f);
  }
  return boundary(s, k);
}

// The nucleus of the tokens at or above `floor`: the lowest value with less than top_p of their
// mass strictly above it. Candidates weigh at least tau, so those left out hold at most
// vocab * tau = half of (1 - top_p) of the mass, and the candidates hold the nucleus.
float top_p_floor(Scratch& s, int32_t vocab, float floor, float top_p, float m) {
  const float* z = s.z.data();
  int32_t n = vocab;
  if (floor > -kInf) {  // top-k kept a few: only they are weighed
    s.kept.clear();
    for (int32_t i = 0; i < vocab; ++i) {
      if (z[i] >= floor) s.kept.push_back(z[i]);
    }
    z = s.kept.data();
    n = static_cast<int32_t>(s.kept.size());
  }
  s.mass.resize(static_cast<size_t>(n));
  const float* mass = s.mass.data();
  activations_for(active_path()).exp_shifted(z, m, s.mass.data(), n);
  std::array<double, 8> partial{};  // a fixed order of sums, the same on every path
  for (int32_t i = 0; i < n; ++i) partial[i % 8] += mass[i];
  double kept = 0.0;
  for (const double x : partial) kept += x;
  const double budget = static_cast<double>(top_p) * kept;
  const auto tau = static_cast<float>(0.5 * (kept - budget) / n);
  s.items.clear();
  for (int32_t i = 0; i < n; ++i) {
    if (mass[i] > 0.0f && mass[i] >= tau) s.items.emplace_back(z[i], mass[i]);
  }
  return boundary(s, budget);
}

// The kernel's threshold: every token whose scaled logit is at least the result survives top-k
// and top-p; the best token always does (top_p or min_p at their limits keep just it).
float truncation_floor(Scratch& s, int32_t vocab, const DrawParams& p, float m) {
  float floor = -kInf;
  if (p.top_k > 0 && p.top_k < vocab) floor = top_k_floor(s, vocab, p.top_k, m);
  if (p.top_p < 1.0f) floor = std::max(floor, top_p_floor(s, vocab, floor, p.top_p, m));
  return std::min(floor, m);
}

}  // namespace

namespace detail {

float scale_scalar(const float* logits, float* z, int32_t vocab, float inv_t) {
  float m = -kInf;
  for (int32_t i = 0; i < vocab; ++i) {
    const float zi = logits[i] * inv_t + 0.0f;  // -0 + 0 is +0
    z[i] = std::isnan(zi) ? -kInf : zi;
    m = std::max(m, z[i]);
  }
  return m;
}

void draw_scalar(DrawState& s, int32_t begin, int32_t end) {
  for (int32_t i = begin; i < end; ++i) {
    const float needed = s.best - (s.z[i] - s.m);  // the noise token i needs to beat the best
    if (needed > kNoiseMax || s.z[i] < s.floor) continue;
    const uint32_t bits = kernels::sample_bits(s.row_key, static_cast<uint32_t>(i));
    if (needed <= noise_bound(bits)) s.consider(i, bits);
  }
}

const DrawLoops& draw_loops_for(CpuPath path) {
  static const DrawLoops scalar = {scale_scalar,
                                   [](DrawState& s, int32_t vocab) { draw_scalar(s, 0, vocab); }};
#if defined(MET_SAMPLING_HAS_X86)
  if (path == CpuPath::kAvx512 || path == CpuPath::kAmx) return draw_loops_avx512();
  if (path == CpuPath::kAvx2) return draw_loops_avx2();
#else
  (void)path;
#endif
  return scalar;
}

}  // namespace detail

int32_t draw(const float* logits, int32_t vocab, const DrawParams& p) {
  if (vocab <= 0) return 0;
  if (p.temperature <= 0.0f || p.top_k == 1) return argmax(logits, vocab);
  Scratch& s = thread_scratch();
  s.z.resize(static_cast<size_t>(vocab));
  const detail::DrawLoops& loops = detail::draw_loops_for(active_path());
  const float m = loops.scale(logits, s.z.data(), vocab, 1.0f / p.temperature);
  if (m == -kInf) return 0;  // nothing can be drawn: token 0, as argmax would
  const bool truncated = (p.top_k > 0 && p.top_k < vocab) || p.top_p < 1.0f;
  const float floor = truncated ? truncation_floor(s, vocab, p, m) : -kInf;
  detail::DrawState state{s.z.data(), floor, m, p.min_p, kernels::sample_row_key(p.seed, p.step)};
  // The best logit's score first: a strong score lets the loop skip most of the vocabulary.
  const auto top = static_cast<int32_t>(std::find(s.z.begin(), s.z.end(), m) - s.z.begin());
  state.consider(top, kernels::sample_bits(state.row_key, static_cast<uint32_t>(top)));
  loops.draw(state, vocab);
  return state.best_i == std::numeric_limits<int32_t>::max() ? 0 : state.best_i;
}

void draw_rows(const float* logits, int32_t vocab, const int64_t* rows, const DrawParams* params,
               int32_t n, int32_t* out) {
#pragma omp parallel for schedule(static) if (n > 1)
  for (int32_t r = 0; r < n; ++r) out[r] = draw(logits + rows[r] * vocab, vocab, params[r]);
}

}  // namespace met::cpu
