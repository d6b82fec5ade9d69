// TeamBarrier: no thread leaves a phase before every thread has finished it, and what each wrote
// before the barrier is visible to all after it, over many phases in a row (the forward reuses
// one barrier for a few hundred stages per step).
#include <gtest/gtest.h>

#include <atomic>
#include <thread>
#include <vector>

#include "cpu/team_barrier.h"

namespace met::cpu {
namespace {

TEST(TeamBarrier, EveryThreadSeesThePhaseComplete) {
  constexpr int kThreads = 4;  // more than this machine's cores: waiters must yield
  constexpr int kPhases = 2000;
  TeamBarrier barrier(kThreads);
  std::vector<int> written(kThreads, 0);
  std::atomic<int> mismatches{0};
  std::vector<std::thread> team;
  for (int id = 0; id < kThreads; ++id) {
    team.emplace_back([&, id] {
      for (int phase = 1; phase <= kPhases; ++phase) {
        written[id] = phase;  // plain writes: the barrier must publish them
        barrier.wait();
        for (int other = 0; other < kThreads; ++other) {
          if (written[other] != phase) mismatches.fetch_add(1);
        }
        barrier.wait();  // nobody starts the next phase's write while others still read
      }
    });
  }
  for (std::thread& t : team) t.join();
  EXPECT_EQ(mismatches.load(), 0);
}

TEST(TeamBarrier, ResetChangesTheTeamSizeAndOneThreadNeverWaits) {
  TeamBarrier barrier(3);
  barrier.reset(1);
  barrier.wait();  // would hang if it still expected three threads
  barrier.reset(2);
  int value = 0;
  std::thread other([&] {
    value = 7;
    barrier.wait();
  });
  barrier.wait();
  EXPECT_EQ(value, 7);
  other.join();
}

}  // namespace
}  // namespace met::cpu
