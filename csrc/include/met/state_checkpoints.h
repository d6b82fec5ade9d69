// Owns: the index of a hybrid model's recurrent-state checkpoints for its prefix cache (which
// checkpoint of the device's checkpoint pool holds the state after which block-aligned token
// prefix), the checkpoints the running forward writes, and per sequence its turn's checkpoint
// (the one at the last block boundary its decode passed). Not the states: the device copies them
// where a resume, a plan or a commit says.
// Called by: the device backend of a hybrid model (python/met/engine/torch_backend.py) when it
// matches a prompt, plans and commits a forward, and frees a sequence; the block manager, whose
// evictions drop the checkpoints keyed by the blocks they evict.
// Invariants (check_invariants): every checkpoint is exactly one of free (once), indexed (under
// one key) or pending (written by the running forward, under one key); the recency order and the
// key map hold the same keys; free + indexed + pending = count.
//
// Keys: a checkpoint at boundary L (a multiple of the block size) is keyed by the block manager's
// chained hash of the prefix's block L / block_size - 1 (hash_block from kRootBlockHash), so the
// cache entry a resume needs and the checkpoint share one key, and the block manager's eviction of
// that block drops the checkpoint at once. A checkpoint whose earlier blocks were evicted (a head
// before its tail: the block manager avoids it) is dropped when a resume finds them gone.
#pragma once

#include <cstdint>
#include <list>
#include <unordered_map>
#include <vector>

#include "met/block_manager.h"
#include "met/step_plan.h"

namespace met {

struct ResumedPrefix {
  int32_t length = 0;  // cached positions (a multiple of the block size; 0: none)
  int32_t index = -1;  // the checkpoint the sequence's state slot resumes from (-1: none)
};

// The device copies checkpoint `index` from state slot `slot`: its state now (token < 0), or as
// it was after token `token` of its last verify row.
struct CheckpointCopy {
  int32_t index = 0;
  int32_t slot = 0;
  int32_t token = -1;
};

class StateCheckpoints {
 public:
  // `interval`: positions between checkpoints inside a prompt (a whole number of blocks). Becomes
  // `blocks`' eviction listener until destroyed; `blocks` must outlive it.
  StateCheckpoints(BlockManager& blocks, int32_t count, int32_t interval);
  ~StateCheckpoints();
  StateCheckpoints(const StateCheckpoints&) = delete;
  StateCheckpoints& operator=(const StateCheckpoints&) = delete;

  // Allocates `seq`'s table from the longest cached prefix a checkpoint resumes (the block
  // manager's allocate_prefix of the blocks before it), or an empty one. Transition: that
  // checkpoint becomes the most recently used; one whose blocks a lookup found evicted, indexed
  // -> free.
  ResumedPrefix resume(uint64_t seq, const std::vector<int32_t>& prompt);

  // The checkpoints the plan's prompt rows pass, as flat (row, position, index) triples: every
  // `interval`-th position, the prompt's last full block and the block boundary before its
  // rendered history's end (history_ends, by sequence id). Transition: each new one free (or the
  // least recently used indexed one) -> pending; one already indexed becomes most recently used.
  std::vector<int32_t> plan(const StepPlan& plan,
                            const std::unordered_map<uint64_t, int32_t>& history_ends);
  // The plan's forward ran: pending -> indexed. Its decode and verify rows that reached a block
  // boundary leave their state there as their turn's checkpoint (free -> indexed, the copies
  // returned for the device to make); a sequence's previous turn checkpoint, when it wrote it,
  // indexed -> free.
  std::vector<CheckpointCopy> commit(const StepPlan& plan);
  // The plan's forward failed: pending -> free.
  void abandon();
  // `seq` left its state slot: its turn checkpoint stays indexed like any other.
  void forget(uint64_t seq) { turns_.erase(seq); }

  int32_t count() const { return count_; }
  int32_t num_indexed() const { return static_cast<int32_t>(index_.size()); }
  int32_t num_free() const { return static_cast<int32_t>(free_.size()); }

  // Throws std::logic_error naming the first broken invariant.
  void check_invariants() const;

 private:
  struct Entry {
    int32_t index;
    std::list<uint64_t>::iterator recency;
  };
  // A sequence's checkpoint at the last block boundary its decode passed.
  struct Turn {
    int32_t boundary;  // the positions before it
    uint64_t key;
    int32_t index;
    bool written;  // by this sequence (then its next boundary's takes its place)
    bool final;    // its tokens all stand (not a verify row's drafts, which may be rejected)
  };

  std::vector<int32_t> positions(const PlanRow& row, int32_t history_end) const;
  void pass_boundary(const PlanRow& row, std::vector<CheckpointCopy>& copies);
  uint64_t turn_key(const PlanRow& row, int32_t boundary, const Turn* previous) const;
  // The chained key of the first `blocks` blocks of seq's tokens followed by the row's.
  uint64_t key_of(const PlanRow& row, int32_t blocks) const;
  const int32_t* index_of(uint64_t key) const;
  void touch(uint64_t key);
  void insert(uint64_t key, int32_t index);
  int32_t take();  // -1: every checkpoint is pending
  void drop(uint64_t key);

  BlockManager& blocks_;
  int32_t count_, block_size_, interval_;
  std::unordered_map<uint64_t, Entry> index_;          // key -> checkpoint
  std::list<uint64_t> recency_;                        // indexed keys, least recently used first
  std::vector<int32_t> free_;                          // highest first (pop = lowest)
  std::vector<std::pair<uint64_t, int32_t>> pending_;  // (key, index) the running forward writes
  // By sequence id. A verify row's checkpoint stands even if the drafts that reached it are
  // rejected: it is the state after those tokens, keyed by them.
  std::unordered_map<uint64_t, Turn> turns_;
};

}  // namespace met
