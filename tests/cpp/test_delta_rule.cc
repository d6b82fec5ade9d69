// The gated delta rule (csrc/cpu/delta_rule.h): every step path the CPU runs gives the scalar
// step's bits; a batch of rows gives each row's bits alone; the chunk form equals the step
// applied token by token (to 1e-5), across chunk sizes and with the state carried between calls.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "cpu/delta_rule.h"
#include "cpu/isa.h"

namespace met::cpu {
namespace {

struct Tokens {
  std::vector<float> q, k, v, g, beta;
};

void normalize(float* x, int64_t n) {
  float sum = 0.0f;
  for (int64_t i = 0; i < n; ++i) sum += x[i] * x[i];
  const float inv = 1.0f / std::sqrt(sum + 1e-6f);
  for (int64_t i = 0; i < n; ++i) x[i] *= inv;
}

Tokens random_tokens(int64_t n, DeltaShape s, uint32_t seed) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> normal;
  std::uniform_real_distribution<float> unit(0.0f, 1.0f);
  Tokens t;
  const auto rows = n * s.heads;
  t.q.resize(rows * s.k_dim);
  t.k.resize(rows * s.k_dim);
  t.v.resize(rows * s.v_dim);
  for (auto& x : t.q) x = normal(gen);
  for (auto& x : t.k) x = normal(gen);
  for (auto& x : t.v) x = normal(gen);
  for (int64_t r = 0; r < rows; ++r) {
    normalize(t.q.data() + r * s.k_dim, s.k_dim);
    normalize(t.k.data() + r * s.k_dim, s.k_dim);
    t.g.push_back(-unit(gen));
    t.beta.push_back(unit(gen));
  }
  return t;
}

std::vector<float> random_state(DeltaShape s, int64_t slots, uint32_t seed) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> normal;
  std::vector<float> state(slots * s.heads * s.k_dim * s.v_dim);
  for (auto& x : state) x = 0.5f * normal(gen);
  return state;
}

// Token by token through delta_rule_step on `path`: the outputs [n, heads, v_dim].
std::vector<float> stepped(const Tokens& t, std::vector<float>& state, int64_t n, DeltaShape s,
                           CpuPath path) {
  std::vector<float> out(n * s.heads * s.v_dim);
  const int64_t slot = 0;
  for (int64_t i = 0; i < n; ++i) {
    const auto qk = i * s.heads * s.k_dim, vo = i * s.heads * s.v_dim, gb = i * s.heads;
    delta_rule_step(t.q.data() + qk, t.k.data() + qk, t.v.data() + vo, t.g.data() + gb,
                    t.beta.data() + gb, state.data(), &slot, out.data() + vo, 1, s, path);
  }
  return out;
}

// v_dim 40: two full 16-lane blocks and a masked tail.
constexpr DeltaShape kShape{3, 16, 40};

TEST(DeltaRule, EveryStepPathGivesTheScalarBits) {
  // v_dim 232 takes each pass of the 512-bit step: 128 columns, 64, then 16 and a masked tail;
  // v_dim 60 each pass of the 256-bit one: 32 columns, 16, 8, then a masked tail of 4.
  for (const DeltaShape& shape : {kShape, DeltaShape{2, 16, 232}, DeltaShape{2, 16, 60}}) {
    SCOPED_TRACE("v_dim " + std::to_string(shape.v_dim));
    const Tokens t = random_tokens(20, shape, 1);
    std::vector<float> want_state = random_state(shape, 1, 2);
    const std::vector<float> start = want_state;
    const auto want = stepped(t, want_state, 20, shape, CpuPath::kScalar);
    for (const CpuPath path : kAllPaths) {
      if (!path_supported(path)) continue;
      std::vector<float> state = start;
      EXPECT_EQ(stepped(t, state, 20, shape, path), want) << path_name(path);
      EXPECT_EQ(state, want_state) << path_name(path);
    }
  }
}

TEST(DeltaRule, ABatchOfRowsGivesEachRowsBitsAlone) {
  const int64_t rows = 5;
  const Tokens t = random_tokens(rows, kShape, 3);
  const std::vector<int64_t> slots = {4, 0, 2, 1, 3};  // out of order, as the scheduler's
  for (const CpuPath path : kAllPaths) {
    if (!path_supported(path)) continue;
    std::vector<float> batched = random_state(kShape, rows, 4), alone = batched;
    std::vector<float> out(rows * kShape.heads * kShape.v_dim), one(out.size());
    delta_rule_step(t.q.data(), t.k.data(), t.v.data(), t.g.data(), t.beta.data(), batched.data(),
                    slots.data(), out.data(), rows, kShape, path);
    for (int64_t r = 0; r < rows; ++r) {
      const auto qk = r * kShape.heads * kShape.k_dim, vo = r * kShape.heads * kShape.v_dim;
      delta_rule_step(t.q.data() + qk, t.k.data() + qk, t.v.data() + vo,
                      t.g.data() + r * kShape.heads, t.beta.data() + r * kShape.heads, alone.data(),
                      &slots[r], one.data() + vo, 1, kShape, path);
    }
    EXPECT_EQ(out, one) << path_name(path);
    EXPECT_EQ(batched, alone) << path_name(path);
  }
}

void expect_near(const std::vector<float>& got, const std::vector<float>& want, float tol) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    ASSERT_NEAR(got[i], want[i], tol * (1.0f + std::fabs(want[i]))) << "at " << i;
  }
}

TEST(DeltaRule, TheChunkFormIsTheStepTokenByToken) {
  const int64_t n = 150;
  const Tokens t = random_tokens(n, kShape, 5);
  const std::vector<float> start = random_state(kShape, 1, 6);
  std::vector<float> want_state = start;
  const auto want = stepped(t, want_state, n, kShape, CpuPath::kScalar);
  for (const int64_t chunk : {1, 16, 64, 200}) {
    std::vector<float> state = start, out(want.size());
    delta_rule_chunk(t.q.data(), t.k.data(), t.v.data(), t.g.data(), t.beta.data(), state.data(),
                     out.data(), n, kShape, chunk);
    expect_near(out, want, 1e-5f);
    expect_near(state, want_state, 1e-5f);
  }
  // Two calls carrying the state (70 then 80 tokens, the second starting mid-chunk) are one.
  std::vector<float> state = start, out(want.size());
  const int64_t first = 70, qk = first * kShape.heads * kShape.k_dim;
  const int64_t vo = first * kShape.heads * kShape.v_dim, gb = first * kShape.heads;
  delta_rule_chunk(t.q.data(), t.k.data(), t.v.data(), t.g.data(), t.beta.data(), state.data(),
                   out.data(), first, kShape, 64);
  delta_rule_chunk(t.q.data() + qk, t.k.data() + qk, t.v.data() + vo, t.g.data() + gb,
                   t.beta.data() + gb, state.data(), out.data() + vo, n - first, kShape, 64);
  expect_near(out, want, 1e-5f);
  expect_near(state, want_state, 1e-5f);
}

TEST(DeltaRule, EveryChunkPathGivesTheScalarBits) {
  const int64_t n = 150;
  const Tokens t = random_tokens(n, kShape, 7);
  const std::vector<float> start = random_state(kShape, 1, 8);
  std::vector<float> want_state = start, want(n * kShape.heads * kShape.v_dim);
  delta_rule_chunk(t.q.data(), t.k.data(), t.v.data(), t.g.data(), t.beta.data(), want_state.data(),
                   want.data(), n, kShape, 64, CpuPath::kScalar);
  for (const CpuPath path : kAllPaths) {
    if (!path_supported(path)) continue;
    std::vector<float> state = start, out(want.size());
    delta_rule_chunk(t.q.data(), t.k.data(), t.v.data(), t.g.data(), t.beta.data(), state.data(),
                     out.data(), n, kShape, 64, path);
    EXPECT_EQ(out, want) << path_name(path);
    EXPECT_EQ(state, want_state) << path_name(path);
  }
}

}  // namespace
}  // namespace met::cpu
