// StatePool: a hybrid model's recurrent-state slots; check_invariants() after every mutation.
#include <gtest/gtest.h>

#include <stdexcept>

#include "met/state_pool.h"

namespace met {
namespace {

TEST(StatePool, HandsOutTheLowestFreeSlotAndTakesItBack) {
  StatePool p(3);
  EXPECT_EQ(p.allocate(10), 0);
  EXPECT_EQ(p.allocate(11), 1);
  EXPECT_EQ(p.allocate(12), 2);
  p.check_invariants();
  EXPECT_EQ(p.num_free(), 0);
  EXPECT_THROW(p.allocate(13), std::runtime_error);
  p.release(11);
  p.release(10);
  p.check_invariants();
  EXPECT_EQ(p.allocate(14), 0);  // the lowest free, whatever the release order
  EXPECT_EQ(p.slot(12), 2);
  EXPECT_TRUE(p.has(14) && !p.has(10));
  p.release(14);
  p.release(12);
  p.check_invariants();
  EXPECT_EQ(p.num_free(), 3);
}

TEST(StatePool, RefusesMisuse) {
  StatePool p(2);
  EXPECT_EQ(p.allocate(1), 0);
  EXPECT_THROW(p.allocate(1), std::invalid_argument);  // one slot a sequence
  EXPECT_THROW(p.release(2), std::invalid_argument);
  EXPECT_THROW(p.slot(2), std::invalid_argument);
  EXPECT_THROW(StatePool(-1), std::invalid_argument);
  p.check_invariants();
  EXPECT_EQ(p.num_free(), 1);
}

}  // namespace
}  // namespace met
