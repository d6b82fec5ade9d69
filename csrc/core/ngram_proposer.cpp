// Prompt-lookup drafting: the n-gram index of met/ngram_proposer.h.
#include "met/ngram_proposer.h"

#include <algorithm>
#include <stdexcept>

#include "met/mix64.h"

namespace met {

NgramProposer::NgramProposer(NgramConfig cfg) : cfg_(cfg) {
  if (cfg_.min_n < 1 || cfg_.max_n < cfg_.min_n) {
    throw std::invalid_argument("NgramProposer: need 1 <= min_n <= max_n");
  }
  index_.resize(static_cast<size_t>(cfg_.max_n - cfg_.min_n + 1));
}

uint64_t NgramProposer::hash(size_t begin, int32_t n) const {
  uint64_t h = static_cast<uint64_t>(n);
  for (int32_t i = 0; i < n; ++i) h = mix64(h ^ static_cast<uint32_t>(history_[begin + i]));
  return h;
}

bool NgramProposer::same(size_t a, size_t b, int32_t n) const {
  return std::equal(history_.begin() + a, history_.begin() + a + n, history_.begin() + b);
}

// The new token completes, for each n, the n-gram that ends right before it: that n-gram's most
// recent continuation is now this position (a later occurrence overwrites an earlier one, so
// proposals follow the freshest context).
void NgramProposer::append(int32_t token) {
  history_.push_back(token);
  const size_t pos = history_.size() - 1;
  for (int32_t n = cfg_.min_n; n <= cfg_.max_n; ++n) {
    if (pos < static_cast<size_t>(n)) break;
    index_[n - cfg_.min_n][hash(pos - n, n)] = static_cast<uint32_t>(pos);
  }
}

void NgramProposer::append(const std::vector<int32_t>& tokens) {
  for (int32_t t : tokens) append(t);
}

std::vector<int32_t> NgramProposer::propose(int32_t k) const {
  const size_t len = history_.size();
  if (k <= 0) return {};
  for (int32_t n = cfg_.max_n; n >= cfg_.min_n; --n) {
    if (len <= static_cast<size_t>(n)) continue;
    const auto& map = index_[n - cfg_.min_n];
    auto it = map.find(hash(len - n, n));
    if (it == map.end()) continue;
    const size_t next = it->second;
    // A hash collision would draft unrelated tokens: cheap to rule out, the n-gram is short.
    if (!same(next - n, len - n, n)) continue;
    const size_t end = std::min(len, next + static_cast<size_t>(k));
    return {history_.begin() + next, history_.begin() + end};
  }
  return {};
}

}  // namespace met
