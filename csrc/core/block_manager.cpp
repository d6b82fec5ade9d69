// The paged-KV block manager: free list, block tables, prefix cache. Policy and invariants are
// stated in met/block_manager.h; check_invariants() lives in block_manager_check.cpp.
#include "met/block_manager.h"

#include <algorithm>
#include <stdexcept>
#include <string>

#include "met/mix64.h"

namespace met {

namespace {
std::string seq_name(uint64_t seq) { return "sequence " + std::to_string(seq); }
}  // namespace

uint64_t hash_block(uint64_t parent, const int32_t* tokens, size_t n) {
  uint64_t h = mix64(parent ^ 0x6d65742d6b762d31ULL);  // "met-kv-1": the root differs from 0
  for (size_t i = 0; i < n; ++i) h = mix64(h ^ static_cast<uint32_t>(tokens[i]));
  return mix64(h ^ n);
}

BlockManager::BlockManager(int32_t num_blocks, int32_t block_size, bool enable_prefix_cache,
                           bool reuse_before_fresh)
    : block_size_(block_size),
      enable_prefix_cache_(enable_prefix_cache),
      reuse_before_fresh_(reuse_before_fresh) {
  if (num_blocks < 0) throw std::invalid_argument("BlockManager: num_blocks must be >= 0");
  if (block_size <= 0) throw std::invalid_argument("BlockManager: block_size must be > 0");
  blocks_.resize(num_blocks);
  if (enable_prefix_cache_) block_tokens_.resize(size_t(num_blocks) * block_size);
  prev_.assign(num_blocks + 1, -1);
  next_.assign(num_blocks + 1, -1);
  prev_[sentinel()] = next_[sentinel()] = sentinel();
  // Initial order 0, 1, ..., n-1: fresh allocations hand out ascending ids.
  for (int32_t b = 0; b < num_blocks; ++b) list_insert_before(b, sentinel());
  num_free_ = num_blocks;
  first_cached_ = sentinel();
}

// --- free list ---

void BlockManager::list_unlink(int32_t b) {
  // Cached blocks form the list's tail, so the next one (or the sentinel) becomes the first.
  if (b == first_cached_) first_cached_ = next_[b];
  next_[prev_[b]] = next_[b];
  prev_[next_[b]] = prev_[b];
  prev_[b] = next_[b] = -1;
}

void BlockManager::list_insert_before(int32_t b, int32_t pos) {
  prev_[b] = prev_[pos];
  next_[b] = pos;
  next_[prev_[pos]] = b;
  prev_[pos] = b;
}

// --- prefix cache ---

int32_t BlockManager::lookup(uint64_t hash, uint64_t parent, const int32_t* tokens) const {
  auto it = cache_.find(hash);
  if (it == cache_.end()) return -1;
  const int32_t b = it->second;
  if (blocks_[b].parent_hash != parent) return -1;
  if (!std::equal(tokens, tokens + block_size_, block_tokens(b))) return -1;
  return b;
}

void BlockManager::set_hash(int32_t b, uint64_t hash, uint64_t parent, const int32_t* tokens) {
  Block& blk = blocks_[b];
  blk.hashed = true;
  blk.hash = hash;
  blk.parent_hash = parent;
  std::copy(tokens, tokens + block_size_, &block_tokens_[size_t(b) * block_size_]);
  cache_.emplace(hash, b);
}

void BlockManager::drop_hash(int32_t b) {
  Block& blk = blocks_[b];
  cache_.erase(blk.hash);
  blk.hashed = false;
  blk.hash = blk.parent_hash = 0;
}

void BlockManager::uncache_free(int32_t b) {
  list_unlink(b);
  drop_hash(b);
  --num_cached_free_;
  list_insert_before(b, next_[sentinel()]);
}

// --- sequences ---

BlockManager::SeqState& BlockManager::state(uint64_t seq) {
  auto it = seqs_.find(seq);
  if (it == seqs_.end()) throw std::invalid_argument("BlockManager: unknown " + seq_name(seq));
  return it->second;
}

const std::vector<int32_t>& BlockManager::table(uint64_t seq) const {
  auto it = seqs_.find(seq);
  if (it == seqs_.end()) throw std::invalid_argument("BlockManager: unknown " + seq_name(seq));
  return it->second.table;
}

int32_t BlockManager::ref_count(int32_t block) const {
  if (block < 0 || block >= num_total_blocks())
    throw std::invalid_argument("BlockManager: no block " + std::to_string(block));
  return blocks_[block].ref;
}

int32_t BlockManager::allocate_prefix(uint64_t seq, const std::vector<int32_t>& prompt) {
  return allocate_prefix(seq, prompt.data(), prompt.size());
}

int32_t BlockManager::allocate_prefix(uint64_t seq, const int32_t* prompt, size_t n) {
  if (seqs_.count(seq)) throw std::invalid_argument("BlockManager: " + seq_name(seq) + " exists");
  SeqState st;
  if (enable_prefix_cache_) {
    // The last prompt token must be computed to produce the first output's logits.
    const size_t max_hits = n == 0 ? 0 : (n - 1) / size_t(block_size_);
    for (size_t j = 0; j < max_hits; ++j) {
      const int32_t* toks = prompt + j * block_size_;
      const uint64_t h = hash_block(st.last_hash, toks, block_size_);
      const int32_t b = lookup(h, st.last_hash, toks);
      if (b < 0) break;
      if (blocks_[b].ref++ == 0) {  // free(cached) -> used(ref 1)
        list_unlink(b);
        --num_free_;
        --num_cached_free_;
      }
      st.table.push_back(b);
      st.last_hash = h;
      ++st.hashed_blocks;
    }
    queried_tokens_ += static_cast<int64_t>(n);
    hit_tokens_ += int64_t(st.hashed_blocks) * block_size_;
  }
  const int32_t cached = st.hashed_blocks * block_size_;
  seqs_.emplace(seq, std::move(st));
  return cached;
}

bool BlockManager::grow(uint64_t seq, int32_t num_tokens) {
  if (num_tokens < 0) throw std::invalid_argument("BlockManager::grow: negative num_tokens");
  SeqState& st = state(seq);
  const int64_t want = (int64_t(num_tokens) + block_size_ - 1) / block_size_;
  const int64_t need = want - int64_t(st.table.size());
  if (need <= 0) return true;
  if (need > num_free_) return false;
  for (int64_t i = 0; i < need; ++i) {
    int32_t b = next_[sentinel()];  // free(plain|cached) -> used(ref 1), evicting a hash
    if (reuse_before_fresh_ && !blocks_[b].touched && first_cached_ != sentinel()) {
      b = first_cached_;
    }
    if (!blocks_[b].touched) {
      blocks_[b].touched = true;
      ++num_touched_;
    }
    list_unlink(b);
    --num_free_;
    if (blocks_[b].hashed) {
      const uint64_t evicted = blocks_[b].hash;
      drop_hash(b);
      --num_cached_free_;
      if (on_evict_) on_evict_(evicted);
    }
    blocks_[b].ref = 1;
    st.table.push_back(b);
  }
  return true;
}

void BlockManager::commit(uint64_t seq, const std::vector<int32_t>& tokens) {
  commit(seq, tokens.data(), tokens.size());
}

void BlockManager::commit(uint64_t seq, const int32_t* tokens, size_t n) {
  SeqState& st = state(seq);
  if (n > st.table.size() * size_t(block_size_))
    throw std::invalid_argument("BlockManager::commit: " + std::to_string(n) +
                                " tokens exceed the table of " + seq_name(seq));
  if (!enable_prefix_cache_) return;
  const size_t full = n / size_t(block_size_);
  for (size_t j = size_t(st.hashed_blocks); j < full; ++j) {
    const int32_t* toks = tokens + j * block_size_;
    const uint64_t h = hash_block(st.last_hash, toks, block_size_);
    const int32_t b = st.table[j];
    // used(unhashed) -> used(hashed), unless another used block already serves this hash (a
    // duplicate). A free cached block serving it hands its hash over, so the KV a live table
    // holds is the one kept (evicting the free copy would lose the hash while its KV lives on).
    // A block in this position is fresh from grow(), so it never carries a hash already.
    if (!blocks_[b].hashed) {
      const int32_t old = lookup(h, st.last_hash, toks);
      if (old >= 0 && blocks_[old].ref == 0) uncache_free(old);
      if (cache_.find(h) == cache_.end()) set_hash(b, h, st.last_hash, toks);
    }
    st.last_hash = h;
    st.hashed_blocks = static_cast<int32_t>(j + 1);
  }
}

void BlockManager::rollback(uint64_t seq, int32_t num_tokens) {
  const SeqState& st = state(seq);
  if (num_tokens < 0 || int64_t(num_tokens) > int64_t(st.table.size()) * block_size_)
    throw std::invalid_argument("BlockManager::rollback: " + std::to_string(num_tokens) +
                                " tokens outside the table of " + seq_name(seq));
  if (int64_t(st.hashed_blocks) * block_size_ > num_tokens)
    throw std::logic_error("BlockManager::rollback: " + seq_name(seq) +
                           " has a hashed block past " + std::to_string(num_tokens) + " tokens");
  for (size_t j = size_t(num_tokens / block_size_); j < st.table.size(); ++j) {
    const Block& blk = blocks_[st.table[j]];
    if (blk.ref != 1 || blk.hashed)
      throw std::logic_error("BlockManager::rollback: block " + std::to_string(st.table[j]) +
                             " of " + seq_name(seq) + " is shared or hashed");
  }
}

void BlockManager::release(uint64_t seq) {
  auto it = seqs_.find(seq);
  if (it == seqs_.end()) throw std::invalid_argument("BlockManager: unknown " + seq_name(seq));
  const std::vector<int32_t>& t = it->second.table;
  // Reverse table order: cached blocks are appended tail first (evicted before their heads);
  // plain blocks pushed at the front end up in table order.
  for (auto r = t.rbegin(); r != t.rend(); ++r) {
    const int32_t b = *r;
    if (--blocks_[b].ref > 0) continue;  // used(ref r) -> used(ref r-1)
    ++num_free_;
    if (blocks_[b].hashed) {  // used(ref 1, hashed) -> free(cached), back
      list_insert_before(b, sentinel());
      if (first_cached_ == sentinel()) first_cached_ = b;
      ++num_cached_free_;
    } else {  // used(ref 1, unhashed) -> free(plain), front
      list_insert_before(b, next_[sentinel()]);
    }
  }
  seqs_.erase(it);
}

void BlockManager::reset_prefix_cache() {
  for (int32_t b = next_[sentinel()]; b != sentinel(); b = next_[b]) {
    if (!blocks_[b].hashed) continue;
    const uint64_t evicted = blocks_[b].hash;
    drop_hash(b);  // free(cached) -> free(plain), position kept
    if (on_evict_) on_evict_(evicted);
  }
  num_cached_free_ = 0;
  first_cached_ = sentinel();
}

}  // namespace met
