// The scheduler's KV bookkeeping around the device backend (met/kv_ledger.h).
#include "met/kv_ledger.h"

#include <stdexcept>
#include <string>

namespace met {
namespace {

// Tables only grow while a sequence lives, so the sequence's copy takes the new tail only.
void sync_table(Sequence& seq, const std::vector<int32_t>& table) {
  if (seq.block_table.size() != table.size()) {
    seq.block_table.insert(seq.block_table.end(), table.begin() + seq.block_table.size(),
                           table.end());
  }
}

}  // namespace

int32_t KvLedger::match_prefix(Sequence& seq, const std::vector<int32_t>& prompt) {
  const uint64_t id = seq.session_hash;
  int32_t cached = device_.match_prefix(seq, prompt);
  if (cached == kMatchInCore) {
    cached = blocks_.allocate_prefix(id, prompt);
  } else if (!blocks_.has(id)) {
    blocks_.allocate_prefix(id, nullptr, 0);  // no reuse: an empty table
  }
  seq.tokens.assign(prompt.begin(), prompt.begin() + cached);
  seq.seq_len = cached;
  seq.cached_len = cached;
  seq.block_table = blocks_.table(id);
  return cached;
}

void KvLedger::alloc_sequence(Sequence& seq, int32_t budget) {
  if (states_ == nullptr) return device_.alloc_sequence(seq, budget);
  seq.state_slot = states_->allocate(seq.session_hash);
  try {
    device_.alloc_sequence(seq, budget);
  } catch (...) {
    states_->release(seq.session_hash);
    seq.state_slot = -1;
    throw;
  }
}

void KvLedger::free_sequence(Sequence& seq) {
  if (blocks_.has(seq.session_hash)) blocks_.release(seq.session_hash);
  seq.block_table.clear();
  seq.tokens.clear();
  device_.free_sequence(seq);
  if (states_ != nullptr && states_->has(seq.session_hash)) states_->release(seq.session_hash);
  seq.state_slot = -1;
}

// A sequence prefilled again after a preemption has no table until its first forward.
void KvLedger::reserve(const PlanRow& row) {
  Sequence& seq = *row.seq;
  const uint64_t id = seq.session_hash;
  if (static_cast<int32_t>(seq.tokens.size()) != row.start) {
    throw std::logic_error("KvLedger: row of s" + std::to_string(id) + " starts at " +
                           std::to_string(row.start) + " after " +
                           std::to_string(seq.tokens.size()) + " tokens");
  }
  if (!blocks_.has(id)) blocks_.allocate_prefix(id, nullptr, 0);
  if (!blocks_.grow(id, row.start + static_cast<int32_t>(row.tokens.size()))) throw KvExhausted();
  sync_table(seq, blocks_.table(id));
}

// Only blocks the row completed are hashed (commit is incremental); a verify row's drafts wait
// for commit_accepted_prefix.
void KvLedger::advance(const PlanRow& row) {
  Sequence& seq = *row.seq;
  seq.tokens.insert(seq.tokens.end(), row.tokens.begin(), row.tokens.end());
  seq.seq_len = static_cast<int32_t>(seq.tokens.size());
  const int32_t bs = blocks_.block_size();
  if (row.draft == 0 && seq.seq_len / bs > row.start / bs) {
    blocks_.commit(seq.session_hash, seq.tokens);
  }
}

std::vector<int32_t> KvLedger::execute(const StepPlan& plan) {
  for (const PlanRow& row : plan.rows) reserve(row);
  std::vector<int32_t> out = device_.execute(plan);
  for (const PlanRow& row : plan.rows) advance(row);
  return out;
}

void KvLedger::commit_accepted_prefix(Sequence& seq, int32_t na, int32_t k) {
  const int32_t rejected = k + 1 - na;
  if (rejected < 0 || rejected > seq.seq_len) {
    throw std::logic_error("KvLedger: bad verify commit (na=" + std::to_string(na) +
                           ", k=" + std::to_string(k) + ")");
  }
  seq.tokens.resize(seq.tokens.size() - static_cast<size_t>(rejected));
  seq.seq_len = static_cast<int32_t>(seq.tokens.size());
  blocks_.rollback(seq.session_hash, seq.seq_len);
  blocks_.commit(seq.session_hash, seq.tokens);
  if (rejected > 0) device_.commit_accepted_prefix(seq, na, k);
}

}  // namespace met
