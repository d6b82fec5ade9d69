// ColumnClaims: within one matmul call every pool index goes to exactly one thread, a thread that
// finds a later call knows its own call's pool is taken, and matmul_acts_team with the tails
// handed out this way gives the same bits as one thread computing every column.
#include <gtest/gtest.h>

#include <atomic>
#include <cstring>
#include <random>
#include <thread>
#include <vector>

#include "cpu/column_claims.h"
#include "cpu/quant_matmul.h"
#include "quant_test_blocks.h"

namespace met::cpu {
namespace {

TEST(ColumnClaims, HandsOutEachIndexOfACallOnceThenNothing) {
  ColumnClaims claims;
  EXPECT_EQ(claims.claim(1, 3), 0);
  EXPECT_EQ(claims.claim(1, 3), 1);
  EXPECT_EQ(claims.claim(1, 3), 2);
  EXPECT_EQ(claims.claim(1, 3), -1);
  EXPECT_EQ(claims.claim(2, 0), -1);  // an empty pool
  EXPECT_EQ(claims.claim(3, 2), 0);
  // A thread still on call 2 finds call 3 begun: call 2's pool was all claimed.
  EXPECT_EQ(claims.claim(2, 5), -1);
  EXPECT_EQ(claims.claim(3, 2), 1);
  claims.reset();
  EXPECT_EQ(claims.claim(1, 1), 0);
}

TEST(ColumnClaims, ThreadsRacingThroughManyCallsClaimEveryIndexExactlyOnce) {
  constexpr int kThreads = 4;  // more than this machine's cores: threads fall behind each other
  constexpr uint32_t kCalls = 3000;
  const auto pool_of = [](uint32_t call) { return static_cast<int64_t>(call % 7); };
  ColumnClaims claims;
  std::vector<std::atomic<int>> taken(kCalls * 7);
  for (auto& t : taken) t.store(0);
  std::vector<std::thread> team;
  for (int id = 0; id < kThreads; ++id) {
    team.emplace_back([&, id] {
      std::mt19937 rng(static_cast<unsigned>(id));
      for (uint32_t call = 1; call <= kCalls; ++call) {
        if (rng() % 16 == 0) std::this_thread::yield();  // the static share, of uneven length
        for (int64_t index; (index = claims.claim(call, pool_of(call))) >= 0;) {
          taken[(call - 1) * 7 + index].fetch_add(1);
        }
      }
    });
  }
  for (std::thread& t : team) t.join();
  for (uint32_t call = 1; call <= kCalls; ++call) {
    for (int64_t index = 0; index < 7; ++index) {
      const int want = index < pool_of(call) ? 1 : 0;
      ASSERT_EQ(taken[(call - 1) * 7 + index].load(), want)
          << "call " << call << " index " << index;
    }
  }
}

TEST(ColumnClaims, TeamsOfAnySizeGiveTheSingleThreadBits) {
  // N = 300 is 19 column chunks: uneven shares for 2, 3 and 4 threads, each with a tail.
  const int64_t n = 300, m_max = 20;
  std::mt19937 rng(5);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (const QType q : {QType::kQ8_0, QType::kQ4_1, QType::kQ5_0, QType::kQ4_K}) {
    const int64_t k = test_blocks::fit_k(q, 512);
    const auto w = test_blocks::random_weights(q, n, k, rng);
    std::vector<float> x(m_max * k);
    for (auto& v : x) v = normal(rng);
    for (const Isa isa : {Isa::kScalar, Isa::kAvx2, Isa::kAvx512Vnni}) {
      if (!isa_supported(isa)) continue;
      for (const int64_t m : {int64_t{1}, int64_t{5}, m_max}) {
        std::vector<float> one(m * n);
        quant_matmul(x.data(), w.data(), one.data(), m, n, k, q, 1, isa);
        for (const int threads : {2, 3, 4}) {
          std::vector<float> team(m * n);
          quant_matmul(x.data(), w.data(), team.data(), m, n, k, q, threads, isa);
          ASSERT_EQ(std::memcmp(team.data(), one.data(), one.size() * sizeof(float)), 0)
              << isa_name(isa) << " m=" << m << " threads=" << threads;
        }
      }
    }
  }
}

}  // namespace
}  // namespace met::cpu
