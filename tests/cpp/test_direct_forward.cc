// DirectForward: decode and verify plans without a grammar row run on the RowForward without
// reaching the device backend's forward, their argmax readback comes from that forward, their
// plain rows are drawn by it, their other sampled rows reach the device backend with that
// forward's logits, and a scheduler over it gives the same outputs as over the device backend
// alone.
#include <gtest/gtest.h>

#include <algorithm>
#include <stdexcept>
#include <utility>
#include <vector>

#include "echo_device.h"
#include "met/block_manager.h"
#include "met/direct_forward.h"
#include "met/scheduler.h"
#include "met/step_plan.h"

namespace met {
namespace {

constexpr int64_t kVocab = 256;

// The echo rule on the core's side of the boundary, as logits too (one-hot at the echo token),
// and as its draw; counts the plans it ran and the rows it drew.
class EchoRows : public RowForward {
 public:
  std::vector<int32_t> argmax_rows(const StepPlan& plan) override {
    calls.push_back(plan.call);
    std::vector<int32_t> picks = echo_rows(plan);
    logits_.assign(picks.size() * kVocab, 0.0f);
    for (size_t i = 0; i < picks.size(); ++i) logits_[i * kVocab + picks[i]] = 1.0f;
    return picks;
  }
  const float* logits() const override { return logits_.data(); }
  int64_t vocab() const override { return kVocab; }
  std::vector<int32_t> draw(const std::vector<SampleRow>& rows) override {
    std::vector<int32_t> out;
    for (const SampleRow& row : rows) {
      EXPECT_TRUE(row.plain_draw());
      const float* logits = logits_.data() + row.row * kVocab;
      out.push_back(static_cast<int32_t>(std::max_element(logits, logits + kVocab) - logits));
    }
    draws += static_cast<int>(rows.size());
    return out;
  }
  bool runs(const StepPlan& plan) const override {
    return std::none_of(plan.rows.begin(), plan.rows.end(),
                        [this](const PlanRow& r) { return r.draft > max_draft; });
  }
  bool put_back(const Sequence& seq, int32_t na) override {
    if (!keeps_state) return false;
    put_backs.emplace_back(seq.session_hash, na);
    return true;
  }
  std::vector<ReferenceCall> calls;
  int draws = 0;
  int32_t max_draft = 1 << 30;  // a verify row with more drafts than this it cannot run
  bool keeps_state = false;     // whether it puts back a verify's rejected drafts itself
  std::vector<std::pair<uint64_t, int32_t>> put_backs;

 private:
  std::vector<float> logits_;
};

Sequence sequence(uint64_t id, int32_t blocks) {
  Sequence s;
  s.session_hash = id;
  for (int32_t b = 0; b < blocks; ++b) s.block_table.push_back(b);
  return s;
}

TEST(DirectForward, AGreedyDecodeOrVerifyRunsOnTheRowForwardAndItsReadbackComesFromIt) {
  EchoDevice device(4);
  EchoRows rows;
  DirectForward direct(device, rows);
  Sequence a = sequence(1, 2), b = sequence(2, 2);
  a.tokens = {1, 2, 3};
  b.tokens = {4, 5};
  StepPlan decode{ReferenceCall::DecodeBatch, 0, {decode_row(a, 10), decode_row(b, 20)}};
  decode.argmax = true;
  EXPECT_EQ(direct.execute(decode), (std::vector<int32_t>{11, 21}));
  StepPlan verify{ReferenceCall::DecodeVerifyBatched, 0, verify_rows({30, 31, 32}, {2}, {&a})};
  verify.argmax = true;
  EXPECT_EQ(direct.execute(verify), (std::vector<int32_t>{31, 32, 33}));
  EXPECT_EQ(direct.argmax_batch(1, 2, 0), (std::vector<int32_t>{32, 33}));
  EXPECT_EQ(direct.argmax_on_device(0, 0), 31);
  EXPECT_THROW(direct.argmax_batch(2, 2, 0), std::out_of_range);
  SampleRow second, scored;
  second.row = 1;
  scored.params.top_logprobs = 0;  // a logprob: the device backend's host sampler scores it
  const std::vector<SampledToken> picks = direct.sample_rows({second, scored});
  EXPECT_EQ(picks.at(0).token, 32);  // drawn by the RowForward
  EXPECT_EQ(picks.at(1).token, 31);  // sampled from the direct logits
  EXPECT_EQ(rows.draws, 1);
  EXPECT_EQ(device.sampled_logits, 1);
  StepPlan sampled{ReferenceCall::DecodeBatch, 0, {decode_row(b, 40)}};  // no argmax readback
  EXPECT_TRUE(direct.execute(sampled).empty());
  EXPECT_EQ(direct.sample_rows({SampleRow{}}).at(0).token, 41);
  EXPECT_EQ(rows.draws, 2);
  EXPECT_TRUE(device.calls.empty());
  EXPECT_EQ(rows.calls.size(), 3u);
  EXPECT_EQ(direct.direct_steps(), 3);
  EXPECT_EQ(direct.device_steps(), 0);
}

TEST(DirectForward, GrammarAndPrefillPlansGoToTheDevice) {
  EchoDevice device(4);
  EchoRows rows;
  DirectForward direct(device, rows);
  Sequence a = sequence(1, 2);
  StepPlan masked{ReferenceCall::DecodeBatch, 0, {decode_row(a, 10)}};
  masked.grammar = true;  // its masks are the device backend's work
  EXPECT_TRUE(direct.execute(masked).empty());
  SampleRow row;
  EXPECT_EQ(direct.sample_rows({row}).at(0).token, 11);
  EXPECT_EQ(device.sampled_logits, 0);
  const std::vector<int32_t> prompt = {7, 8, 9};
  StepPlan prefill{ReferenceCall::Prefill, 0, {prefill_row(a, prompt, 0, 3, true)}};
  prefill.argmax = true;  // even asked for its argmax, a prefill row stays with the device
  direct.execute(prefill);
  EXPECT_EQ(direct.argmax_on_device(0, 0), 10);
  EXPECT_TRUE(rows.calls.empty());
  EXPECT_EQ(device.calls.size(), 2u);
  EXPECT_EQ(direct.device_steps(), 2);
}

TEST(DirectForward, APlanTheRowForwardCannotRunYetGoesToTheDevice) {
  EchoDevice device(4);
  EchoRows rows;
  rows.max_draft = 1;  // as a hybrid's forward with one token's snapshots to spare
  DirectForward direct(device, rows);
  Sequence a = sequence(1, 2);
  a.tokens = {1, 2, 3};
  a.seq_len = 3;
  StepPlan longer{ReferenceCall::DecodeVerifyBatched, 0, verify_rows({30, 31, 32}, {2}, {&a})};
  direct.execute(longer);
  StepPlan shorter{ReferenceCall::DecodeVerifyBatched, 0, verify_rows({30, 31}, {1}, {&a})};
  direct.execute(shorter);
  EXPECT_EQ(device.calls.size(), 1u);
  EXPECT_EQ(rows.calls.size(), 1u);
}

TEST(DirectForward, AVerifysRejectedDraftsAreTheRowForwardsToPutBackWhenItKeepsAState) {
  EchoDevice device(4);
  EchoRows rows;
  DirectForward direct(device, rows);
  Sequence a = sequence(1, 2);
  direct.commit_accepted_prefix(a, 1, 2);  // it keeps nothing: the device backend hears of it
  EXPECT_EQ(device.restores, 1);
  rows.keeps_state = true;
  direct.commit_accepted_prefix(a, 2, 3);
  EXPECT_EQ(device.restores, 1);
  EXPECT_EQ(rows.put_backs, (std::vector<std::pair<uint64_t, int32_t>>{{1, 2}}));
}

// Outputs by request id, run to shutdown.
std::vector<std::vector<int32_t>> serve(Backend& backend, BlockManager& blocks) {
  SchedulerConfig cfg;
  cfg.max_prefill_tokens = 4;
  cfg.spec.mode = SpecMode::NgramForced;
  Scheduler sched(backend, cfg, nullptr, nullptr, &blocks);
  // A repeating prompt, so the n-gram proposer drafts and verify steps run.
  sched.add_request(request(0, {1, 2, 3, 1, 2, 3, 1, 2}, 12));
  sched.add_request(request(1, {5, 6, 7}, 9));
  sched.add_request(request(2, {9, 9, 9, 9, 9}, 7, 0.8f));  // drawn on the host
  Request scored = request(4, {3, 3}, 6, 0.8f);
  scored.params.top_logprobs = 2;  // sampled by the device backend's host sampler
  sched.add_request(std::move(scored));
  Request masked = request(3, {4, 4, 4}, 5);
  masked.params.constrained = true;  // a grammar row: its steps stay with the device backend
  sched.add_request(std::move(masked));
  std::vector<std::vector<int32_t>> out(5);
  for (const ClientEvent& e : run(sched)) out.at(e.request_id) = e.output;
  EXPECT_GT(sched.spec_stats().verify_steps, 0);
  return out;
}

TEST(DirectForwardScheduler, OutputsAreTheDeviceBackendsAndNoBlockIsLeft) {
  BlockManager alone_blocks(64, 4), direct_blocks(64, 4);
  EchoDevice alone(4), device(4);
  EchoRows rows;
  DirectForward direct(device, rows);
  const auto expected = serve(alone, alone_blocks);
  const auto got = serve(direct, direct_blocks);
  EXPECT_EQ(got, expected);
  EXPECT_EQ(got.at(1).size(), 9u);
  EXPECT_GT(direct.direct_steps(), 0);
  EXPECT_GT(direct.device_steps(), 0);  // the prefills, and the steps with the grammar request
  EXPECT_GT(rows.draws, 0);             // the drawn request's direct steps
  EXPECT_GT(device.sampled_logits, 0);  // the scored request's
  EXPECT_EQ(direct_blocks.num_free_blocks(), 64);
  direct_blocks.check_invariants();
}

// The device reports more blocks than the pool holds: the ledger runs out before a direct decode,
// one sequence is preempted and prefilled again, and both end as they would alone.
TEST(DirectForwardScheduler, ExhaustionBeforeADirectDecodePreemptsAndOutputsStand) {
  BlockManager blocks(5, 4);
  EchoDevice device(4, 100);
  EchoRows rows;
  DirectForward direct(device, rows);
  Scheduler sched(direct, SchedulerConfig{}, nullptr, nullptr, &blocks);
  sched.add_request(request(1, counting(1, 5), 8));
  sched.add_request(request(2, counting(30, 5), 8));
  const std::vector<ClientEvent> done = run(sched);
  ASSERT_EQ(done.size(), 2u);
  for (const ClientEvent& e : done) {
    EXPECT_EQ(e.output, counting(e.request_id == 1 ? 6 : 35, 8)) << "request " << e.request_id;
  }
  EXPECT_EQ(sched.stats().preemptions, 1);
  EXPECT_GT(direct.direct_steps(), 0);
  EXPECT_EQ(blocks.num_free_blocks(), 5);
  blocks.check_invariants();
}

}  // namespace
}  // namespace met
