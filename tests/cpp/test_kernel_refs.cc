// Each CPU reference of csrc/kernels against a naive direct formula (double precision, no
// block tables, no thresholds), on small random inputs in fp32 and with bf16/fp16 rounding.
// Tolerances: |ref - naive| <= atol + rtol * |naive| with (rtol, atol) per dtype in kTol:
// fp32 1e-4/1e-5 (float accumulation order), bf16 1e-2/1e-2 and fp16 2e-3/2e-3 (one final
// rounding: 2^-8 and 2^-11 relative, doubled for inputs near a rounding boundary). A NaN on
// either side always fails (every comparison with NaN is false).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <numeric>
#include <random>
#include <vector>

#include "kernels/reference/kernel_refs.h"
#include "kernels/sample_hash.h"

namespace met::kernels {
namespace {

struct Tol {
  float rtol, atol;
};
const std::map<DType, Tol> kTol = {
    {DType::kF32, {1e-4f, 1e-5f}}, {DType::kBF16, {1e-2f, 1e-2f}}, {DType::kF16, {2e-3f, 2e-3f}}};
const DType kDtypes[] = {DType::kF32, DType::kBF16, DType::kF16};

void expect_close(const std::vector<float>& got, const std::vector<double>& want, DType dtype) {
  ASSERT_EQ(got.size(), want.size());
  const Tol tol = kTol.at(dtype);
  for (size_t i = 0; i < got.size(); ++i) {
    const bool ok = std::fabs(got[i] - want[i]) <= tol.atol + tol.rtol * std::fabs(want[i]);
    ASSERT_TRUE(ok) << "element " << i << ": " << got[i] << " vs " << want[i];
  }
}

std::vector<float> random_values(size_t n, DType dtype, std::mt19937& rng, float scale = 1.0f) {
  std::normal_distribution<float> dist(0.0f, scale);
  std::vector<float> v(n);
  for (float& x : v) x = ref::round_to(dist(rng), dtype);
  return v;
}

TEST(KernelRefs, RoundingMatchesTheFormats) {
  EXPECT_EQ(ref::round_to(1.0f + 1.0f / 512, DType::kBF16), 1.0f);  // tie to even
  EXPECT_EQ(ref::round_to(1.0f + 3.0f / 512, DType::kBF16), 1.0f + 4.0f / 512);
  EXPECT_EQ(ref::round_to(1.0f / 3, DType::kF16), 0.333251953125f);
  EXPECT_EQ(ref::round_to(65504.0f, DType::kF16), 65504.0f);
  EXPECT_TRUE(std::isinf(ref::round_to(65520.0f, DType::kF16)));
  EXPECT_EQ(ref::round_to(std::ldexp(1.0f, -24), DType::kF16), std::ldexp(1.0f, -24));
  EXPECT_EQ(ref::round_to(std::ldexp(1.0f, -26), DType::kF16), 0.0f);
  EXPECT_TRUE(std::isnan(ref::round_to(NAN, DType::kBF16)));
}

// Rows: a fresh prefill, a chunk with earlier context, two decode rows, and a padding row
// (context 0). K/V of each sequence are drawn contiguously, then scattered over shuffled blocks.
TEST(KernelRefs, PagedAttentionMatchesDenseSoftmax) {
  const int block_size = 4, n_kv = 2, groups = 3, dim = 16, n_heads = n_kv * groups;
  const std::vector<int> ctx = {7, 11, 9, 1, 0}, q_lens = {7, 3, 1, 1, 1};
  const int batch = static_cast<int>(ctx.size()), max_blocks = 3;
  for (const DType dtype : kDtypes) {
    std::mt19937 rng(7);
    const int num_blocks = batch * max_blocks;
    std::vector<int> blocks(num_blocks);
    std::iota(blocks.begin(), blocks.end(), 0);
    std::shuffle(blocks.begin(), blocks.end(), rng);
    std::vector<int32_t> tables(blocks.begin(), blocks.end()), cu = {0};
    for (int q : q_lens) cu.push_back(cu.back() + q);
    const size_t row = n_kv * dim;
    std::vector<float> k_cache(num_blocks * block_size * row), v_cache(k_cache.size());
    std::vector<std::vector<float>> keys, values;  // per sequence, [ctx, n_kv, dim]
    for (int b = 0; b < batch; ++b) {
      keys.push_back(random_values(ctx[b] * row, dtype, rng));
      values.push_back(random_values(ctx[b] * row, dtype, rng));
      for (int pos = 0; pos < ctx[b]; ++pos) {
        const size_t slot =
            tables[b * max_blocks + pos / block_size] * block_size + pos % block_size;
        std::copy_n(&keys[b][pos * row], row, &k_cache[slot * row]);
        std::copy_n(&values[b][pos * row], row, &v_cache[slot * row]);
      }
    }
    const std::vector<float> q = random_values(cu.back() * n_heads * dim, dtype, rng);
    const std::vector<int32_t> lens(ctx.begin(), ctx.end());
    ref::Attention a;
    a.q = q.data();
    a.k_cache = k_cache.data();
    a.v_cache = v_cache.data();
    a.block_tables = tables.data();
    a.seq_lens = lens.data();
    a.cu_seqlens = cu.data();
    a.batch = batch;
    a.max_blocks = max_blocks;
    a.n_heads = n_heads;
    a.scale = 1.0f / std::sqrt(static_cast<float>(dim));
    a.kv = {block_size, n_kv, dim};
    a.dtype = dtype;
    const std::vector<float> got = ref::paged_attention(a);

    std::vector<double> want(got.size(), 0.0);
    for (int b = 0; b < batch; ++b) {
      for (int i = 0; i < q_lens[b]; ++i) {
        const int visible = ctx[b] - q_lens[b] + i + 1;
        for (int h = 0; h < n_heads && visible > 0; ++h) {
          const float* qv = &q[((cu[b] + i) * n_heads + h) * dim];
          std::vector<double> w(visible);
          for (int p = 0; p < visible; ++p) {
            double s = 0;
            for (int d = 0; d < dim; ++d)
              s += double{qv[d]} * keys[b][(p * n_kv + h / groups) * dim + d];
            w[p] = s / std::sqrt(double{dim});
          }
          const double top = *std::max_element(w.begin(), w.end());
          double total = 0;
          for (double& x : w) total += (x = std::exp(x - top));
          for (int d = 0; d < dim; ++d) {
            double acc = 0;
            for (int p = 0; p < visible; ++p)
              acc += w[p] * values[b][(p * n_kv + h / groups) * dim + d];
            want[((cu[b] + i) * n_heads + h) * dim + d] = acc / total;
          }
        }
      }
    }
    expect_close(got, want, dtype);
  }
}

TEST(KernelRefs, KvAppendWritesSlotsAndSkipsPadding) {
  const KvLayout kv{4, 2, 8};
  const int row = kv.n_kv_heads * kv.head_dim, stride = row + 8, num_slots = 12;
  std::mt19937 rng(1);
  const std::vector<float> k = random_values(3 * stride, DType::kF32, rng);
  const std::vector<float> v = random_values(3 * stride, DType::kF32, rng);
  std::vector<float> k_cache(num_slots * row, -1.0f), v_cache(num_slots * row, -1.0f);
  const std::vector<int64_t> slots = {9, -1, 2};
  ref::kv_append(k_cache.data(), v_cache.data(), k.data(), v.data(), slots.data(), 3, stride, kv);
  for (int s = 0; s < num_slots; ++s) {
    const int t = s == 9 ? 0 : (s == 2 ? 2 : -1);
    for (int e = 0; e < row; ++e) {
      EXPECT_EQ(k_cache[s * row + e], t < 0 ? -1.0f : k[t * stride + e]);
      EXPECT_EQ(v_cache[s * row + e], t < 0 ? -1.0f : v[t * stride + e]);
    }
  }
}

TEST(KernelRefs, RmsNormMatchesFormula) {
  const int n_tokens = 5, hidden = 96;
  for (const DType dtype : kDtypes) {
    std::mt19937 rng(2);
    const auto x = random_values(n_tokens * hidden, dtype, rng, 3.0f);
    const auto w = random_values(hidden, dtype, rng);
    std::vector<float> got(x.size());
    ref::rms_norm(got.data(), x.data(), w.data(), n_tokens, hidden, 1e-6f, dtype);
    std::vector<double> want(x.size());
    for (int t = 0; t < n_tokens; ++t) {
      double sq = 0;
      for (int i = 0; i < hidden; ++i) sq += double{x[t * hidden + i]} * x[t * hidden + i];
      const double inv = 1.0 / std::sqrt(sq / hidden + 1e-6);
      for (int i = 0; i < hidden; ++i) want[t * hidden + i] = x[t * hidden + i] * inv * w[i];
    }
    expect_close(got, want, dtype);
  }
}

TEST(KernelRefs, RopeRotatesPairsByPositionAngle) {
  const int n_tokens = 4, n_heads = 3, dim = 16, half = dim / 2, stride = n_heads * dim + 16;
  const int max_pos = 64;
  std::vector<float> cos(max_pos * half), sin(max_pos * half);
  for (int p = 0; p < max_pos; ++p) {
    for (int i = 0; i < half; ++i) {
      const double angle = p * std::pow(10000.0, -2.0 * i / dim);
      cos[p * half + i] = static_cast<float>(std::cos(angle));
      sin[p * half + i] = static_cast<float>(std::sin(angle));
    }
  }
  const std::vector<int64_t> positions = {0, 5, 63, 17};
  for (const DType dtype : kDtypes) {
    std::mt19937 rng(3);
    const auto x = random_values(n_tokens * stride, dtype, rng);
    std::vector<float> got = x;
    ref::rope(got.data(), positions.data(), cos.data(), sin.data(), n_tokens, n_heads, dim, stride,
              dtype);
    std::vector<double> want(x.begin(), x.end());
    for (int t = 0; t < n_tokens; ++t) {
      for (int h = 0; h < n_heads; ++h) {
        for (int i = 0; i < half; ++i) {
          const double angle = positions[t] * std::pow(10000.0, -2.0 * i / dim);
          const size_t a = t * stride + h * dim + i, b = a + half;
          want[a] = x[a] * std::cos(angle) - x[b] * std::sin(angle);
          want[b] = x[b] * std::cos(angle) + x[a] * std::sin(angle);
        }
      }
    }
    expect_close(got, want, dtype);  // the padding after the heads stays untouched too
  }
}

TEST(KernelRefs, SiluMulMatchesFormula) {
  const int n_tokens = 3, ffn = 40;
  for (const DType dtype : kDtypes) {
    std::mt19937 rng(4);
    const auto x = random_values(n_tokens * 2 * ffn, dtype, rng, 2.0f);
    std::vector<float> got(n_tokens * ffn);
    ref::silu_mul(got.data(), x.data(), n_tokens, ffn, dtype);
    std::vector<double> want(got.size());
    for (int t = 0; t < n_tokens; ++t) {
      for (int i = 0; i < ffn; ++i) {
        const double g = x[t * 2 * ffn + i], u = x[t * 2 * ffn + ffn + i];
        want[t * ffn + i] = g / (1.0 + std::exp(-g)) * u;
      }
    }
    expect_close(got, want, dtype);
  }
}

TEST(KernelRefs, ArgmaxTakesFirstLargestAndNan) {
  const std::vector<float> plain = {1.0f, 5.0f, -2.0f, 5.0f};
  EXPECT_EQ(ref::argmax(plain.data(), 4), 1);
  const std::vector<float> with_nan = {1.0f, 5.0f, NAN, 9.0f, NAN};
  EXPECT_EQ(ref::argmax(with_nan.data(), 5), 2);
  const std::vector<float> all_low(6, -INFINITY);
  EXPECT_EQ(ref::argmax(all_low.data(), 6), 0);
}

// The sampler's semantics written the obvious way (python/met/model/sampler.py): softmax, rank
// cut at top_k, renormalise, cut where the mass ahead reaches top_p, min_p against the best,
// then the exponential race argmax p_i / E_i with E_i = -log(u_i) from the shared noise.
int naive_sample(const std::vector<float>& logits, const ref::SampleParams& p) {
  const int vocab = static_cast<int>(logits.size());
  if (p.temperature <= 0.0f || p.top_k == 1) {
    return static_cast<int>(std::max_element(logits.begin(), logits.end()) - logits.begin());
  }
  std::vector<double> prob(vocab);
  double top = -INFINITY, total = 0;
  for (int i = 0; i < vocab; ++i) top = std::max(top, double{logits[i]} / p.temperature);
  for (int i = 0; i < vocab; ++i) total += prob[i] = std::exp(logits[i] / p.temperature - top);
  for (double& x : prob) x /= total;
  std::vector<int> order(vocab);
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(), [&](int a, int b) { return prob[a] > prob[b]; });
  const int k = p.top_k > 0 ? std::min(p.top_k, vocab) : vocab;
  double kept = 0;
  for (int r = 0; r < k; ++r) kept += prob[order[r]];
  std::vector<bool> keep(vocab, false);
  double before = 0;
  for (int r = 0; r < k; ++r) {
    keep[order[r]] = r == 0 || before < p.top_p;
    before += prob[order[r]] / kept;
  }
  int best = -1;
  double best_score = 0;
  for (int i = 0; i < vocab; ++i) {
    if (!keep[i] || prob[i] < p.min_p * prob[order[0]]) continue;
    const double e = -std::log(double{sample_uniform(p.seed, p.step, static_cast<uint32_t>(i))});
    const double score = prob[i] / e;
    if (best < 0 || score > best_score) best = i, best_score = score;
  }
  return best;
}

TEST(KernelRefs, SampleMatchesNaiveTruncationAndDraw) {
  std::mt19937 rng(5);
  const ref::SampleParams settings[] = {{1.0f, 0, 1.0f, 0.0f, 1, 0},   {0.7f, 5, 1.0f, 0.0f, 2, 0},
                                        {1.3f, 0, 0.8f, 0.0f, 3, 0},   {1.0f, 0, 1.0f, 0.1f, 4, 0},
                                        {0.9f, 20, 0.5f, 0.05f, 5, 0}, {0.0f, 0, 1.0f, 0.0f, 6, 0},
                                        {1.0f, 1, 0.9f, 0.0f, 7, 0},   {2.0f, 3, 0.3f, 0.0f, 8, 0}};
  int trials = 0;
  for (ref::SampleParams p : settings) {
    for (int step = 0; step < 60; ++step, ++trials) {
      p.step = step;
      const auto logits = random_values(200, DType::kF32, rng, 2.5f);
      ASSERT_EQ(ref::sample(logits.data(), 200, p), naive_sample(logits, p))
          << "temperature " << p.temperature << " top_k " << p.top_k << " top_p " << p.top_p
          << " min_p " << p.min_p << " step " << step;
    }
  }
  EXPECT_EQ(trials, 480);
}

TEST(KernelRefs, SampleDrawsTheTruncatedDistribution) {
  // p = softmax(log w) over 5 tokens; top_k = 4 drops the last; 40000 steps of one seed.
  const std::vector<float> logits = {std::log(0.4f), std::log(0.3f), std::log(0.2f),
                                     std::log(0.07f), std::log(0.03f)};
  const double expected[] = {0.4 / 0.97, 0.3 / 0.97, 0.2 / 0.97, 0.07 / 0.97, 0.0};
  std::vector<int> counts(5, 0);
  const int n = 40000;
  for (int step = 0; step < n; ++step) {
    ++counts[ref::sample(logits.data(), 5, {1.0f, 4, 1.0f, 0.0f, 99, uint64_t(step)})];
  }
  for (int i = 0; i < 5; ++i) {
    EXPECT_NEAR(counts[i] / double{n}, expected[i], 0.01) << "token " << i;  // ~4 sigma
  }
}

TEST(KernelRefs, SampleNoiseStaysInsideTheOpenIntervalAtItsExtremeBits) {
  // u == 1 would make -log(-log(u)) infinite: that token would win every draw it is in.
  const uint32_t last = (1u << kSampleBits) - 1u;
  for (const uint32_t bits : {0u, 1u, last - 1u, last}) {
    const float u = uniform_of(bits);
    EXPECT_GT(u, 0.0f);
    EXPECT_LT(u, 1.0f);
    const float noise = -std::log(-std::log(u));
    EXPECT_TRUE(std::isfinite(noise)) << bits;
    EXPECT_LT(noise, 16.7f);
    EXPECT_GT(noise, -2.9f);
  }
}

TEST(KernelRefs, SampleNeverDrawsNanOrMaskedTokens) {
  const std::vector<float> logits = {NAN, 1.0f, -INFINITY, 0.5f};
  for (int step = 0; step < 200; ++step) {
    const int t = ref::sample(logits.data(), 4, {1.0f, 0, 1.0f, 0.0f, 3, uint64_t(step)});
    EXPECT_TRUE(t == 1 || t == 3) << t;
    // top_p or min_p at their limits still leave the best token.
    EXPECT_EQ(ref::sample(logits.data(), 4, {1.0f, 0, 0.0f, 0.0f, 3, uint64_t(step)}), 1);
    EXPECT_EQ(ref::sample(logits.data(), 4, {1.0f, 0, 1.0f, 1.0f, 3, uint64_t(step)}), 1);
  }
}

}  // namespace
}  // namespace met::kernels
