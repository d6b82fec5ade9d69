// BlockManager::check_invariants: the whole-state consistency check run by the tests after every
// operation and by the engine when idle. Kept apart so block_manager.cpp reads as the policy.
#include <stdexcept>
#include <string>
#include <vector>

#include "met/block_manager.h"

namespace met {

namespace {
[[noreturn]] void fail(const std::string& what) {
  throw std::logic_error("BlockManager invariant violated: " + what);
}
std::string blk(int32_t b) { return "block " + std::to_string(b); }
}  // namespace

void BlockManager::check_invariants() const {
  const int32_t n = num_total_blocks();
  if (int32_t(prev_.size()) != n + 1 || int32_t(next_.size()) != n + 1) fail("link array sizes");

  // Ref counts equal the number of tables holding each block.
  std::vector<int32_t> holders(n, 0);
  for (const auto& [seq, st] : seqs_) {
    const std::string who = "sequence " + std::to_string(seq);
    for (int32_t b : st.table) {
      if (b < 0 || b >= n) fail(who + " holds out-of-range " + blk(b));
      ++holders[b];
    }
    if (st.hashed_blocks < 0 || size_t(st.hashed_blocks) > st.table.size())
      fail(who + " has hashed_blocks beyond its table");
    if (!enable_prefix_cache_ && st.hashed_blocks != 0) fail(who + " hashed with the cache off");
  }
  int32_t used = 0;
  for (int32_t b = 0; b < n; ++b) {
    if (blocks_[b].ref != holders[b])
      fail(blk(b) + " ref " + std::to_string(blocks_[b].ref) + " but held by " +
           std::to_string(holders[b]) + " tables");
    if (blocks_[b].ref > 0) ++used;
  }

  // The free list holds exactly the ref-0 blocks, once each, plain before cached.
  std::vector<char> seen(n, 0);
  int32_t free_count = 0, cached_count = 0;
  int32_t first_cached = sentinel();
  bool in_cached_region = false;
  int32_t prev = sentinel();
  for (int32_t b = next_[sentinel()]; b != sentinel(); prev = b, b = next_[b]) {
    if (b < 0 || b >= n) fail("free list links to out-of-range " + blk(b));
    if (prev_[b] != prev) fail("free list back link broken at " + blk(b));
    if (seen[b]) fail(blk(b) + " twice in the free list");
    seen[b] = 1;
    if (blocks_[b].ref != 0) fail(blk(b) + " in the free list with ref > 0");
    ++free_count;
    if (blocks_[b].hashed) {
      if (!in_cached_region) first_cached = b;
      in_cached_region = true;
      ++cached_count;
    } else if (in_cached_region) {
      fail("plain " + blk(b) + " after a cached block in the free list");
    }
    if (free_count > n) fail("free list cycle");
  }
  if (prev_[sentinel()] != prev) fail("free list tail link broken");
  for (int32_t b = 0; b < n; ++b)
    if (blocks_[b].ref == 0 && !seen[b]) fail("free " + blk(b) + " missing from the free list");
  if (free_count != num_free_)
    fail("num_free " + std::to_string(num_free_) + " but list holds " + std::to_string(free_count));
  if (cached_count != num_cached_free_)
    fail("num_cached " + std::to_string(num_cached_free_) + " but list holds " +
         std::to_string(cached_count));
  if (used + free_count != n) fail("used + free != total");
  if (first_cached_ != first_cached)
    fail("first cached block recorded as " + std::to_string(first_cached_) + ", list has " +
         std::to_string(first_cached));
  int32_t touched = 0;
  for (int32_t b = 0; b < n; ++b) {
    touched += blocks_[b].touched;
    if ((blocks_[b].ref > 0 || blocks_[b].hashed) && !blocks_[b].touched)
      fail(blk(b) + " used or cached but never handed out");
  }
  if (touched != num_touched_) fail("num_touched disagrees with the blocks");

  // The hash map and the block hashes agree both ways.
  if (!enable_prefix_cache_ && !cache_.empty()) fail("cache entries with the prefix cache off");
  int32_t hashed = 0;
  for (int32_t b = 0; b < n; ++b) {
    if (!blocks_[b].hashed) continue;
    ++hashed;
    auto it = cache_.find(blocks_[b].hash);
    if (it == cache_.end() || it->second != b)
      fail("hashed " + blk(b) + " is not its hash's entry");
  }
  if (size_t(hashed) != cache_.size())
    fail("cache has " + std::to_string(cache_.size()) + " entries but " + std::to_string(hashed) +
         " hashed blocks");
  for (const auto& [h, b] : cache_)
    if (b < 0 || b >= n || !blocks_[b].hashed || blocks_[b].hash != h)
      fail("cache entry points to " + blk(b) + " not carrying its hash");

  if (hit_tokens_ < 0 || hit_tokens_ > queried_tokens_) fail("prefix stats: hits > queries");
}

}  // namespace met
