// Scheduler units (chunk rule, KV gate, compaction targets) and golden parity against the
// recording fake.
#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>

#include "../../csrc/testing/harness.h"
#include "met/scheduler.h"

namespace met {
namespace {

TEST(PlanChunkLen, ChunkReachingTheEndIsTakenWhole) {
  EXPECT_EQ(plan_chunk_len(16, 20, 4, 16), 4);
  EXPECT_EQ(plan_chunk_len(16, 18, 2, 16), 2);
  EXPECT_EQ(plan_chunk_len(0, 4, 4, 16), 4);
}

TEST(PlanChunkLen, EndMovesDownToABlockBoundaryPastTheOffset) {
  EXPECT_EQ(plan_chunk_len(8, 20, 8, 16), 8);     // end 16 is aligned
  EXPECT_EQ(plan_chunk_len(10, 40, 12, 16), 4);   // end 22 -> 16: 6, rounded down to 4
  EXPECT_EQ(plan_chunk_len(4, 100, 40, 16), 28);  // end 44 -> 32, 28 is a multiple of 4
}

TEST(PlanChunkLen, NoBoundaryInsideKeepsTheProposalRoundedToFour) {
  EXPECT_EQ(plan_chunk_len(0, 20, 8, 16), 8);
  EXPECT_EQ(plan_chunk_len(0, 20, 7, 16), 4);
  EXPECT_EQ(plan_chunk_len(0, 20, 3, 16), 3);
}

TEST(AdmitCount, LoneRequestAlwaysFits) {
  EXPECT_EQ(admit_count({}, {{5000, 100}}, 10, 16, 4096), 1u);
}

TEST(AdmitCount, StopsAtTheFirstRequestThatDoesNotFit) {
  // In flight: 10 + 10 tokens -> 2 blocks. Each new: 20 + 12 -> 3 blocks. Pool of 8: 2 + 3 fits,
  // a second 3 would need 8 (fits), a third would need 11.
  const std::vector<KvDemand> in_flight{{10, 10}};
  const std::vector<KvDemand> incoming{{20, 12}, {20, 12}, {20, 12}, {1, 1}};
  EXPECT_EQ(admit_count(in_flight, incoming, 8, 16, 4096), 2u);
}

TEST(AdmitCount, WatermarkCapsTheReservedBudget) {
  EXPECT_EQ(admit_count({{0, 1 << 20}}, {{0, 1 << 20}}, 2, 16, 15), 1u);
}

TEST(CompactionTargets, HighSlotsMoveDownHighestTargetFirst) {
  EXPECT_EQ(compaction_targets({2, 3}, {}), (std::vector<int64_t>{1, 0}));
  EXPECT_EQ(compaction_targets({0, 3}, {}), (std::vector<int64_t>{-1, 1}));
  EXPECT_EQ(compaction_targets({0}, {}), (std::vector<int64_t>{-1}));
}

TEST(CompactionTargets, PrefillingSlotsAreNeverTargets) {
  EXPECT_EQ(compaction_targets({2, 3}, {1}), (std::vector<int64_t>{0, -1}));
}

std::string read_file(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

TEST(Parity, BatchedMixedMatchesTheGolden) {
  // __FILE__ is absolute under CMake; the golden lives in the repository beside the scenarios.
  std::string root = __FILE__;
  root = root.substr(0, root.rfind("/tests/cpp/"));
  const std::string path = root + "/tests/scenarios/batched_mixed.trace";
  const std::string golden = read_file(path);
  ASSERT_FALSE(golden.empty()) << "cannot read the golden trace " << path;
  EXPECT_EQ(testing::run_scenario(testing::batched_mixed_spec()), golden);
}

}  // namespace
}  // namespace met
