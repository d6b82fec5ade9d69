// A device backend for the scheduler's tests that keeps no KV state (as the torch backend keeps
// none): every logits row is answered with its input token + 1, and every row is checked to
// arrive with its blocks and its history; plus the requests and the run loop those tests share.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <utility>
#include <vector>

#include "met/backend.h"
#include "met/scheduler.h"
#include "met/step_plan.h"

namespace met {

// The echo rule for one plan: its logits rows' "argmax", laid out as StepPlan says.
inline std::vector<int32_t> echo_rows(const StepPlan& plan) {
  std::vector<int32_t> out;
  for (const PlanRow& r : plan.rows) {
    const size_t n = r.kind == RowKind::Verify ? r.tokens.size() : 1;
    for (size_t i = r.tokens.size() - n; i < r.tokens.size(); ++i) out.push_back(r.tokens[i] + 1);
  }
  return out;
}

class EchoDevice : public Backend {
 public:
  explicit EchoDevice(int32_t block_size, int32_t total_blocks = 100)
      : block_size_(block_size), total_blocks_(total_blocks) {}

  DeviceInfo open() override { return DeviceInfo{64, block_size_, total_blocks_, false, 1, 2}; }
  int32_t num_free_blocks() override {
    ADD_FAILURE() << "the ledger answers num_free_blocks";
    return 0;
  }
  void alloc_sequence(Sequence& seq, int32_t /*budget*/) override {
    seq.slot = next_slot_++;
    state_slots.push_back(seq.state_slot);
  }
  void free_sequence(Sequence& seq) override {
    EXPECT_TRUE(seq.block_table.empty());
    seq.slot = kDetachedSlot;
  }
  void compact_sequence(Sequence& seq, int64_t new_slot) override { seq.slot = new_slot; }
  std::vector<int32_t> execute(const StepPlan& plan) override {
    calls.push_back(plan.call);
    for (const PlanRow& r : plan.rows) {
      const auto end = r.start + static_cast<int32_t>(r.tokens.size());
      EXPECT_GE(static_cast<int32_t>(r.seq->block_table.size()) * block_size_, end);
      EXPECT_EQ(static_cast<int32_t>(r.seq->tokens.size()), r.start);
    }
    rows_ = echo_rows(plan);
    return plan.argmax ? rows_ : std::vector<int32_t>{};
  }
  void commit_accepted_prefix(Sequence& /*seq*/, int32_t /*na*/, int32_t /*k*/) override {
    ++restores;
  }
  int32_t argmax_on_device(int32_t row, int32_t /*stream*/) override { return rows_.at(row); }
  std::vector<int32_t> argmax_batch(int32_t row, int32_t n, int32_t /*stream*/) override {
    return {rows_.begin() + row, rows_.begin() + row + n};
  }
  std::vector<SampledToken> sample_rows(const std::vector<SampleRow>& rows) override {
    std::vector<SampledToken> out;
    for (const SampleRow& r : rows) out.push_back(SampledToken{rows_.at(r.row), 0.0f, {}});
    return out;
  }
  // Logits a DirectForward's RowForward wrote: each row's pick is its largest logit.
  std::vector<SampledToken> sample_logits(const float* logits, int64_t n_logits, int64_t vocab,
                                          const std::vector<SampleRow>& rows) override {
    std::vector<SampledToken> out;
    for (const SampleRow& r : rows) {
      EXPECT_LT(r.row, n_logits);
      const float* row = logits + r.row * vocab;
      const auto pick = static_cast<int32_t>(std::max_element(row, row + vocab) - row);
      out.push_back(SampledToken{pick, 0.0f, {}});
    }
    sampled_logits += static_cast<int>(rows.size());
    return out;
  }

  std::vector<ReferenceCall> calls;
  std::vector<int32_t> state_slots;  // each alloc_sequence's Sequence::state_slot
  int restores = 0;
  int sampled_logits = 0;  // rows sampled through sample_logits

 private:
  int32_t block_size_;
  int32_t total_blocks_;
  int64_t next_slot_ = 0;
  std::vector<int32_t> rows_;
};

// A request that ignores EOS, so its output length is max_tokens.
inline Request request(uint64_t id, std::vector<int32_t> prompt, int32_t max_tokens,
                       float temperature = 0.0f) {
  Request r;
  r.id = id;
  r.prompt = std::move(prompt);
  r.params.max_tokens = max_tokens;
  r.params.ignore_eos = true;
  r.params.temperature = temperature;
  return r;
}

// Runs the scheduler to shutdown; returns its Done events.
inline std::vector<ClientEvent> run(Scheduler& sched) {
  sched.close_inbox();
  std::vector<ClientEvent> done;
  for (int tick = 1; tick < 300 && !sched.tick(tick).shutdown; ++tick) {
    for (ClientEvent& e : sched.take_events()) {
      if (e.kind == ClientEvent::Kind::Done) done.push_back(std::move(e));
    }
  }
  return done;
}

inline std::vector<int32_t> counting(int32_t first, int32_t n) {
  std::vector<int32_t> out;
  for (int32_t i = 0; i < n; ++i) out.push_back(first + i);
  return out;
}

}  // namespace met
