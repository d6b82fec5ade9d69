// A hybrid model's recurrent-state checkpoint index (met/state_checkpoints.h).
#include "met/state_checkpoints.h"

#include <algorithm>
#include <set>
#include <stdexcept>
#include <string>

namespace met {
namespace {

bool is_draft(const PlanRow& row) { return row.draft > 0; }

// Positions [from, to) of the sequence's tokens followed by the row's (the row starts where the
// sequence's tokens end).
std::vector<int32_t> gather(const PlanRow& row, int32_t from, int32_t to) {
  const std::vector<int32_t>& before = row.seq->tokens;
  const auto n = static_cast<int32_t>(before.size());
  std::vector<int32_t> out;
  out.reserve(static_cast<size_t>(std::max(0, to - from)));
  for (int32_t p = from; p < to; ++p) {
    out.push_back(p < n ? before[size_t(p)] : row.tokens.at(size_t(p - n)));
  }
  return out;
}

// The chained keys of the first `blocks` blocks of `tokens`, as the block manager hashes them.
std::vector<uint64_t> prefix_keys(const int32_t* tokens, int32_t blocks, int32_t bs) {
  std::vector<uint64_t> keys;
  uint64_t key = kRootBlockHash;
  for (int32_t j = 0; j < blocks; ++j) {
    key = hash_block(key, tokens + size_t(j) * bs, size_t(bs));
    keys.push_back(key);
  }
  return keys;
}

}  // namespace

StateCheckpoints::StateCheckpoints(BlockManager& blocks, int32_t count, int32_t interval)
    : blocks_(blocks), count_(count), block_size_(blocks.block_size()), interval_(interval) {
  if (count < 1 || interval < block_size_ || interval % block_size_ != 0) {
    throw std::invalid_argument("StateCheckpoints: a count >= 1, an interval of whole blocks");
  }
  for (int32_t i = count - 1; i >= 0; --i) free_.push_back(i);
  blocks_.set_eviction_listener([this](uint64_t hash) {
    if (index_.count(hash) != 0) drop(hash);
  });
}

StateCheckpoints::~StateCheckpoints() { blocks_.set_eviction_listener(nullptr); }

ResumedPrefix StateCheckpoints::resume(uint64_t seq, const std::vector<int32_t>& prompt) {
  const int32_t bs = block_size_;
  const auto n = static_cast<int32_t>(prompt.size());
  const int32_t most = n == 0 ? 0 : (n - 1) / bs;
  const std::vector<uint64_t> keys = prefix_keys(prompt.data(), most, bs);
  for (int32_t boundary = most; boundary > 0; --boundary) {
    const int32_t* index = index_of(keys[size_t(boundary - 1)]);
    if (index == nullptr) continue;
    const int32_t length = boundary * bs;
    // Only the blocks before the checkpoint: those after it are computed anew.
    if (blocks_.allocate_prefix(seq, prompt.data(), size_t(length) + 1) == length) {
      const ResumedPrefix resumed{length, *index};
      touch(keys[size_t(boundary - 1)]);
      return resumed;
    }
    blocks_.release(seq);
    drop(keys[size_t(boundary - 1)]);  // its blocks were evicted
  }
  blocks_.allocate_prefix(seq, nullptr, 0);
  return {};
}

std::vector<int32_t> StateCheckpoints::plan(
    const StepPlan& plan, const std::unordered_map<uint64_t, int32_t>& history_ends) {
  std::vector<int32_t> marks;
  for (size_t i = 0; i < plan.rows.size(); ++i) {
    const PlanRow& row = plan.rows[i];
    const Sequence& seq = *row.seq;
    if (is_draft(row) || row.tokens.size() < 2 || row.start >= seq.prompt_len) continue;
    const auto found = history_ends.find(seq.session_hash);
    const int32_t history = found == history_ends.end() ? 0 : found->second;
    for (int32_t position : positions(row, history)) {
      const uint64_t key = key_of(row, position / block_size_);
      if (index_of(key) != nullptr) {
        touch(key);
        continue;
      }
      const auto written = [key](const auto& p) { return p.first == key; };
      if (std::any_of(pending_.begin(), pending_.end(), written)) continue;  // another row's
      const int32_t index = take();
      if (index < 0) break;  // every checkpoint is being written this step
      pending_.emplace_back(key, index);
      marks.insert(marks.end(), {static_cast<int32_t>(i), position, index});
    }
  }
  return marks;
}

std::vector<CheckpointCopy> StateCheckpoints::commit(const StepPlan& plan) {
  for (const auto& [key, index] : pending_) insert(key, index);
  pending_.clear();
  std::vector<CheckpointCopy> copies;
  for (const PlanRow& row : plan.rows) {
    if (is_draft(row) || row.tokens.size() == 1) pass_boundary(row, copies);
  }
  return copies;
}

void StateCheckpoints::abandon() {
  for (const auto& pending : pending_) free_.push_back(pending.second);
  pending_.clear();
}

// Block boundaries in (start, end], end the row's last prompt position: every interval's, the
// prompt's last full block's and the one before the rendered history's end.
std::vector<int32_t> StateCheckpoints::positions(const PlanRow& row, int32_t history_end) const {
  const int32_t prompt_len = row.seq->prompt_len;
  const int32_t start = row.start;
  const int32_t end = std::min(start + static_cast<int32_t>(row.tokens.size()), prompt_len);
  std::set<int32_t> wanted;
  for (int32_t p = (start / interval_ + 1) * interval_; p <= end; p += interval_) wanted.insert(p);
  for (int32_t position : {prompt_len, history_end}) {
    const int32_t boundary = std::min(position, prompt_len) / block_size_ * block_size_;
    if (start < boundary && boundary <= end) wanted.insert(boundary);
  }
  return {wanted.begin(), wanted.end()};
}

void StateCheckpoints::pass_boundary(const PlanRow& row, std::vector<CheckpointCopy>& copies) {
  const int32_t bs = block_size_;
  const Sequence& seq = *row.seq;
  const int32_t boundary = (row.start + static_cast<int32_t>(row.tokens.size())) / bs * bs;
  if (boundary <= row.start) return;
  const auto found = turns_.find(seq.session_hash);
  const Turn* previous = found == turns_.end() ? nullptr : &found->second;
  const uint64_t key = turn_key(row, boundary, previous);
  const int32_t token = boundary - row.start - 1;  // the row's token that reached it
  bool written = false;
  const int32_t* held = index_of(key);
  int32_t index = held == nullptr ? -1 : *held;
  if (index >= 0) {
    touch(key);
  } else {
    index = take();
    if (index < 0) return;
    copies.push_back({index, seq.state_slot, is_draft(row) ? token : -1});
    insert(key, index);
    written = true;
  }
  if (previous != nullptr && previous->written && previous->key != key) {
    const int32_t* still = index_of(previous->key);
    if (still != nullptr && *still == previous->index) drop(previous->key);  // one per sequence
  }
  const bool final = !is_draft(row) || token == 0;  // a verify row's first token is the sampled one
  turns_[seq.session_hash] = Turn{boundary, key, index, written, final};
}

// The chain from the sequence's previous boundary when it is the block before and its tokens
// stand, else from the whole history (its first boundary in decode, or after drafts).
uint64_t StateCheckpoints::turn_key(const PlanRow& row, int32_t boundary,
                                    const Turn* previous) const {
  const int32_t bs = block_size_;
  if (previous == nullptr || previous->boundary != boundary - bs || !previous->final) {
    return key_of(row, boundary / bs);
  }
  const std::vector<int32_t> block = gather(row, boundary - bs, boundary);
  return hash_block(previous->key, block.data(), size_t(bs));
}

uint64_t StateCheckpoints::key_of(const PlanRow& row, int32_t blocks) const {
  return prefix_keys(gather(row, 0, blocks * block_size_).data(), blocks, block_size_).back();
}

const int32_t* StateCheckpoints::index_of(uint64_t key) const {
  const auto it = index_.find(key);
  return it == index_.end() ? nullptr : &it->second.index;
}

void StateCheckpoints::touch(uint64_t key) {
  Entry& entry = index_.at(key);
  recency_.splice(recency_.end(), recency_, entry.recency);
}

void StateCheckpoints::insert(uint64_t key, int32_t index) {
  if (index_.count(key) != 0) {  // already indexed: this copy is not needed
    free_.push_back(index);
    return;
  }
  index_.emplace(key, Entry{index, recency_.insert(recency_.end(), key)});
}

int32_t StateCheckpoints::take() {
  if (free_.empty() && !recency_.empty()) drop(recency_.front());  // the least recently used
  if (free_.empty()) return -1;
  const int32_t index = free_.back();
  free_.pop_back();
  return index;
}

void StateCheckpoints::drop(uint64_t key) {
  const auto it = index_.find(key);
  free_.push_back(it->second.index);
  recency_.erase(it->second.recency);
  index_.erase(it);
}

void StateCheckpoints::check_invariants() const {
  const auto fail = [](const std::string& what) {
    throw std::logic_error("StateCheckpoints: " + what);
  };
  std::vector<int32_t> seen(static_cast<size_t>(count_), 0);
  const auto mark = [&](int32_t index, const char* where) {
    if (index < 0 || index >= count_) fail(std::string("a ") + where + " index out of range");
    if (seen[size_t(index)]++ != 0) fail("checkpoint " + std::to_string(index) + " held twice");
  };
  for (int32_t index : free_) mark(index, "free");
  for (const auto& [key, entry] : index_) {
    mark(entry.index, "indexed");
    if (*entry.recency != key) fail("a key's recency entry names another key");
  }
  for (const auto& [key, index] : pending_) {
    mark(index, "pending");
    if (index_.count(key) != 0) fail("a pending key is indexed already");
  }
  if (recency_.size() != index_.size()) fail("the recency order and the index disagree");
  if (std::find(seen.begin(), seen.end(), 0) != seen.end()) fail("a checkpoint is lost");
}

}  // namespace met
