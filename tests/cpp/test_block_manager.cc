// BlockManager: exact block ids, ref counts, LRU eviction of cached blocks, prefix-hit limits,
// all-or-nothing growth, stats, and a randomized run checked against a shadow of the KV contents.
// Every mutation goes through Checked, which runs check_invariants() after it.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <numeric>
#include <random>
#include <stdexcept>
#include <vector>

#include "met/block_manager.h"

namespace met {
namespace {

using Ids = std::vector<int32_t>;

// Tokens first, first+1, ..., first+n-1.
Ids seq_tokens(int32_t first, int32_t n) {
  Ids t(n);
  std::iota(t.begin(), t.end(), first);
  return t;
}

Ids concat(Ids a, const Ids& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

// Forwards to BlockManager and checks the invariants after every mutation.
struct Checked {
  BlockManager bm;
  Checked(int32_t n, int32_t bs, bool cache = true, bool reuse_before_fresh = false)
      : bm(n, bs, cache, reuse_before_fresh) {
    check();
  }
  void check() const { ASSERT_NO_THROW(bm.check_invariants()); }
  int32_t alloc(uint64_t s, const Ids& prompt) {
    const int32_t r = bm.allocate_prefix(s, prompt);
    check();
    return r;
  }
  bool grow(uint64_t s, int32_t n) {
    const bool r = bm.grow(s, n);
    check();
    return r;
  }
  void commit(uint64_t s, const Ids& t) {
    bm.commit(s, t);
    check();
  }
  void release(uint64_t s) {
    bm.release(s);
    check();
  }
  void reset() {
    bm.reset_prefix_cache();
    check();
  }
  void rollback(uint64_t s, int32_t n) {
    bm.rollback(s, n);
    check();
  }
  // A whole prefill: table from the cache, the rest allocated, every prompt token committed.
  int32_t prefill(uint64_t s, const Ids& prompt) {
    const int32_t cached = alloc(s, prompt);
    EXPECT_TRUE(grow(s, static_cast<int32_t>(prompt.size())));
    commit(s, prompt);
    return cached;
  }
  const Ids& table(uint64_t s) const { return bm.table(s); }
};

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

TEST(BlockHash, ChainsThroughTheParent) {
  const Ids t = seq_tokens(0, 4);
  EXPECT_EQ(hash_block(kRootBlockHash, t.data(), 4), hash_block(kRootBlockHash, t.data(), 4));
  EXPECT_NE(hash_block(kRootBlockHash, t.data(), 4), hash_block(1, t.data(), 4));
  const Ids u = {0, 1, 2, 4};
  EXPECT_NE(hash_block(kRootBlockHash, t.data(), 4), hash_block(kRootBlockHash, u.data(), 4));
  const Ids neg = {-1, 0, 0, 0}, big = {0, 0, 0, -1};
  EXPECT_NE(hash_block(kRootBlockHash, neg.data(), 4), hash_block(kRootBlockHash, big.data(), 4));
}

// Random admits, decode steps, releases and resets over a small vocabulary (so prefixes repeat).
// A shadow records, for every block, the token prefix whose KV it holds; every prefix hit must
// hand back blocks holding exactly the prompt's prefix.
void run_random(uint32_t seed, int32_t num_blocks, int32_t bs, bool cache,
                bool reuse_before_fresh = false) {
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937 rng(seed);
  auto rnd = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
  Checked m(num_blocks, bs, cache, reuse_before_fresh);
  std::map<uint64_t, Ids> live;          // seq -> tokens written so far
  std::vector<Ids> content(num_blocks);  // block -> prefix its KV holds (empty: unknown)
  const std::vector<Ids> stems = {seq_tokens(0, 3 * bs), seq_tokens(1, 2 * bs), {}};
  uint64_t next_seq = 1;
  for (int step = 0; step < 3000; ++step) {
    const int op = rnd(0, 9);
    if (op <= 2 || live.empty()) {  // admit a prompt: a shared stem plus a random tail
      Ids prompt = stems[rnd(0, 2)];
      for (int i = rnd(0, 2 * bs); i > 0; --i) prompt.push_back(rnd(0, 1));
      if (prompt.empty()) prompt.push_back(rnd(0, 1));
      const uint64_t s = next_seq++;
      const int32_t hit = m.alloc(s, prompt);
      ASSERT_EQ(hit % bs, 0);
      ASSERT_LT(hit, static_cast<int32_t>(prompt.size()));
      ASSERT_EQ(m.table(s).size(), size_t(hit / bs));
      if (!cache) ASSERT_EQ(hit, 0);
      for (int32_t j = 0; j < hit / bs; ++j) {
        const Ids want(prompt.begin(), prompt.begin() + (j + 1) * bs);
        ASSERT_EQ(content[m.table(s)[j]], want) << "wrong KV reused at block " << j;
      }
      const size_t before = m.table(s).size();
      const int32_t free_before = m.bm.num_free_blocks();
      if (!m.grow(s, static_cast<int32_t>(prompt.size()))) {
        ASSERT_EQ(m.table(s).size(), before);
        ASSERT_EQ(m.bm.num_free_blocks(), free_before);
        m.release(s);
        continue;
      }
      for (size_t j = before; j < m.table(s).size(); ++j) content[m.table(s)[j]].clear();
      m.commit(s, prompt);
      live[s] = prompt;
    } else if (op <= 6) {  // decode one token on a random live sequence
      auto it = std::next(live.begin(), rnd(0, int(live.size()) - 1));
      Ids& toks = it->second;
      const Ids old_table = m.table(it->first);
      if (!m.grow(it->first, static_cast<int32_t>(toks.size()) + 1)) {
        ASSERT_EQ(m.table(it->first), old_table);
        m.release(it->first);  // preempt
        live.erase(it);
        continue;
      }
      const Ids& t = m.table(it->first);
      ASSERT_TRUE(std::equal(old_table.begin(), old_table.end(), t.begin()));
      for (size_t j = old_table.size(); j < t.size(); ++j) content[t[j]].clear();
      toks.push_back(rnd(0, 1));
      m.commit(it->first, toks);
    } else if (op <= 8) {
      auto it = std::next(live.begin(), rnd(0, int(live.size()) - 1));
      m.release(it->first);
      live.erase(it);
    } else if (rnd(0, 20) == 0) {
      m.reset();
    }
    // Shadow: every full block a live sequence has written now holds that prefix.
    for (const auto& [s, toks] : live) {
      const Ids& t = m.table(s);
      for (size_t j = 0; j < toks.size() / bs; ++j) {
        const Ids want(toks.begin(), toks.begin() + (j + 1) * bs);
        Ids& c = content[t[j]];
        if (c.empty()) c = want;
        ASSERT_EQ(c, want) << "block " << t[j] << " shared by different prefixes";
      }
    }
  }
  for (const auto& [s, toks] : live) m.release(s);
  if (cache) EXPECT_GT(m.bm.prefix_hit_tokens(), 0);  // the run did exercise reuse
  EXPECT_EQ(m.bm.num_free_blocks(), num_blocks);
  EXPECT_EQ(m.bm.num_used_blocks(), 0);
}

TEST(BlockManagerRandom, InvariantsAndReusedContentHold) {
  for (uint32_t seed = 1; seed <= 6; ++seed) run_random(seed, 24, 2, true);
  run_random(7, 64, 4, true);
  run_random(8, 24, 2, false);
  for (uint32_t seed = 9; seed <= 12; ++seed) run_random(seed, 24, 2, true, true);
}

}  // namespace
}  // namespace met
