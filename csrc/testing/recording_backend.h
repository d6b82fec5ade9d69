// Owns: the recording fake model of the trace spec (section 2): slot pool, KV block counter,
// per-request scripts, the logits rows of the last forward, and the trace buffer its lines go to.
// Called by: the scheduler (as its Backend and its TraceHooks) inside the scenario harness; tests.
// Invariants: every recorded call appends exactly one line, in call order, to the same buffer the
// scheduler's effect applier writes `fx` lines to; the fake's answers depend only on the scripts
// and the call history, so a run is byte-for-byte reproducible.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "met/backend.h"
#include "met/effects.h"
#include "met/step_plan.h"
#include "met/trace_hooks.h"

namespace met::testing {

class TraceBuffer : public TraceSink {
 public:
  void line(const std::string& text) override { lines_.push_back(text); }
  // Lines joined with '\n', one final '\n'.
  std::string text() const;

 private:
  std::vector<std::string> lines_;
};

struct FakeModelConfig {
  int32_t vocab = 64;
  int32_t block_size = 16;
  int32_t total_blocks = 1000;
  int32_t held_blocks = 0;  // pinned outside any sequence
  // Blocks reclaim_prefix_blocks could hand back; accepted for scenario-file compatibility, met's
  // scheduler never reclaims.
  int32_t reclaimable = 0;
  std::vector<int32_t> kv_exhaust_at;      // 0-based decode_batch call indexes that fail
  std::vector<int32_t> verify_exhaust_at;  // 0-based verify forward indexes that fail (both kinds)
};

struct Script {
  int32_t prompt_len = 0;
  std::vector<int32_t> toks;  // the planned output; past the end the last token repeats
  int32_t cancel_at = -1;     // -1: never; else raise the cancel flag at this many generated
};

// The fake executor (Backend) and the trace adapter (TraceHooks) in one: each plan is spelled
// back as the reference call it stands for, each hook as the reference's no-op call.
class RecordingBackend : public Backend, public TraceHooks {
 public:
  explicit RecordingBackend(FakeModelConfig cfg);

  void add_script(uint64_t request_id, Script script);
  // Called with t on the occupancy query that marks tick t, before `-- tick t` is written.
  void set_tick_gate(std::function<void(int32_t)> gate) { gate_ = std::move(gate); }
  // Called with the request id when a script's cancel_at is reached.
  void set_cancel_hook(std::function<void(uint64_t)> hook) { cancel_ = std::move(hook); }
  TraceBuffer& trace() { return trace_; }

  // --- Backend (recording_backend.cpp) ---
  DeviceInfo open() override;
  int32_t num_free_blocks() override;
  void alloc_sequence(Sequence& seq, int32_t budget) override;
  void free_sequence(Sequence& seq) override;
  void compact_sequence(Sequence& seq, int64_t new_slot) override;
  std::vector<int32_t> execute(const StepPlan& plan) override;  // recording_calls.cpp
  void commit_accepted_prefix(Sequence& seq, int32_t na, int32_t k) override;
  int32_t argmax_on_device(int32_t row, int32_t stream) override;
  std::vector<int32_t> argmax_batch(int32_t row, int32_t n, int32_t stream) override;
  std::vector<SampledToken> sample_rows(const std::vector<SampleRow>& rows) override;

  // --- TraceHooks (recording_calls.cpp) ---
  void bind_gpu_to_thread() override;
  void stream_created(int32_t stream) override;
  void event_created(int32_t event) override;
  void record_event(int32_t event, int32_t stream) override;
  void stream_wait_event(int32_t stream, int32_t event) override;
  void stream_synchronized(int32_t stream) override;
  void torn_down() override;
  void status_snapshot() override;
  void adapter_id_for(int32_t slot) override;
  void acquire_adapter_slot(int32_t slot) override;
  void ep_broadcast_cmd_for_seq(uint32_t seq, uint32_t cmd) override;
  void ep_broadcast_cmd(uint32_t word) override;
  void ep_broadcast_tokens(const std::vector<int32_t>& tokens) override;
  void ep_sync_vision_embeds(int32_t n) override;
  void poll_innerq() override;
  void normalize_ssm_states(const Sequence& seq, int32_t stream) override;
  void decode_marconi_checkpoint(const Sequence& seq) override;
  void commit_ctx(const Sequence& seq, int32_t n, int32_t base, int32_t row) override;
  void argmax_batch(int32_t row, int32_t n, int32_t stream,
                    const std::vector<int32_t>& tokens) override;
  void copy_logits_to_host(int32_t row, int32_t n) override;
  void cache_sequence(const Sequence& seq) override;

 private:
  // The reference's forward calls, each run on the fake and recorded as its line.
  void prefill(Sequence& seq, const std::vector<int32_t>& prompt, int32_t stream);
  void prefill_chunk(Sequence& seq, const std::vector<int32_t>& prompt, int32_t start, int32_t len,
                     bool last, int32_t stream);
  void mixed_forward(const std::vector<Sequence*>& decode_seqs,
                     const std::vector<int32_t>& decode_tokens, const PrefillSlice& slice,
                     int32_t stream);
  void mixed_forward_batch(const std::vector<Sequence*>& decode_seqs,
                           const std::vector<int32_t>& decode_tokens,
                           const std::vector<PrefillSlice>& slices, int32_t stream);
  void prefill_batch_chunk(const std::vector<PrefillSlice>& slices, int32_t stream);
  std::vector<int32_t> decode_batch(const std::vector<int32_t>& tokens,
                                    const std::vector<Sequence*>& seqs, int32_t stream,
                                    bool argmax);
  std::vector<int32_t> decode_verify_batched(const std::vector<int32_t>& tokens,
                                             const std::vector<int32_t>& ks,
                                             const std::vector<Sequence*>& seqs, int32_t stream,
                                             bool argmax);
  void mixed_verify_batch(const std::vector<int32_t>& tokens, const std::vector<int32_t>& ks,
                          const std::vector<Sequence*>& seqs,
                          const std::vector<PrefillSlice>& slices, int32_t stream);

  void record(const std::string& text) { trace_.line(text); }
  int32_t snapshot_pool_occupancy();
  const Script& script_for(const Sequence& seq) const;
  int32_t out_after(const Sequence& seq, int32_t pos) const;
  int32_t script_at(const Sequence& seq, int32_t pos) const;
  void verify_row(Sequence& seq, const int32_t* tokens, int32_t n);
  std::string verify_text(const std::vector<int32_t>& tokens, const std::vector<int32_t>& ks,
                          const std::vector<Sequence*>& seqs) const;
  bool verify_exhausted(const std::string& text);
  int32_t take_slot();
  void release_slot(int64_t slot);
  void grow_blocks(Sequence& seq);
  int32_t chunk(Sequence& seq, const std::vector<int32_t>& prompt, int32_t start, int32_t len);
  int32_t decode_row(Sequence& seq, int32_t token);
  std::string slice_text(const PrefillSlice& s) const;
  int32_t checked_row(int32_t row) const;

  FakeModelConfig cfg_;
  TraceBuffer trace_;
  std::map<uint64_t, Script> scripts_;
  std::vector<int64_t> free_slots_;  // sorted descending: the smallest is popped from the back
  int64_t next_slot_ = 0;
  int32_t used_blocks_ = 0;
  std::vector<int32_t> rows_;  // next-token answer per logits row of the last forward
  std::map<int32_t, std::vector<uint16_t>> host_rows_;  // BF16 logits copied to the host
  int32_t decode_calls_ = 0;
  int32_t verify_calls_ = 0;
  int32_t occupancy_calls_ = 0;
  int32_t gate_tick_ = 0;
  int32_t next_event_ = 2;
  std::function<void(int32_t)> gate_;
  std::function<void(uint64_t)> cancel_;
};

}  // namespace met::testing
