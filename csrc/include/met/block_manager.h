// Owns: the paged KV blocks (reference counts, the free list in eviction order), the per-sequence
// block tables, and the prefix cache (chained block hash -> block).
// Called by: the scheduler's KvLedger when it matches prefixes, extends, rolls back and releases
// sequences; a hybrid's StateCheckpoints when it resumes a prompt (and as the listener of its
// evictions); Python through pybind11 for what stays there (the pooler's one-shot forwards, the
// engine's stats).
// Invariants (checked by check_invariants()):
//   - a block's ref count equals the number of sequence tables holding it;
//   - the free list holds exactly the ref-0 blocks, once each, plain blocks before cached ones;
//   - every prefix-cache entry points to a block carrying that hash, and every hashed block is the
//     entry for its hash;
//   - used + free == total; a table only grows while its sequence lives.
//
// Block states: used (ref > 0, hashed or not), free-plain (ref 0, no hash), free-cached (ref 0,
// hashed: still holds valid KV a prefix hit can revive until allocation evicts it).
//
// Eviction policy: one free list; allocation always pops the front. release() puts plain blocks
// at the front (they hold nothing worth keeping, so they are reused first) and appends cached
// blocks at the back, a sequence's blocks in reverse table order. Cached blocks are therefore
// evicted least recently released first, and within one sequence tail first: a prefix hit needs
// the whole chain from block 0, so evicting a head block would strand every block after it.
//
// Fresh blocks first or cached blocks first: by default allocation takes never-used blocks
// before evicting cached ones (a GPU pool is committed memory anyway, so a bigger cache is free).
// With reuse_before_fresh (a CPU pool whose pages are committed only when first written), a
// grow() that would take a never-used block takes the least recently released cached block
// instead while one exists, so the pool's resident memory follows the peak of blocks in use
// rather than every token ever served.
//
// Hashing: the hash of full block j is H(hash of block j-1, tokens of block j) (64-bit,
// splitmix64-style mixing, written here). Only full blocks are hashed. A hit compares the block's
// tokens and its parent hash, so a false hit needs two different token prefixes whose 64-bit chain
// hashes collide (about n^2 / 2^64 for n distinct cached blocks: negligible next to hardware
// error).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <unordered_map>
#include <utility>
#include <vector>

namespace met {

// Chained hash of one full block; `parent` is the previous block's hash (kRootBlockHash first).
constexpr uint64_t kRootBlockHash = 0;
uint64_t hash_block(uint64_t parent, const int32_t* tokens, size_t n);

class BlockManager {
 public:
  BlockManager(int32_t num_blocks, int32_t block_size, bool enable_prefix_cache = true,
               bool reuse_before_fresh = false);

  // Creates `seq`'s table (std::invalid_argument if it exists) holding the longest run of cached
  // full blocks that match the prompt's leading blocks, never covering the last prompt token.
  // Transition per hit block: free(cached) -> used(ref 1), or used(ref r) -> used(ref r+1).
  // Returns the cached token count (a multiple of block_size). Never allocates a fresh block.
  int32_t allocate_prefix(uint64_t seq, const std::vector<int32_t>& prompt);
  int32_t allocate_prefix(uint64_t seq, const int32_t* prompt, size_t n);

  // Makes the table cover positions [0, num_tokens). All-or-nothing: on shortage returns false and
  // changes nothing. Transition per new block: free(plain or cached, hash evicted) -> used(ref 1);
  // which block: the front of the free list, or with reuse_before_fresh the first cached block
  // when the front one was never used.
  bool grow(uint64_t seq, int32_t num_tokens);

  // `tokens` is every token whose KV is written so far (prompt + generated); its prefix must not
  // change between calls. Registers the hash of each newly completed full block: used(unhashed)
  // -> used(hashed). A block whose hash already maps to another used block (two sequences
  // computed the same prefix) stays unhashed: a duplicate, freed as a plain block. One whose hash
  // maps to a free cached block takes the hash over: that block free(cached) -> free(plain),
  // front of the list. std::invalid_argument if the tokens reach past the table.
  void commit(uint64_t seq, const std::vector<int32_t>& tokens);
  void commit(uint64_t seq, const int32_t* tokens, size_t n);

  // After a speculative verify rejected the tail of what was written: `seq` now holds
  // `num_tokens` valid tokens. Transition: none; every block stays in the table (tables only
  // grow) as used(ref 1, unhashed), and the rejected positions are overwritten by the next
  // tokens. std::logic_error if a block covering a rolled-back position is hashed (commit() ran
  // past the accepted tokens) or shared (its KV is not this sequence's to overwrite);
  // std::invalid_argument if the table does not reach num_tokens.
  void rollback(uint64_t seq, int32_t num_tokens);

  // Drops `seq`'s refs and removes its table. Transition per block: used(ref r > 1) -> used(ref
  // r-1); used(ref 1, hashed) -> free(cached), back of the list; used(ref 1, unhashed) ->
  // free(plain), front of the list.
  void release(uint64_t seq);

  // Drops the hash of every free block: free(cached) -> free(plain). Used blocks keep theirs.
  void reset_prefix_cache();

  // Called with each hash the prefix cache loses with its block's KV (grow() taking a cached
  // block, reset_prefix_cache()), after that block's transition; not when a hash moves to a live
  // block that computed the same prefix (commit()). A hybrid's state checkpoint keyed by the hash
  // resumes nothing any more (StateCheckpoints). One listener; an empty function removes it.
  void set_eviction_listener(std::function<void(uint64_t)> listener) {
    on_evict_ = std::move(listener);
  }

  const std::vector<int32_t>& table(uint64_t seq) const;
  bool has(uint64_t seq) const { return seqs_.count(seq) != 0; }

  int32_t num_total_blocks() const { return static_cast<int32_t>(blocks_.size()); }
  int32_t block_size() const { return block_size_; }
  int32_t num_free_blocks() const { return num_free_; }  // includes evictable cached blocks
  int32_t num_used_blocks() const { return num_total_blocks() - num_free_; }
  int32_t num_cached_blocks() const { return num_cached_free_; }  // free and hashed
  bool prefix_cache_enabled() const { return enable_prefix_cache_; }
  // Blocks ever handed out by grow(): with reuse_before_fresh, the pool's high-water mark.
  int32_t num_touched_blocks() const { return num_touched_; }
  int32_t ref_count(int32_t block) const;  // for tests and debugging
  // Counted by allocate_prefix while the prefix cache is on: prompt tokens asked / found cached.
  int64_t prefix_queried_tokens() const { return queried_tokens_; }
  int64_t prefix_hit_tokens() const { return hit_tokens_; }

  // Throws std::logic_error naming the first inconsistency found. O(blocks + table entries).
  void check_invariants() const;

 private:
  struct Block {
    int32_t ref = 0;
    bool hashed = false;
    bool touched = false;  // handed out by grow() at least once
    uint64_t hash = 0;
    uint64_t parent_hash = 0;  // verified on a hit, with the tokens, against hash collisions
  };
  struct SeqState {
    std::vector<int32_t> table;
    int32_t hashed_blocks = 0;  // leading full blocks whose hash commit() has computed
    uint64_t last_hash = kRootBlockHash;
  };

  SeqState& state(uint64_t seq);
  const int32_t* block_tokens(int32_t b) const { return &block_tokens_[size_t(b) * block_size_]; }
  // Returns the cached block for (parent, tokens of one block), or -1.
  int32_t lookup(uint64_t hash, uint64_t parent, const int32_t* tokens) const;
  void set_hash(int32_t b, uint64_t hash, uint64_t parent, const int32_t* tokens);
  void drop_hash(int32_t b);
  void uncache_free(int32_t b);  // free(cached) -> free(plain), moved to the front

  // Intrusive doubly linked free list over prev_/next_; index num_total_blocks() is the sentinel,
  // so removing a revived block from the middle is O(1).
  void list_unlink(int32_t b);
  void list_insert_before(int32_t b, int32_t pos);
  int32_t sentinel() const { return num_total_blocks(); }

  int32_t block_size_;
  bool enable_prefix_cache_;
  bool reuse_before_fresh_;
  std::vector<Block> blocks_;
  std::vector<int32_t> block_tokens_;  // tokens of hashed blocks, block_size per block
  std::vector<int32_t> prev_, next_;   // free-list links, meaningful only while ref == 0
  int32_t num_free_ = 0;
  int32_t num_cached_free_ = 0;
  int32_t num_touched_ = 0;
  // The first (least recently released) cached block in the free list, or the sentinel.
  int32_t first_cached_ = 0;
  std::unordered_map<uint64_t, int32_t> cache_;  // chained hash -> block
  std::unordered_map<uint64_t, SeqState> seqs_;
  int64_t queried_tokens_ = 0;
  int64_t hit_tokens_ = 0;
  std::function<void(uint64_t)> on_evict_;
};

}  // namespace met
