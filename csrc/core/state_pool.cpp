// The recurrent-state slots of a hybrid model's sequences (met/state_pool.h).
#include "met/state_pool.h"

#include <algorithm>
#include <functional>
#include <stdexcept>
#include <string>

namespace met {
namespace {
std::string seq_name(uint64_t seq) { return "sequence " + std::to_string(seq); }
}  // namespace

StatePool::StatePool(int32_t num_slots) {
  if (num_slots < 0) throw std::invalid_argument("StatePool: num_slots must be >= 0");
  owner_.assign(static_cast<size_t>(num_slots), kNoOwner);
  for (int32_t s = num_slots - 1; s >= 0; --s) free_.push_back(s);
}

int32_t StatePool::allocate(uint64_t seq) {
  if (has(seq)) throw std::invalid_argument("StatePool: " + seq_name(seq) + " holds a slot");
  if (free_.empty()) {
    throw std::runtime_error("StatePool: all " + std::to_string(num_slots()) +
                             " recurrent-state slots are held");
  }
  const int32_t s = free_.back();
  free_.pop_back();
  owner_[static_cast<size_t>(s)] = seq;
  held_.emplace(seq, s);
  return s;
}

void StatePool::release(uint64_t seq) {
  const int32_t s = slot(seq);
  held_.erase(seq);
  owner_[static_cast<size_t>(s)] = kNoOwner;
  // Highest first, so the next allocate takes the lowest free slot.
  free_.insert(std::upper_bound(free_.begin(), free_.end(), s, std::greater<>()), s);
}

int32_t StatePool::slot(uint64_t seq) const {
  auto it = held_.find(seq);
  if (it == held_.end()) throw std::invalid_argument("StatePool: " + seq_name(seq) + " holds none");
  return it->second;
}

void StatePool::check_invariants() const {
  auto fail = [](const std::string& what) {
    throw std::logic_error("StatePool invariant violated: " + what);
  };
  const auto n = static_cast<int32_t>(owner_.size());
  std::vector<char> seen(owner_.size(), 0);
  for (size_t i = 0; i < free_.size(); ++i) {
    const int32_t s = free_[i];
    if (s < 0 || s >= n) fail("free slot " + std::to_string(s) + " out of range");
    if (seen[static_cast<size_t>(s)]++) fail("slot " + std::to_string(s) + " free twice");
    if (owner_[static_cast<size_t>(s)] != kNoOwner)
      fail("free slot " + std::to_string(s) + " held");
    if (i > 0 && free_[i - 1] <= s) fail("free slots out of order");
  }
  for (const auto& [seq, s] : held_) {
    if (s < 0 || s >= n) fail(seq_name(seq) + " holds out-of-range slot " + std::to_string(s));
    if (seen[static_cast<size_t>(s)]++) fail("slot " + std::to_string(s) + " free and held");
    if (owner_[static_cast<size_t>(s)] != seq) {
      fail("slot " + std::to_string(s) + " held by " + seq_name(seq) + " records another owner");
    }
  }
  if (static_cast<int32_t>(free_.size() + held_.size()) != n) fail("free + held != slots");
}

}  // namespace met
