// The draft planner: its cost fit, its per-sequence chances, the best-first choice; and, on a
// simulated lane whose draft tokens stand with a fixed chance, the property it exists for:
// drafting what it plans is never more than 2% slower than not drafting (what exploring costs
// where nothing stands), and within 10% of the best fixed draft length chosen in hindsight.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "met/draft_planner.h"
#include "met/mix64.h"

namespace met {
namespace {

// A 2-core CPU at one row: a step of r rows costs 4 + 1.3 r (ms).
constexpr double kBase = 4.0;
constexpr double kRow = 1.3;

double machine(int32_t rows) { return kBase + kRow * rows; }

// Steps of 1-5 rows.
void feed_lane(DraftPlanner& p, int steps) {
  for (int i = 0; i < steps; ++i) p.observe_step(1 + i % 5, machine(1 + i % 5));
}

DraftRecord record_with(double accepted, double rejected) {
  DraftRecord r;
  r.accepted = accepted;
  r.rejected = rejected;
  return r;
}

TEST(DraftPlanner, KeepsWholeProposalsBeforeAnyStepWasTimed) {
  DraftPlanner p;
  const DraftRecord poor = record_with(0, 50);
  EXPECT_EQ(p.plan({4, 0, 2}, {&poor, &poor, &poor}), (std::vector<int32_t>{4, 0, 2}));
}

TEST(DraftPlanner, FitsTheCostOfTimedSteps) {
  DraftPlanner p;
  feed_lane(p, 400);
  const DraftPlanner::Cost c = p.cost();
  EXPECT_NEAR(c.row, kRow, 0.01);
  EXPECT_NEAR(c.seconds(1), machine(1), 0.01);
  EXPECT_NEAR(c.seconds(8), machine(8), 0.05);
}

TEST(DraftPlanner, PriorsDecideUntilRowsVary) {
  DraftPlanner p;
  for (int i = 0; i < 50; ++i) p.observe_step(1, 5.0);
  const DraftPlanner::Cost c = p.cost();
  EXPECT_NEAR(c.row, 0.3 * 5.0, 1e-9);
  EXPECT_NEAR(c.seconds(1), 5.0, 1e-9);
}

TEST(DraftPlanner, NoPartOfTheCostIsNegative) {
  DraftPlanner p;  // steps that get cheaper with rows
  for (int i = 0; i < 100; ++i) p.observe_step(1 + i % 4, 10.0 - (i % 4));
  EXPECT_EQ(p.cost().row, 0.0);
  DraftPlanner q;  // a line so steep its base would be negative
  for (int i = 0; i < 100; ++i) q.observe_step(1 + i % 2, i % 2 ? 10.0 : 0.1);
  EXPECT_GT(q.cost().row, 0.0);
  EXPECT_GE(q.cost().base, 0.0);
}

TEST(DraftPlanner, ChanceStartsAtOneHalfAndFollowsTheRecord) {
  DraftPlanner p;
  DraftRecord r;
  EXPECT_DOUBLE_EQ(p.chance(r), 0.5);
  for (int i = 0; i < 10; ++i) p.record(r, 4, false);
  EXPECT_GT(p.chance(r), 0.9);
  for (int i = 0; i < 20; ++i) p.record(r, 0, true);
  EXPECT_LT(p.chance(r), 0.35);
}

// At one row a draft row costs 1.3 / 5.3 of the step: a token must stand with a chance above
// about a quarter, and more as the draft grows (each taken token raises the rate to beat).
TEST(DraftPlanner, OneRowDraftsWhileTheChanceBeatsTheRowsCost) {
  DraftPlanner p;
  feed_lane(p, 400);
  const DraftRecord copying = record_with(17, 1);  // p = 0.9
  const DraftRecord story = record_with(1, 2);     // p = 0.4
  const DraftRecord poor = record_with(0, 4);      // p = 1/6
  EXPECT_EQ(p.plan({4}, {&copying}), (std::vector<int32_t>{4}));
  EXPECT_EQ(p.plan({4}, {&story}), (std::vector<int32_t>{1}));
  EXPECT_EQ(p.plan({4}, {&poor}), (std::vector<int32_t>{0}));
  EXPECT_EQ(p.plan({2}, {&copying}), (std::vector<int32_t>{2}));  // never past the proposal
}

// Eight rows on the same machine: a draft row costs most of a token's worth of the step, so
// only a sequence that copies nearly always drafts.
TEST(DraftPlanner, WideStepsDraftOnlyNearCertainTokens) {
  DraftPlanner p;
  for (int i = 0; i < 400; ++i) {
    const int32_t rows = 8 + i % 5;
    p.observe_step(rows, machine(rows));
  }
  const DraftRecord copying = record_with(60, 1);  // p ~ 0.97
  const DraftRecord good = record_with(3, 1);      // p = 0.67
  std::vector<const DraftRecord*> records(8, &good);
  records[3] = &copying;
  const std::vector<int32_t> plan = p.plan({4, 4, 4, 4, 4, 4, 4, 4}, records);
  for (size_t i = 0; i < plan.size(); ++i) EXPECT_EQ(plan[i], i == 3 ? plan[3] : 0) << i;
  EXPECT_GE(plan[3], 1);
}

// One lane at width 1: each draft token stands with chance `p` given the one before it did,
// steps cost the line above times noise. `fixed` >= 0 drafts that many tokens on every step
// (0: plain decoding), -1 drafts what the planner plans. Returns tokens per ms.
double lane_rate(double p, int32_t fixed, uint64_t seed) {
  DraftPlanner planner;
  DraftRecord record;
  double tokens = 0, ms = 0;
  uint64_t h = seed;
  auto uniform = [&h] {
    h = mix64(h + 0x9e3779b97f4a7c15ULL);
    return static_cast<double>(h >> 11) * 0x1.0p-53;
  };
  for (int step = 0; step < 3000; ++step) {
    const int32_t k = fixed >= 0 ? fixed : planner.plan({4}, {&record})[0];
    int32_t stood = 0;
    while (stood < k && uniform() < p) ++stood;
    const double cost = machine(1 + k) * (0.85 + 0.3 * uniform());
    planner.observe_step(1 + k, cost);
    if (k > 0) planner.record(record, stood, stood < k);
    // A step that drafted nothing checks the shadow draft of 4 against what it decodes next.
    if (fixed < 0 && k == 0) {
      int32_t shadow = 0;
      while (shadow < 4 && uniform() < p) ++shadow;
      planner.record(record, shadow, shadow < 4);
    }
    tokens += 1 + stood;
    ms += cost;
  }
  return tokens / ms;
}

TEST(DraftPlanner, LaneNeverSlowerThanPlainAndNearTheBestFixedDraft) {
  for (const double p : {0.1, 0.25, 0.4, 0.6, 0.8, 0.95}) {
    for (uint64_t seed = 1; seed <= 4; ++seed) {
      const double plain = lane_rate(p, 0, seed);
      double best = plain;
      for (int32_t k = 1; k <= 4; ++k) best = std::max(best, lane_rate(p, k, seed));
      const double planned = lane_rate(p, -1, seed);
      EXPECT_GE(planned, 0.98 * plain) << "p " << p << " seed " << seed;
      EXPECT_GE(planned, 0.9 * best) << "p " << p << " seed " << seed;
    }
  }
}

}  // namespace
}  // namespace met
