// Owns: one sequence's prompt-lookup draft index: for every n-gram length n in [min_n, max_n],
// the most recent position each n-gram of the request's tokens was followed by a token. The
// tokens themselves are the scheduler's (Live's prompt and output), read in place (TokenHistory).
// Called by: the speculative decode strategy (scheduler_spec.cpp), once per decode step and row
// (propose).
// Invariants: a history only grows (it is refused when shorter than what was indexed); an index
// entry for an n-gram always points at the token right after an earlier occurrence of it, so a
// proposal only ever copies tokens that stand in the history; indexing costs
// O(max_n - min_n + 1) hash steps per new token and propose as much plus the k tokens copied,
// whatever the history length (the index is a hash map, filled one entry per n per token).
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

// A request's tokens as the proposer reads them: its prompt, then its output.
struct TokenHistory {
  const std::vector<int32_t>& prompt;
  const std::vector<int32_t>& output;

  size_t size() const { return prompt.size() + output.size(); }
  int32_t operator[](size_t i) const {
    return i < prompt.size() ? prompt[i] : output[i - prompt.size()];
  }
};

class NgramProposer {
 public:
  explicit NgramProposer(NgramConfig cfg = {});

  // Up to k tokens that followed the most recent earlier occurrence of the history's longest
  // matching suffix (n from max_n down to min_n); empty when no suffix of length >= min_n recurs.
  // Indexes the tokens the history gained since the last call first. Throws std::logic_error
  // for a history shorter than the one indexed.
  std::vector<int32_t> propose(const TokenHistory& history, int32_t k);

  size_t indexed() const { return indexed_; }

 private:
  void index_up_to(const TokenHistory& history);

  NgramConfig cfg_;
  size_t indexed_ = 0;  // tokens of the history already in the index
  // One map per n (index n - min_n): n-gram hash -> position of the token that followed it.
  std::vector<std::unordered_map<uint64_t, uint32_t>> index_;
};

}  // namespace met
