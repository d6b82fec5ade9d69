// BlockManager under random admits, decode steps, releases and resets, checked against a shadow
// of the KV contents; and the block hash's chaining.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "block_manager_checked.h"

namespace met {
namespace {

using test::Checked;
using test::Ids;
using test::seq_tokens;

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
