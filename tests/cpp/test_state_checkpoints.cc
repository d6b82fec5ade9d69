// StateCheckpoints: a hybrid model's recurrent-state checkpoint index, driven as a hybrid's
// device backend drives it (a resume at the prefix match, a plan and a commit around every
// forward) under a KvLedger over a real BlockManager; check_invariants() after every step.
#include <gtest/gtest.h>

#include <unordered_map>
#include <vector>

#include "echo_device.h"
#include "met/block_manager.h"
#include "met/kv_ledger.h"
#include "met/state_checkpoints.h"
#include "met/step_plan.h"

namespace met {
namespace {

// What a hybrid's backend does with the index; the states themselves are not modelled.
class HybridDevice : public EchoDevice {
 public:
  HybridDevice(StateCheckpoints& checkpoints, int32_t block_size)
      : EchoDevice(block_size), checkpoints_(checkpoints) {}

  int32_t match_prefix(Sequence& seq, const std::vector<int32_t>& prompt) override {
    resumed = checkpoints_.resume(seq.session_hash, prompt);
    return resumed.length;
  }
  std::vector<int32_t> execute(const StepPlan& plan) override {
    marks = checkpoints_.plan(plan, history_ends);
    checkpoints_.check_invariants();
    std::vector<int32_t> out = EchoDevice::execute(plan);
    copies = checkpoints_.commit(plan);
    checkpoints_.check_invariants();
    return out;
  }

  ResumedPrefix resumed;
  std::vector<int32_t> marks;
  std::vector<CheckpointCopy> copies;
  std::unordered_map<uint64_t, int32_t> history_ends;

 private:
  StateCheckpoints& checkpoints_;
};

constexpr int32_t kBlock = 4;

struct Harness {
  explicit Harness(int32_t num_blocks, int32_t count = 4, int32_t interval = 8)
      : blocks(num_blocks, kBlock),
        checkpoints(blocks, count, interval),
        device(checkpoints, kBlock),
        ledger(device, blocks) {}

  // A new sequence matched against the cache and prefilled whole in one row.
  void prefill(Sequence& seq, uint64_t id, const std::vector<int32_t>& prompt) {
    seq.session_hash = id;
    seq.prompt_len = static_cast<int32_t>(prompt.size());
    seq.state_slot = static_cast<int32_t>(id);
    const int32_t cached = ledger.match_prefix(seq, prompt);
    const auto rest = static_cast<int32_t>(prompt.size()) - cached;
    ledger.execute({ReferenceCall::Prefill, 0, {prefill_row(seq, prompt, cached, rest, true)}});
  }
  void decode(Sequence& seq, int32_t token) {
    ledger.execute({ReferenceCall::DecodeBatch, 0, {decode_row(seq, token)}});
  }

  BlockManager blocks;
  StateCheckpoints checkpoints;
  HybridDevice device;
  KvLedger ledger;
};

TEST(StateCheckpoints, ARepeatedPromptResumesFromItsLastFullBlock) {
  Harness h(16);
  const std::vector<int32_t> prompt = counting(1, 10);
  Sequence a, b;
  h.prefill(a, 1, prompt);
  EXPECT_EQ(h.device.resumed.length, 0);
  // The interval's boundary and the last full block's are both 8: one checkpoint.
  EXPECT_EQ(h.device.marks, (std::vector<int32_t>{0, 8, 0}));
  h.ledger.free_sequence(a);
  h.prefill(b, 2, prompt);
  EXPECT_EQ(h.device.resumed.length, 8);
  EXPECT_EQ(h.device.resumed.index, 0);
  EXPECT_EQ(b.cached_len, 8);
  EXPECT_TRUE(h.device.marks.empty());  // the prefill starts at 8: nothing left to keep
  EXPECT_EQ(h.checkpoints.num_indexed(), 1);
  h.ledger.free_sequence(b);
  h.blocks.check_invariants();
}

TEST(StateCheckpoints, EvictingTheBlockBeforeACheckpointFreesIt) {
  Harness h(3);
  const std::vector<int32_t> prompt = counting(1, 10);
  Sequence a, b, c;
  h.prefill(a, 1, prompt);
  h.ledger.free_sequence(a);  // blocks 0 and 1 cached, block 2 plain
  EXPECT_EQ(h.checkpoints.num_indexed(), 1);
  // A plain block, then a's cached tail block (positions 4-7): a's checkpoint goes with it, and
  // b's own at 4 is the only one left.
  h.prefill(b, 2, counting(50, 6));
  EXPECT_EQ(h.checkpoints.num_indexed(), 1);
  EXPECT_EQ(h.checkpoints.num_free(), h.checkpoints.count() - 1);
  h.ledger.free_sequence(b);
  h.prefill(c, 3, prompt);  // nothing to resume; its blocks evict b's
  EXPECT_EQ(h.device.resumed.length, 0);
  EXPECT_EQ(h.checkpoints.num_indexed(), 1);
  h.ledger.free_sequence(c);
  h.blocks.reset_prefix_cache();  // drops every cached hash, and with it c's checkpoint
  EXPECT_EQ(h.checkpoints.num_indexed(), 0);
  h.checkpoints.check_invariants();
  h.blocks.check_invariants();
}

TEST(StateCheckpoints, TheLeastRecentlyUsedGoesFirst) {
  Harness h(32, 1);
  const std::vector<int32_t> first = counting(1, 10), other = counting(30, 10);
  Sequence s[4];
  h.prefill(s[0], 1, first);
  h.ledger.free_sequence(s[0]);
  h.prefill(s[1], 2, other);  // takes the one checkpoint
  EXPECT_EQ(h.device.marks, (std::vector<int32_t>{0, 8, 0}));
  h.ledger.free_sequence(s[1]);
  h.prefill(s[2], 3, first);
  EXPECT_EQ(h.device.resumed.length, 0);
  h.ledger.free_sequence(s[2]);
  h.prefill(s[3], 4, first);
  EXPECT_EQ(h.device.resumed.length, 8);
  h.ledger.free_sequence(s[3]);
}

TEST(StateCheckpoints, TwoRowsOfOnePromptWriteOneCheckpoint) {
  Harness h(16);
  const std::vector<int32_t> prompt = counting(1, 9);
  Sequence a, b;
  a.session_hash = 1;
  b.session_hash = 2;
  a.prompt_len = b.prompt_len = 9;
  h.ledger.match_prefix(a, prompt);
  h.ledger.match_prefix(b, prompt);
  h.ledger.execute({ReferenceCall::PrefillBatchChunk,
                    1,
                    {prefill_row(a, prompt, 0, 9, true), prefill_row(b, prompt, 0, 9, true)}});
  EXPECT_EQ(h.device.marks, (std::vector<int32_t>{0, 8, 0}));
  EXPECT_EQ(h.checkpoints.num_indexed(), 1);
  h.ledger.free_sequence(a);
  h.ledger.free_sequence(b);
}

TEST(StateCheckpoints, AFailedForwardGivesItsCheckpointsBack) {
  Harness h(16);
  const std::vector<int32_t> prompt = counting(1, 18);
  Sequence a;
  a.session_hash = 1;
  a.prompt_len = 18;
  StepPlan plan{ReferenceCall::Prefill, 0, {prefill_row(a, prompt, 0, 18, true)}};
  // Interval boundaries 8 and 16; the last full block's is 16 too.
  EXPECT_EQ(h.checkpoints.plan(plan, {}), (std::vector<int32_t>{0, 8, 0, 0, 16, 1}));
  EXPECT_EQ(h.checkpoints.num_free(), 2);
  h.checkpoints.check_invariants();
  h.checkpoints.abandon();
  EXPECT_EQ(h.checkpoints.num_free(), 4);
  EXPECT_EQ(h.checkpoints.num_indexed(), 0);
  h.checkpoints.check_invariants();
}

TEST(StateCheckpoints, TheRenderedHistorysEndIsKept) {
  Harness h(16, 4, 64);
  const std::vector<int32_t> prompt = counting(1, 14);
  Sequence a;
  h.device.history_ends[1] = 6;  // the block boundary before it: 4
  h.prefill(a, 1, prompt);
  EXPECT_EQ(h.device.marks, (std::vector<int32_t>{0, 4, 0, 0, 12, 1}));
  h.ledger.free_sequence(a);
}

TEST(StateCheckpoints, ADecodeKeepsOneCheckpointAtTheLastBoundaryItPassed) {
  Harness h(16);
  const std::vector<int32_t> prompt = counting(1, 6);
  Sequence a;
  h.prefill(a, 1, prompt);  // the last full block's boundary: 4
  EXPECT_EQ(h.checkpoints.num_indexed(), 1);
  h.decode(a, 7);  // position 6
  EXPECT_TRUE(h.device.copies.empty());
  h.decode(a, 8);  // position 7: reaches 8
  ASSERT_EQ(h.device.copies.size(), 1u);
  EXPECT_EQ(h.device.copies[0].slot, 1);
  EXPECT_EQ(h.device.copies[0].token, -1);  // the slot's state as the forward left it
  EXPECT_EQ(h.checkpoints.num_indexed(), 2);
  for (int32_t t = 9; t <= 12; ++t) h.decode(a, t);  // reaches 12: 8's gives way
  ASSERT_EQ(h.device.copies.size(), 1u);
  EXPECT_EQ(h.checkpoints.num_indexed(), 2);
  h.ledger.free_sequence(a);
  // The next turn repeats the history and the reply: it resumes at 12.
  Sequence b;
  h.prefill(b, 2, counting(1, 14));
  EXPECT_EQ(h.device.resumed.length, 12);
  h.ledger.free_sequence(b);
}

TEST(StateCheckpoints, AVerifyRowPassingABoundaryKeepsTheStateAfterThatToken) {
  Harness h(16);
  const std::vector<int32_t> prompt = counting(1, 6);
  Sequence a;
  h.prefill(a, 1, prompt);
  // Pending 7 at position 6, drafts 8 9 10: the row reaches 8 after its second token.
  h.ledger.execute({ReferenceCall::DecodeVerifyBatched, 0, verify_rows({7, 8, 9, 10}, {3}, {&a})});
  ASSERT_EQ(h.device.copies.size(), 1u);
  EXPECT_EQ(h.device.copies[0].token, 1);
  h.ledger.commit_accepted_prefix(a, 1, 3);  // only 7 stands
  h.ledger.free_sequence(a);
  h.checkpoints.check_invariants();
}

TEST(StateCheckpoints, RefusesABadShape) {
  BlockManager blocks(4, kBlock);
  EXPECT_THROW(StateCheckpoints(blocks, 0, 8), std::invalid_argument);
  EXPECT_THROW(StateCheckpoints(blocks, 2, 6), std::invalid_argument);
}

}  // namespace
}  // namespace met
