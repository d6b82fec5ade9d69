// Owns: nothing itself; it is the scheduler's hold on the KV blocks (a BlockManager it does not
// own), on a hybrid model's recurrent-state slots (a StatePool, likewise) and on each sequence's
// one token history (Sequence::tokens).
// Called by: the scheduler and its effect applier, as their Backend, when the scheduler was built
// with a block manager; it forwards every call to the device backend it wraps.
// Invariants: before a plan reaches the device every row's table covers the row's tokens and
// seq->block_table is that table, or KvExhausted is thrown and no row advanced; after the device
// ran it, each row's tokens are in seq->tokens, seq->seq_len is their count and every full block
// that is final (not a verify row's draft) is committed to the prefix cache. A sequence's table
// lives from its prefix match (or first forward) to free_sequence; with a state pool, so does its
// state slot (Sequence::state_slot), from alloc_sequence.
#pragma once

#include <cstdint>
#include <vector>

#include "met/backend.h"
#include "met/block_manager.h"
#include "met/state_pool.h"

namespace met {

class KvLedger : public Backend {
 public:
  KvLedger(Backend& device, BlockManager& blocks, StatePool* states = nullptr)
      : device_(device), blocks_(blocks), states_(states) {}

  DeviceInfo open() override { return device_.open(); }
  // Free blocks as the block manager counts them (no call into the device backend).
  int32_t num_free_blocks() override { return blocks_.num_free_blocks(); }
  // The device backend may match the prompt itself (a hybrid's state checkpoints) or decline a
  // cached prefix (prompt scoring); with kMatchInCore the block manager matches it. Either way
  // the sequence leaves with its table, and tokens/seq_len/cached_len set to the reused prefix.
  // Transition: the block manager's allocate_prefix (cached blocks revived or shared).
  int32_t match_prefix(Sequence& seq, const std::vector<int32_t>& prompt) override;

  // With a state pool the sequence first takes a state slot (the pool's allocate), which the
  // device then starts from zero; then the device gives it a batch row.
  void alloc_sequence(Sequence& seq, int32_t budget) override;
  // Transition: the block manager's release of the sequence's table (blocks to the free list,
  // hashed ones as cached); then the device frees the slot; then the pool's release of its state
  // slot.
  void free_sequence(Sequence& seq) override;
  void compact_sequence(Sequence& seq, int64_t new_slot) override {
    device_.compact_sequence(seq, new_slot);
  }

  // Transition: grow per row (free -> used blocks), all rows before the device runs; then commit
  // of each final row's completed full blocks (used unhashed -> used hashed).
  std::vector<int32_t> execute(const StepPlan& plan) override;
  // The KV side of a verify: tokens and seq_len shrink to the accepted prefix, the block
  // manager's rollback (no block changes hands) and commit of the blocks that now stand. The
  // device backend hears of it only when a draft was rejected (what it keeps per position, a
  // recurrent state, must be put back).
  void commit_accepted_prefix(Sequence& seq, int32_t na, int32_t k) override;

  int32_t argmax_on_device(int32_t row, int32_t stream) override {
    return device_.argmax_on_device(row, stream);
  }
  std::vector<int32_t> argmax_batch(int32_t row, int32_t n, int32_t stream) override {
    return device_.argmax_batch(row, n, stream);
  }
  std::vector<SampledToken> sample_rows(const std::vector<SampleRow>& rows) override {
    return device_.sample_rows(rows);
  }
  void join_streams(int32_t event, int32_t recorded, int32_t waiting) override {
    device_.join_streams(event, recorded, waiting);
  }
  void synchronize(int32_t stream) override { device_.synchronize(stream); }
  void teardown() override { device_.teardown(); }

 private:
  void reserve(const PlanRow& row);
  void advance(const PlanRow& row);

  Backend& device_;
  BlockManager& blocks_;
  StatePool* states_;  // null: no recurrent layers
};

}  // namespace met
