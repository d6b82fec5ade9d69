// Owns: the barrier between the stages of the CPU forward's OpenMP team.
// Called by: llama_forward.cpp (one barrier per stage; the stages' `omp for` loops are nowait).
// Invariants: every thread of the team calls wait() the same number of times; a wait returns
//   only after all have arrived, with their earlier writes visible (acquire/release on the
//   generation counter).
//
// Why not OpenMP's own barrier: libgomp spins for a long while without yielding. A decode step
// has a few hundred barriers, and when the machine is busy with other work (more runnable threads
// than cores) a spinning waiter can hold the core the late thread needs, so each barrier costs a
// scheduler time slice: steps measured 10-40x slower under load. Here a waiter spins briefly (the
// quiet-machine case, where the others arrive within microseconds), then yields the core.
#pragma once

#include <atomic>
#include <thread>

#if defined(__x86_64__) || defined(_M_X64)
#include <immintrin.h>
#endif

namespace met::cpu {

class TeamBarrier {
 public:
  explicit TeamBarrier(int threads = 1) : threads_(threads) {}

  // Only while no thread is inside wait().
  void reset(int threads) {
    threads_ = threads;
    arrived_.store(0, std::memory_order_relaxed);
  }

  void wait() {
    if (threads_ <= 1) return;
    const unsigned generation = generation_.load(std::memory_order_acquire);
    if (arrived_.fetch_add(1, std::memory_order_acq_rel) == threads_ - 1) {
      arrived_.store(0, std::memory_order_relaxed);
      generation_.fetch_add(1, std::memory_order_release);
      return;
    }
    for (int spins = 0; generation_.load(std::memory_order_acquire) == generation; ++spins) {
      if (spins < kSpinsBeforeYield) {
        pause();
      } else {
        std::this_thread::yield();
      }
    }
  }

 private:
  // About 10-20 microseconds of pause instructions.
  static constexpr int kSpinsBeforeYield = 4096;

  static void pause() {
#if defined(__x86_64__) || defined(_M_X64)
    _mm_pause();
#endif
  }

  int threads_;
  std::atomic<int> arrived_{0};
  std::atomic<unsigned> generation_{0};
};

}  // namespace met::cpu
