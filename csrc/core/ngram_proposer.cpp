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

namespace {

uint64_t hash(const TokenHistory& h, size_t begin, int32_t n) {
  uint64_t out = static_cast<uint64_t>(n);
  for (int32_t i = 0; i < n; ++i) out = mix64(out ^ static_cast<uint32_t>(h[begin + i]));
  return out;
}

bool same(const TokenHistory& h, size_t a, size_t b, int32_t n) {
  for (int32_t i = 0; i < n; ++i) {
    if (h[a + i] != h[b + i]) return false;
  }
  return true;
}

}  // namespace

// Each new token completes, for each n, the n-gram that ends right before it: that n-gram's most
// recent continuation is now this position (a later occurrence overwrites an earlier one, so
// proposals follow the freshest context).
void NgramProposer::index_up_to(const TokenHistory& history) {
  if (history.size() < indexed_) {
    throw std::logic_error("NgramProposer: the history shrank below what was indexed");
  }
  for (; indexed_ < history.size(); ++indexed_) {
    const size_t pos = indexed_;
    for (int32_t n = cfg_.min_n; n <= cfg_.max_n; ++n) {
      if (pos < static_cast<size_t>(n)) break;
      index_[n - cfg_.min_n][hash(history, pos - n, n)] = static_cast<uint32_t>(pos);
    }
  }
}

std::vector<int32_t> NgramProposer::propose(const TokenHistory& history, int32_t k) {
  index_up_to(history);
  const size_t len = history.size();
  if (k <= 0) return {};
  for (int32_t n = cfg_.max_n; n >= cfg_.min_n; --n) {
    if (len <= static_cast<size_t>(n)) continue;
    const auto& map = index_[n - cfg_.min_n];
    auto it = map.find(hash(history, len - n, n));
    if (it == map.end()) continue;
    const size_t next = it->second;
    // A hash collision would draft unrelated tokens: cheap to rule out, the n-gram is short.
    if (!same(history, next - n, len - n, n)) continue;
    const size_t end = std::min(len, next + static_cast<size_t>(k));
    std::vector<int32_t> draft;
    for (size_t i = next; i < end; ++i) draft.push_back(history[i]);
    return draft;
  }
  return {};
}

}  // namespace met
