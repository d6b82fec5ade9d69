// Owns: which recurrent-state slot each sequence of a hybrid model holds (Qwen3.5 / Qwen3-Next:
// the conv and delta-rule state of every recurrent layer, one slot per sequence, in the device's
// state tensors). The slots are independent of the dense batch rows (Sequence::slot): a sequence
// keeps its state slot while its batch row is compacted, so no state moves.
// Called by: the scheduler's KvLedger at admission (allocate) and release (release); tests.
// Invariants (check_invariants): every slot is either free, once, or held by exactly one
// sequence; the holders' map and the slots' owners agree; free + held = the pool's size.
#pragma once

#include <cstdint>
#include <unordered_map>
#include <vector>

namespace met {

class StatePool {
 public:
  explicit StatePool(int32_t num_slots);

  // Gives `seq` the lowest free slot and returns it. Transition: free -> held by seq.
  // std::invalid_argument if seq holds one already, std::runtime_error if none is free (the
  // scheduler admits at most as many sequences as the pool has slots).
  int32_t allocate(uint64_t seq);
  // Transition: held by seq -> free. std::invalid_argument if seq holds none.
  void release(uint64_t seq);

  bool has(uint64_t seq) const { return held_.count(seq) != 0; }
  int32_t slot(uint64_t seq) const;  // std::invalid_argument if seq holds none
  int32_t num_slots() const { return static_cast<int32_t>(owner_.size()); }
  int32_t num_free() const { return static_cast<int32_t>(free_.size()); }

  // Throws std::logic_error naming the first broken invariant.
  void check_invariants() const;

 private:
  static constexpr uint64_t kNoOwner = ~uint64_t{0};
  std::vector<uint64_t> owner_;                 // per slot: its sequence, or kNoOwner
  std::vector<int32_t> free_;                   // free slots, highest first (pop = lowest)
  std::unordered_map<uint64_t, int32_t> held_;  // sequence -> slot
};

}  // namespace met
