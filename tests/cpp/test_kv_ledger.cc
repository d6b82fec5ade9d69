// KvLedger: the scheduler's KV bookkeeping around a device backend that keeps none (as the torch
// backend keeps none): tables grown before a forward, KvExhausted before anything advances, the
// token history and prefix-cache commits after it, a verify's rollback, release with the
// sequence, and no block left behind.
#include <gtest/gtest.h>

#include <algorithm>
#include <vector>

#include "echo_device.h"
#include "met/block_manager.h"
#include "met/kv_ledger.h"
#include "met/scheduler.h"
#include "met/state_pool.h"
#include "met/step_plan.h"

namespace met {
namespace {

TEST(KvLedger, AShortRowStopsThePlanBeforeTheDeviceAndAdvancesNothing) {
  BlockManager blocks(3, 4);
  EchoDevice device(4);
  KvLedger ledger(device, blocks);
  Sequence a, b;
  a.session_hash = 1;
  b.session_hash = 2;
  const std::vector<int32_t> prompt = counting(1, 8);
  StepPlan plan{ReferenceCall::PrefillBatchChunk,
                1,
                {prefill_row(a, prompt, 0, 8, true), prefill_row(b, prompt, 0, 8, true)}};
  EXPECT_THROW(ledger.execute(plan), KvExhausted);
  EXPECT_TRUE(device.calls.empty());
  EXPECT_TRUE(a.tokens.empty());
  EXPECT_TRUE(b.tokens.empty());
  EXPECT_EQ(a.seq_len, 0);
  EXPECT_EQ(b.seq_len, 0);
  blocks.check_invariants();
  ledger.free_sequence(a);
  ledger.free_sequence(b);
  EXPECT_EQ(blocks.num_free_blocks(), 3);
  blocks.check_invariants();
}

TEST(KvLedger, AVerifyKeepsItsAcceptedPrefixAndCommitsOnlyThat) {
  BlockManager blocks(8, 4);
  EchoDevice device(4);
  KvLedger ledger(device, blocks);
  Sequence s;
  s.session_hash = 7;
  const std::vector<int32_t> prompt = counting(1, 3);
  ledger.execute({ReferenceCall::Prefill, 0, {prefill_row(s, prompt, 0, 3, true)}});
  // Pending token 4, drafts 5 6 7 8: positions 3..7, across the first block boundary.
  StepPlan verify{ReferenceCall::DecodeVerifyBatched, 0, verify_rows({4, 5, 6, 7, 8}, {4}, {&s})};
  ledger.execute(verify);
  EXPECT_EQ(s.seq_len, 8);
  // Not one draft block is committed before the verify says how many stand.
  EXPECT_NO_THROW(blocks.rollback(7, 3));
  ledger.commit_accepted_prefix(s, 2, 4);  // 4 and 5 stand
  EXPECT_EQ(s.tokens, counting(1, 5));
  EXPECT_EQ(s.seq_len, 5);
  EXPECT_EQ(device.restores, 1);
  ledger.execute({ReferenceCall::DecodeVerifyBatched, 0, verify_rows({6, 7}, {1}, {&s})});
  ledger.commit_accepted_prefix(s, 2, 1);  // all stand: nothing for the device to put back
  EXPECT_EQ(device.restores, 1);
  EXPECT_EQ(s.tokens, counting(1, 7));
  ledger.free_sequence(s);
  blocks.check_invariants();
  // The one full block that stood (tokens 1..4) is cached: the same prompt finds it.
  Sequence again;
  again.session_hash = 8;
  EXPECT_EQ(ledger.match_prefix(again, counting(1, 6)), 4);
  EXPECT_EQ(again.tokens, counting(1, 4));
  EXPECT_EQ(again.cached_len, 4);
  EXPECT_EQ(again.block_table.size(), 1u);
  ledger.free_sequence(again);
  EXPECT_EQ(blocks.num_free_blocks(), 8);
  blocks.check_invariants();
}

TEST(KvLedgerScheduler, ThePrefixCacheServesARepeatedPromptAndNoBlockIsLeft) {
  BlockManager blocks(32, 4);
  EchoDevice device(4);
  SchedulerConfig cfg;
  cfg.max_prefill_tokens = 4;
  Scheduler sched(device, cfg, nullptr, nullptr, &blocks);
  sched.add_request(request(1, counting(10, 9), 6));
  std::vector<ClientEvent> first = run(sched);
  Scheduler again(device, cfg, nullptr, nullptr, &blocks);
  again.add_request(request(2, counting(10, 9), 6));
  std::vector<ClientEvent> second = run(again);
  ASSERT_EQ(first.size(), 1u);
  ASSERT_EQ(second.size(), 1u);
  EXPECT_EQ(first[0].output, counting(19, 6));
  EXPECT_EQ(second[0].output, first[0].output);
  EXPECT_EQ(first[0].cached, 0);
  EXPECT_EQ(second[0].cached, 8);
  EXPECT_EQ(blocks.num_free_blocks(), 32);
  blocks.check_invariants();
}

// The device reports more blocks than the pool holds, so both requests are admitted and the
// pool runs out mid-decode: one is preempted and resumed, and both end as they would alone.
TEST(KvLedgerScheduler, ExhaustionPreemptsAndTheOutputsStandUnchanged) {
  BlockManager blocks(5, 4);
  EchoDevice device(4, 100);
  Scheduler sched(device, SchedulerConfig{}, nullptr, nullptr, &blocks);
  sched.add_request(request(1, counting(1, 5), 8));
  sched.add_request(request(2, counting(30, 5), 8));
  std::vector<ClientEvent> done = run(sched);
  ASSERT_EQ(done.size(), 2u);
  // Two prefills, then the preempted sequence's prefill of its prompt and output again.
  EXPECT_EQ(std::count(device.calls.begin(), device.calls.end(), ReferenceCall::Prefill), 3);
  EXPECT_EQ(sched.stats().preemptions, 1);
  for (const ClientEvent& e : done) {
    const int32_t first = e.request_id == 1 ? 6 : 35;
    EXPECT_EQ(e.output, counting(first, 8)) << "request " << e.request_id;
  }
  EXPECT_EQ(blocks.num_free_blocks(), 5);
  blocks.check_invariants();
}

// With a state pool (a hybrid model's), each admission, the preempted sequence's again included,
// reaches the device holding a state slot, and every slot is free at the end.
TEST(KvLedgerScheduler, EverySequenceHoldsAStateSlotFromAdmissionToRelease) {
  BlockManager blocks(5, 4);
  StatePool states(2);
  EchoDevice device(4, 100);
  Scheduler sched(device, SchedulerConfig{}, nullptr, nullptr, &blocks, &states);
  sched.add_request(request(1, counting(1, 5), 8));
  sched.add_request(request(2, counting(30, 5), 8));
  ASSERT_EQ(run(sched).size(), 2u);
  EXPECT_EQ(sched.stats().preemptions, 1);
  ASSERT_EQ(device.state_slots.size(), 3u);  // two admissions and the resumed one
  EXPECT_EQ(device.state_slots[0], 0);
  EXPECT_EQ(device.state_slots[1], 1);
  EXPECT_GE(device.state_slots[2], 0);
  EXPECT_EQ(states.num_free(), 2);
  states.check_invariants();
  blocks.check_invariants();
}

// Forced drafts from the prompt's own n-grams are mostly rejected by the echo model: every
// verify rolls back, and the output is the plain decode's.
TEST(KvLedgerScheduler, SpeculativeRollbacksLeaveThePlainOutput) {
  BlockManager blocks(64, 4);
  EchoDevice device(4);
  SchedulerConfig cfg;
  cfg.spec.mode = SpecMode::NgramForced;
  cfg.spec.k = 3;
  Scheduler sched(device, cfg, nullptr, nullptr, &blocks);
  sched.add_request(request(1, {5, 6, 7, 5, 6, 7, 5, 6}, 12));
  std::vector<ClientEvent> done = run(sched);
  ASSERT_EQ(done.size(), 1u);
  EXPECT_EQ(done[0].output, counting(7, 12));
  EXPECT_GT(sched.spec_stats().verify_rows, 0);
  EXPECT_GT(device.restores, 0);
  EXPECT_EQ(blocks.num_free_blocks(), 64);
  blocks.check_invariants();
}

}  // namespace
}  // namespace met
