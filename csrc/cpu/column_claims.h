// Owns: the shared word through which one OpenMP team hands out the tails of its threads'
// column shares in matmul_acts_team.
// Called by: quant_matmul.cpp (claim), and the code that opens a team region and runs
// matmul_acts_team inside it (reset, then set_team_claims on every thread: llama_forward.cpp,
// quant_matmul).
// Invariants: the word's call number never decreases; once a thread sees a later call than its
//   own, or its call's next index at the pool's size, every pool index of its call has been
//   claimed exactly once. Every thread of the team makes the same sequence of matmul_acts_team
//   calls (they work-share), so a call's number names the same matmul on every thread.
//
// Why: a static split of the columns leaves one thread waiting at the next barrier whenever the
// other runs slower (a busy core, a noisy neighbour, the first thread's serial row work), and a
// decode step has a few hundred such barriers: perf on a 2-core Zen 3 VM put 14-17% of each
// thread's samples in the barrier spin at batch 1. Each thread still starts on its own
// contiguous share (its weight stream stays in file order); only the last eighth of each share
// goes to whichever thread gets there first. A column's arithmetic never depends on the thread
// that computes it, so the outputs are the same bits.
#pragma once

#include <atomic>
#include <cstdint>

namespace met::cpu {

class ColumnClaims {
 public:
  // Only while no thread of the team is inside a matmul.
  void reset() { word_.store(0, std::memory_order_relaxed); }

  // The next unclaimed index in [0, pool) of matmul number `call` (1, 2, ... on every thread),
  // or -1 once all are claimed.
  int64_t claim(uint32_t call, int64_t pool) {
    uint64_t seen = word_.load(std::memory_order_acquire);
    for (;;) {
      const auto at = static_cast<uint32_t>(seen >> 32);
      // A thread reached a later call only after this one's pool ran out.
      if (at > call) return -1;
      const int64_t next = at == call ? static_cast<int64_t>(seen & 0xFFFFFFFFu) : 0;
      if (next >= pool) return -1;
      const uint64_t want = uint64_t{call} << 32 | static_cast<uint64_t>(next + 1);
      if (word_.compare_exchange_weak(seen, want, std::memory_order_acq_rel,
                                      std::memory_order_acquire)) {
        return next;
      }
    }
  }

 private:
  std::atomic<uint64_t> word_{0};
};

// The calling thread's team claims for the matmul_acts_team calls it makes until the next
// set (nullptr: each thread computes exactly its static share), numbering them from 1.
void set_team_claims(ColumnClaims* claims);

}  // namespace met::cpu
