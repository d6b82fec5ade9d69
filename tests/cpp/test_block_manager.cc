// BlockManager: exact block ids, ref counts, LRU eviction of cached blocks, prefix-hit limits,
// all-or-nothing growth and stats (the randomized run is test_block_manager_random.cc).
// Every mutation goes through Checked, which runs check_invariants() after it.
#include <gtest/gtest.h>

#include <stdexcept>

#include "block_manager_checked.h"

namespace met {
namespace {

using test::Checked;
using test::concat;
using test::Ids;
using test::seq_tokens;

TEST(BlockManager, FreshAllocationHandsOutAscendingIds) {
  Checked m(8, 4);
  EXPECT_EQ(m.bm.num_total_blocks(), 8);
  EXPECT_EQ(m.bm.block_size(), 4);
  EXPECT_EQ(m.alloc(1, seq_tokens(0, 10)), 0);
  EXPECT_TRUE(m.table(1).empty());
  EXPECT_TRUE(m.grow(1, 10));
  EXPECT_EQ(m.table(1), (Ids{0, 1, 2}));
  EXPECT_EQ(m.alloc(2, seq_tokens(100, 3)), 0);
  EXPECT_TRUE(m.grow(2, 3));
  EXPECT_EQ(m.table(2), (Ids{3}));
  EXPECT_EQ(m.bm.num_used_blocks(), 4);
  EXPECT_EQ(m.bm.num_free_blocks(), 4);
  EXPECT_EQ(m.bm.num_cached_blocks(), 0);
}

TEST(BlockManager, GrowCoversCeilAndOnlyAppends) {
  Checked m(8, 4);
  m.alloc(1, {});
  EXPECT_TRUE(m.grow(1, 0));
  EXPECT_TRUE(m.table(1).empty());
  EXPECT_TRUE(m.grow(1, 1));
  EXPECT_EQ(m.table(1), (Ids{0}));
  EXPECT_TRUE(m.grow(1, 4));  // still one block
  EXPECT_EQ(m.table(1), (Ids{0}));
  EXPECT_TRUE(m.grow(1, 5));
  EXPECT_EQ(m.table(1), (Ids{0, 1}));
  EXPECT_TRUE(m.grow(1, 2));  // never shrinks
  EXPECT_EQ(m.table(1), (Ids{0, 1}));
}

TEST(BlockManager, GrowIsAllOrNothingOnExhaustion) {
  Checked m(4, 4);
  m.alloc(1, {});
  ASSERT_TRUE(m.grow(1, 12));
  m.alloc(2, {});
  ASSERT_TRUE(m.grow(2, 1));
  EXPECT_EQ(m.table(2), (Ids{3}));
  EXPECT_FALSE(m.grow(2, 9));  // needs 2 more, 0 free
  EXPECT_EQ(m.table(2), (Ids{3}));
  EXPECT_EQ(m.bm.num_free_blocks(), 0);
  m.release(1);
  EXPECT_FALSE(m.grow(2, 17));  // needs 4 more, 3 free: nothing taken
  EXPECT_EQ(m.table(2), (Ids{3}));
  EXPECT_EQ(m.bm.num_free_blocks(), 3);
  EXPECT_TRUE(m.grow(2, 16));
  EXPECT_EQ(m.table(2), (Ids{3, 0, 1, 2}));
}

TEST(BlockManager, ReleasedPlainBlocksAreReusedFirstInTableOrder) {
  Checked m(6, 4, /*cache=*/false);
  m.alloc(1, {});
  ASSERT_TRUE(m.grow(1, 8));  // 0, 1
  m.alloc(2, {});
  ASSERT_TRUE(m.grow(2, 8));  // 2, 3
  m.release(2);
  m.release(1);
  EXPECT_FALSE(m.bm.has(1));
  EXPECT_EQ(m.bm.num_free_blocks(), 6);
  m.alloc(3, {});
  ASSERT_TRUE(m.grow(3, 24));
  EXPECT_EQ(m.table(3), (Ids{0, 1, 2, 3, 4, 5}));
}

TEST(BlockManager, SharedPrefixCountsRefsAndRevivesCachedBlocks) {
  Checked m(8, 4);
  const Ids prefix = seq_tokens(0, 8);
  EXPECT_EQ(m.prefill(1, concat(prefix, {50})), 0);
  EXPECT_EQ(m.table(1), (Ids{0, 1, 2}));
  EXPECT_EQ(m.prefill(2, concat(prefix, {60, 61})), 8);
  EXPECT_EQ(m.table(2), (Ids{0, 1, 3}));
  EXPECT_EQ(m.bm.ref_count(0), 2);
  EXPECT_EQ(m.bm.ref_count(1), 2);
  EXPECT_EQ(m.bm.ref_count(2), 1);
  EXPECT_EQ(m.bm.ref_count(3), 1);

  m.release(1);  // 0 and 1 stay used by 2; 2 (partial, unhashed) becomes plain free
  EXPECT_EQ(m.bm.ref_count(0), 1);
  EXPECT_EQ(m.bm.ref_count(2), 0);
  EXPECT_EQ(m.bm.num_cached_blocks(), 0);
  m.release(2);
  EXPECT_EQ(m.bm.num_cached_blocks(), 2);  // 0, 1 hashed and free
  EXPECT_EQ(m.bm.num_free_blocks(), 8);

  EXPECT_EQ(m.alloc(3, concat(prefix, {70})), 8);  // free(cached) -> used
  EXPECT_EQ(m.table(3), (Ids{0, 1}));
  EXPECT_EQ(m.bm.num_cached_blocks(), 0);
  EXPECT_EQ(m.bm.num_free_blocks(), 6);
  EXPECT_EQ(m.bm.ref_count(0), 1);
}

TEST(BlockManager, HitNeverCoversTheLastPromptToken) {
  Checked m(8, 4);
  const Ids p = seq_tokens(0, 12);  // exactly 3 blocks
  m.prefill(1, p);
  m.release(1);
  EXPECT_EQ(m.bm.num_cached_blocks(), 3);
  EXPECT_EQ(m.alloc(2, p), 8);  // k*bs tokens hit k-1 blocks
  EXPECT_EQ(m.table(2), (Ids{0, 1}));
  EXPECT_EQ(m.alloc(3, concat(p, {99})), 12);  // one more token: all three
  EXPECT_EQ(m.alloc(4, seq_tokens(0, 4)), 0);  // a single full block: nothing
  EXPECT_EQ(m.alloc(5, seq_tokens(0, 5)), 4);
  EXPECT_EQ(m.alloc(6, {}), 0);
}

TEST(BlockManager, HitNeedsTheWholeChainFromBlockZero) {
  Checked m(8, 4);
  m.prefill(1, concat(seq_tokens(0, 8), {1}));
  m.release(1);
  // Block 1's tokens at position 0 have a different parent: no hit.
  EXPECT_EQ(m.alloc(2, concat(seq_tokens(4, 4), {1, 2})), 0);
  // Same first block, different second: the hit stops after block 0.
  EXPECT_EQ(m.alloc(3, concat(seq_tokens(0, 4), seq_tokens(40, 5))), 4);
}

TEST(BlockManager, CachedBlocksAreEvictedLeastRecentlyReleasedTailFirst) {
  Checked m(6, 2);
  const Ids a = seq_tokens(0, 4), b = seq_tokens(10, 4);
  m.prefill(1, a);  // 0, 1
  m.prefill(2, b);  // 2, 3
  m.release(1);
  m.release(2);
  // Free list: 4, 5 (plain), then 1, 0 (a, tail first), then 3, 2 (b).
  EXPECT_EQ(m.bm.num_cached_blocks(), 4);
  m.alloc(3, {});
  ASSERT_TRUE(m.grow(3, 6));
  EXPECT_EQ(m.table(3), (Ids{4, 5, 1}));  // plain first, then a's tail evicted
  EXPECT_EQ(m.bm.num_cached_blocks(), 3);
  EXPECT_EQ(m.alloc(4, concat(a, {7})), 2);  // a's head still cached
  EXPECT_EQ(m.table(4), (Ids{0}));
  EXPECT_EQ(m.alloc(5, concat(b, {7})), 4);  // b untouched
  EXPECT_EQ(m.table(5), (Ids{2, 3}));
  m.release(5);  // b again most recent: 3, 2 to the back
  m.release(4);  // a's head after it
  EXPECT_EQ(m.bm.num_free_blocks(), 3);
  m.alloc(6, {});
  ASSERT_TRUE(m.grow(6, 4));
  EXPECT_EQ(m.table(6), (Ids{3, 2}));  // b, released before a, goes first
  EXPECT_EQ(m.alloc(7, concat(a, {7})), 2);
  EXPECT_EQ(m.alloc(8, concat(b, {7})), 0);
}

TEST(BlockManager, ReuseBeforeFreshEvictsCachedBlocksBeforeTouchingNewOnes) {
  // The CPU pool's policy: a released sequence's cached blocks are reused before any block that
  // was never written, so the touched (resident) part of the pool stays at the peak in use.
  for (const bool reuse : {false, true}) {
    SCOPED_TRACE(reuse ? "reuse before fresh" : "fresh first");
    Checked m(8, 2, true, reuse);
    const Ids a = seq_tokens(0, 4);
    m.prefill(1, a);  // 0, 1, both cached on release
    m.release(1);
    m.alloc(2, {});
    ASSERT_TRUE(m.grow(2, 4));
    EXPECT_EQ(m.table(2), reuse ? (Ids{1, 0}) : (Ids{2, 3}));  // tail first, as eviction goes
    EXPECT_EQ(m.bm.num_touched_blocks(), reuse ? 2 : 4);
    ASSERT_TRUE(m.grow(2, 8));  // nothing cached is left: fresh blocks either way
    EXPECT_EQ(m.bm.num_touched_blocks(), reuse ? 4 : 6);
    m.release(2);
    // A plain block freed by a sequence still comes before everything else.
    m.alloc(3, {});
    ASSERT_TRUE(m.grow(3, 1));
    EXPECT_EQ(m.bm.num_touched_blocks(), reuse ? 4 : 6);
  }
}

TEST(BlockManager, CommitHashesOnlyNewlyCompletedFullBlocks) {
  Checked m(8, 4);
  m.alloc(1, seq_tokens(0, 3));
  ASSERT_TRUE(m.grow(1, 3));
  m.commit(1, seq_tokens(0, 3));  // partial: nothing hashed
  ASSERT_TRUE(m.grow(1, 6));
  m.commit(1, seq_tokens(0, 6));  // block 0 completes during decode
  m.commit(1, seq_tokens(0, 6));  // idempotent
  m.release(1);
  EXPECT_EQ(m.bm.num_cached_blocks(), 1);
  EXPECT_EQ(m.alloc(2, seq_tokens(0, 9)), 4);
  EXPECT_EQ(m.table(2), (Ids{0}));
}

// A verify writes 1 + k positions before knowing how many stand: the table grows for all of
// them, the rejected ones are rolled back (the blocks stay, to be overwritten), and only the
// accepted tokens are ever committed, so a rejected token never reaches the prefix cache.
TEST(BlockManager, VerifyRollbackKeepsBlocksAndHashesOnlyAcceptedTokens) {
  Checked m(8, 4);
  m.prefill(1, seq_tokens(0, 3));
  ASSERT_TRUE(m.grow(1, 8));  // pending token + 4 drafts at positions 3..7
  EXPECT_EQ(m.table(1), (Ids{0, 1}));
  m.rollback(1, 5);  // pending + 1 accepted draft stand
  EXPECT_EQ(m.table(1), (Ids{0, 1}));
  EXPECT_EQ(m.bm.num_used_blocks(), 2);
  const Ids accepted{0, 1, 2, 3, 4};
  m.commit(1, accepted);  // block 0 (0 1 2 3) completes and is hashed; block 1 is not full
  const Ids next = concat(accepted, Ids{50, 51, 52});  // the next forward overwrites 5..7
  ASSERT_TRUE(m.grow(1, 8));
  m.commit(1, next);
  m.release(1);
  EXPECT_EQ(m.bm.num_cached_blocks(), 2);
  // The cache holds what stood, never a rejected draft: 0..3 then 4 50 51 52.
  EXPECT_EQ(m.alloc(2, concat(next, Ids{9})), 8);
  EXPECT_EQ(m.alloc(3, concat(seq_tokens(0, 8), Ids{9})), 4);
}

TEST(BlockManager, RollbackRefusesHashedSharedOrMissingPositions) {
  Checked m(8, 4);
  m.prefill(1, seq_tokens(0, 8));  // two full, hashed blocks
  EXPECT_THROW(m.bm.rollback(1, 6), std::logic_error);
  EXPECT_THROW(m.bm.rollback(1, 9), std::invalid_argument);
  m.check();
  EXPECT_NO_THROW(m.rollback(1, 8));
  m.release(1);
  m.alloc(2, seq_tokens(0, 9));  // shares block 0 with the cache entry, revived
  ASSERT_TRUE(m.grow(2, 9));
  m.alloc(3, seq_tokens(0, 5));
  ASSERT_TRUE(m.grow(3, 5));
  EXPECT_EQ(m.bm.ref_count(m.table(3)[0]), 2);
  EXPECT_THROW(m.bm.rollback(3, 2), std::logic_error);  // block 0 is not its own to overwrite
  EXPECT_NO_THROW(m.rollback(3, 4));
}

TEST(BlockManager, ConcurrentSamePrefixLeavesADuplicateUnhashed) {
  Checked m(8, 4);
  const Ids p = seq_tokens(0, 5);
  EXPECT_EQ(m.alloc(1, p), 0);
  EXPECT_EQ(m.alloc(2, p), 0);  // 1 has not committed yet
  ASSERT_TRUE(m.grow(1, 5));    // 0, 1
  ASSERT_TRUE(m.grow(2, 5));    // 2, 3
  m.commit(1, p);
  m.commit(2, p);  // block 2 would carry block 0's hash: stays unhashed
  m.release(2);
  EXPECT_EQ(m.bm.num_cached_blocks(), 0);  // 2 and 3 plain
  m.release(1);
  EXPECT_EQ(m.bm.num_cached_blocks(), 1);
  EXPECT_EQ(m.alloc(3, p), 4);
  EXPECT_EQ(m.table(3), (Ids{0}));
  ASSERT_TRUE(m.grow(3, 12));
  // Plain blocks come back first, the latest released (1, the partial block of 1) in front.
  EXPECT_EQ(m.table(3), (Ids{0, 1, 2}));
}

// The same prompt again hits its full blocks and recomputes its partial one; when that block
// completes it takes the hash from the free cached copy, so the pool's reuse of cached blocks
// (which would evict that copy next) does not lose the prefix the live block still holds.
TEST(BlockManager, RecomputedBlockTakesTheHashFromItsFreeCachedCopy) {
  for (const bool reuse : {false, true}) {
    SCOPED_TRACE(reuse ? "reuse before fresh" : "fresh first");
    Checked m(8, 4, true, reuse);
    const Ids p = seq_tokens(0, 6), out = seq_tokens(0, 12);
    m.prefill(1, p);  // blocks 0, 1
    ASSERT_TRUE(m.grow(1, 9));
    m.commit(1, Ids(out.begin(), out.begin() + 8));  // the decode completes block 1
    m.release(1);
    EXPECT_EQ(m.bm.num_cached_blocks(), 2);
    EXPECT_EQ(m.alloc(2, p), 4);  // block 0; positions 4.. again
    ASSERT_TRUE(m.grow(2, 8));
    const int32_t again = m.table(2)[1];
    m.commit(2, Ids(out.begin(), out.begin() + 8));
    EXPECT_EQ(m.bm.num_cached_blocks(), 0);  // the free copy (block 1) is plain now
    ASSERT_TRUE(m.grow(2, 12));  // the front block: that copy, its hash no longer lost to it
    m.commit(2, out);
    m.release(2);
    EXPECT_EQ(m.alloc(3, out), 8);
    EXPECT_EQ(m.table(3), (Ids{0, again}));
  }
}

TEST(BlockManager, StatsCountQueriedAndHitTokens) {
  Checked m(8, 4);
  m.prefill(1, seq_tokens(0, 9));
  EXPECT_EQ(m.bm.prefix_queried_tokens(), 9);
  EXPECT_EQ(m.bm.prefix_hit_tokens(), 0);
  m.prefill(2, seq_tokens(0, 10));
  EXPECT_EQ(m.bm.prefix_queried_tokens(), 19);
  EXPECT_EQ(m.bm.prefix_hit_tokens(), 8);
}

TEST(BlockManager, DisabledCacheNeverHitsNorCounts) {
  Checked m(8, 4, /*cache=*/false);
  EXPECT_FALSE(m.bm.prefix_cache_enabled());
  m.prefill(1, seq_tokens(0, 9));
  m.release(1);
  EXPECT_EQ(m.bm.num_cached_blocks(), 0);
  EXPECT_EQ(m.prefill(2, seq_tokens(0, 9)), 0);
  EXPECT_EQ(m.table(2), (Ids{0, 1, 2}));
  EXPECT_EQ(m.bm.prefix_queried_tokens(), 0);
  EXPECT_EQ(m.bm.prefix_hit_tokens(), 0);
}

TEST(BlockManager, ResetDropsFreeHashesOnly) {
  Checked m(8, 4);
  m.prefill(1, seq_tokens(0, 9));   // 0, 1 hashed, 2 partial
  m.prefill(2, seq_tokens(50, 9));  // 3, 4 hashed, 5 partial
  m.release(1);
  EXPECT_EQ(m.bm.num_cached_blocks(), 2);
  m.reset();
  EXPECT_EQ(m.bm.num_cached_blocks(), 0);
  EXPECT_EQ(m.bm.num_free_blocks(), 5);
  EXPECT_EQ(m.alloc(3, seq_tokens(0, 9)), 0);
  EXPECT_EQ(m.alloc(4, seq_tokens(50, 9)), 8);  // 2 is alive: its blocks kept their hashes
  EXPECT_EQ(m.table(4), (Ids{3, 4}));
}

TEST(BlockManager, RejectsMisuse) {
  EXPECT_THROW(BlockManager(-1, 4), std::invalid_argument);
  EXPECT_THROW(BlockManager(4, 0), std::invalid_argument);
  Checked m(4, 4);
  m.alloc(1, {});
  EXPECT_THROW(m.bm.allocate_prefix(1, {}), std::invalid_argument);
  EXPECT_THROW(m.bm.grow(2, 4), std::invalid_argument);
  EXPECT_THROW(m.bm.grow(1, -1), std::invalid_argument);
  EXPECT_THROW(m.bm.release(2), std::invalid_argument);
  EXPECT_THROW(m.bm.table(2), std::invalid_argument);
  EXPECT_THROW(m.bm.commit(1, seq_tokens(0, 1)), std::invalid_argument);  // past the table
  EXPECT_THROW(m.bm.ref_count(4), std::invalid_argument);
  m.check();
}

TEST(BlockManager, ZeroBlocksIsUsable) {
  Checked m(0, 4);
  m.alloc(1, seq_tokens(0, 9));
  EXPECT_TRUE(m.grow(1, 0));
  EXPECT_FALSE(m.grow(1, 1));
  m.release(1);
}

}  // namespace
}  // namespace met
