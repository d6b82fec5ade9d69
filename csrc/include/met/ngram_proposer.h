// Owns: one sequence's prompt-lookup draft source: its token history (prompt + output) and, for
// every n-gram length n in [min_n, max_n], the most recent position each n-gram was followed by a
// token.
// Called by: the speculative decode strategy (scheduler_spec.cpp), once per accepted token
// (append) and once per decode step (propose).
// Invariants: an index entry for an n-gram always points at the token right after an earlier
// occurrence of it, so a proposal only ever copies tokens that stand in the history; append and
// propose cost O(max_n - min_n + 1) hash steps each, plus the k tokens copied, whatever the
// history length (the index is a hash map, filled one entry per n as each token arrives).
#pragma once

#include <cstddef>
#include <cstdint>
#include <unordered_map>
#include <vector>

namespace met {

struct NgramConfig {
  int32_t min_n = 2;  // shortest suffix that may match (the "minimum match length")
  int32_t max_n = 4;  // longest suffix tried first
};

class NgramProposer {
 public:
  explicit NgramProposer(NgramConfig cfg = {});

  // Adds tokens to the history (the prompt once the prefill is done, then each accepted token).
  void append(int32_t token);
  void append(const std::vector<int32_t>& tokens);

  // Up to k tokens that followed the most recent earlier occurrence of the history's longest
  // matching suffix (n from max_n down to min_n); empty when no suffix of length >= min_n recurs.
  std::vector<int32_t> propose(int32_t k) const;

  const std::vector<int32_t>& history() const { return history_; }

 private:
  uint64_t hash(size_t begin, int32_t n) const;
  bool same(size_t a, size_t b, int32_t n) const;

  NgramConfig cfg_;
  std::vector<int32_t> history_;
  // One map per n (index n - min_n): n-gram hash -> position of the token that followed it.
  std::vector<std::unordered_map<uint64_t, uint32_t>> index_;
};

}  // namespace met
