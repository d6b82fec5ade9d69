// StepPlan builders, and the scheduler's production path: without trace hooks every forward is
// one execute and a greedy decode step reads its argmax from that same call.
#include <gtest/gtest.h>

#include <vector>

#include "met/scheduler.h"
#include "met/step_plan.h"

namespace met {
namespace {

TEST(StepPlanRows, VerifyRowsTakeTheirPendingTokenAndDraftInOrder) {
  Sequence a, b;
  a.seq_len = 5;
  b.seq_len = 9;
  const auto rows = verify_rows({1, 2, 3, 4, 5}, {2, 1}, {&a, &b});
  ASSERT_EQ(rows.size(), 2u);
  EXPECT_EQ(rows[0].tokens, (std::vector<int32_t>{1, 2, 3}));
  EXPECT_EQ(rows[0].start, 5);
  EXPECT_EQ(rows[0].draft, 2);
  EXPECT_EQ(rows[1].tokens, (std::vector<int32_t>{4, 5}));
  EXPECT_EQ(rows[1].start, 9);
  EXPECT_EQ(rows[1].kind, RowKind::Verify);
}

TEST(StepPlanRows, APrefillRowIsItsSliceOfThePrompt) {
  Sequence s;
  const std::vector<int32_t> prompt{7, 8, 9, 10, 11};
  const PlanRow row = prefill_row(s, prompt, 1, 3, false);
  EXPECT_EQ(row.tokens, (std::vector<int32_t>{8, 9, 10}));
  EXPECT_EQ(row.start, 1);
  EXPECT_FALSE(row.last_chunk);
  EXPECT_EQ(row.prompt, &prompt);
}

// Answers every row with `last input token + 1`; counts what the scheduler asks.
class CountingBackend : public Backend {
 public:
  DeviceInfo open() override { return DeviceInfo{64, 16, 100, false, 1, 2}; }
  int32_t num_free_blocks() override { return 100; }
  void alloc_sequence(Sequence& seq, int32_t /*budget*/) override { seq.slot = 0; }
  void free_sequence(Sequence& seq) override { seq.block_table.clear(); }
  void compact_sequence(Sequence& seq, int64_t new_slot) override { seq.slot = new_slot; }
  std::vector<int32_t> execute(const StepPlan& plan) override {
    calls.push_back(plan.call);
    rows.clear();
    for (const PlanRow& r : plan.rows) {
      r.seq->seq_len = r.start + static_cast<int32_t>(r.tokens.size());
      rows.push_back(r.tokens.back() + 1);
    }
    return plan.argmax ? rows : std::vector<int32_t>{};
  }
  void commit_accepted_prefix(Sequence& /*seq*/, int32_t /*na*/, int32_t /*k*/) override {}
  int32_t argmax_on_device(int32_t row, int32_t /*stream*/) override { return rows.at(row); }
  std::vector<int32_t> argmax_batch(int32_t /*row*/, int32_t /*n*/, int32_t /*stream*/) override {
    ++argmax_batch_calls;
    return {};
  }
  std::vector<SampledToken> sample_rows(const std::vector<SampleRow>& /*rows*/) override {
    return {};
  }

  std::vector<ReferenceCall> calls;
  std::vector<int32_t> rows;
  int argmax_batch_calls = 0;
};

TEST(StepPlanScheduler, AGreedyDecodeStepIsOneExecuteWithItsArgmax) {
  CountingBackend backend;
  SchedulerConfig cfg;
  cfg.max_prefill_tokens = 8;
  Scheduler sched(backend, cfg);
  Request r;
  r.id = 1;
  r.prompt = {10, 11, 12};
  r.params.max_tokens = 4;
  sched.add_request(r);
  sched.close_inbox();
  for (int tick = 1; tick < 20 && !sched.tick(tick).shutdown; ++tick) {
  }
  const std::vector<ReferenceCall> want{ReferenceCall::PrefillChunk, ReferenceCall::DecodeBatch,
                                        ReferenceCall::DecodeBatch, ReferenceCall::DecodeBatch};
  EXPECT_EQ(backend.calls, want);
  EXPECT_EQ(backend.argmax_batch_calls, 0);
  std::vector<int32_t> output;
  for (const ClientEvent& e : sched.take_events()) {
    if (e.kind == ClientEvent::Kind::Done) output = e.output;
  }
  EXPECT_EQ(output, (std::vector<int32_t>{13, 14, 15, 16}));
}

}  // namespace
}  // namespace met
