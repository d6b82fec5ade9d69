// The block-manager tests' helpers: token runs, and Checked, which forwards every mutation to a
// BlockManager and runs check_invariants() after it.
#pragma once

#include <gtest/gtest.h>

#include <numeric>
#include <vector>

#include "met/block_manager.h"

namespace met::test {

using Ids = std::vector<int32_t>;

// Tokens first, first+1, ..., first+n-1.
inline Ids seq_tokens(int32_t first, int32_t n) {
  Ids t(n);
  std::iota(t.begin(), t.end(), first);
  return t;
}

inline Ids concat(Ids a, const Ids& b) {
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

}  // namespace met::test
