// Owns: nothing; the one interface through which the scheduler reaches a device.
// Called by: the scheduler (and the effect applier) only. Implemented by RecordingBackend (C++,
// golden traces) and TorchBackend (Python, through the pybind11 trampoline in bindings/); a
// scheduler built with a block manager reaches the device through its KvLedger, which is one too,
// and on the C++ CPU forward the engine wraps TorchBackend in a DirectForward (direct_forward.h).
// Invariants: every forward is one execute(plan); the reference engine's calls that mean nothing
// to met are not here but in TraceHooks, so a tick crosses into a Python backend only for work
// the device does. "Silent" methods are queries the fake does not record.
//
// Logits rows: each execute replaces the backend's logits rows, laid out as the plan's rows
// (StepPlan: a verify row one per position, every other row one for its last position).
#pragma once

#include <cstdint>
#include <stdexcept>
#include <vector>

#include "met/step_plan.h"
#include "met/types.h"

namespace met {

// What the scheduler learns once, when it opens the backend. Silent.
struct DeviceInfo {
  int32_t vocab = 0;
  int32_t block_size = 0;
  int32_t total_blocks = 0;
  // Real device streams: join_streams and synchronize order work across them. Without, the
  // stream and event ids are labels only and the scheduler never calls either.
  bool streams = false;
  int32_t prefill_stream = 1;
  int32_t prefill_event = 2;
};

// What Backend::match_prefix returns to let the core's block manager match the prompt.
constexpr int32_t kMatchInCore = -1;

class Backend {
 public:
  virtual ~Backend() = default;

  // Creates the prefill stream and its event; called once, by the scheduler's constructor.
  virtual DeviceInfo open() = 0;
  virtual int32_t num_free_blocks() = 0;
  // Prefix-cache lookup before the first chunk; returns the number of prompt tokens reused (never
  // the last one), or kMatchInCore (the default): the scheduler's block manager matches the
  // prompt (KvLedger), and without one nothing is reused. A backend that matches itself (a
  // hybrid's state checkpoints) leaves the sequence's table in that block manager; the core then
  // sets tokens, seq_len, block_table and cached_len.
  virtual int32_t match_prefix(Sequence& /*seq*/, const std::vector<int32_t>& /*prompt*/) {
    return kMatchInCore;
  }

  // --- sequences and KV pool ---
  // Sets seq.slot; `budget` (prompt + max_tokens) is known on the chunked path, else -1.
  virtual void alloc_sequence(Sequence& seq, int32_t budget) = 0;
  virtual void free_sequence(Sequence& seq) = 0;
  virtual void compact_sequence(Sequence& seq, int64_t new_slot) = 0;

  // --- the forward ---
  // Runs the plan's rows as one forward. Returns every logits row's argmax when plan.argmax,
  // else nothing. Under a KvLedger (a scheduler with a block manager) each row's block_table
  // already covers its tokens and the ledger advances tokens/seq_len afterwards; a backend on
  // its own (the recording fake) advances them itself and throws KvExhausted (advancing
  // nothing) when a row cannot get its blocks. A verify row's tokens are not final: they must
  // not enter the prefix cache before commit_accepted_prefix says how many stand.
  virtual std::vector<int32_t> execute(const StepPlan& plan) = 0;
  // After a verify of `k` drafts: the first `na` input tokens (1 + accepted drafts) stand; the
  // rest are rolled back (seq_len and tokens shrink by k + 1 - na, the block table keeps its
  // blocks and the rejected positions are overwritten by the next forward, never read). Under a
  // KvLedger that is done already and the backend is called only when na < k + 1, to put back
  // what it keeps per position itself (a hybrid's recurrent state).
  virtual void commit_accepted_prefix(Sequence& seq, int32_t na, int32_t k) = 0;

  // --- readback of the last forward ---
  virtual int32_t argmax_on_device(int32_t row, int32_t stream) = 0;
  virtual std::vector<int32_t> argmax_batch(int32_t row, int32_t n, int32_t stream) = 0;
  // Host sampling of rows of the last forward. Silent.
  virtual std::vector<SampledToken> sample_rows(const std::vector<SampleRow>& rows) = 0;
  // Host sampling of logits the core's own forward wrote (DirectForward): `n_logits` rows of
  // `vocab` floats at `logits`, valid for this call only. Silent. The default refuses: only a
  // backend built to run beside a DirectForward can take them.
  virtual std::vector<SampledToken> sample_logits(const float* /*logits*/, int64_t /*n_logits*/,
                                                  int64_t /*vocab*/,
                                                  const std::vector<SampleRow>& /*rows*/) {
    throw std::logic_error("this backend samples only the logits of its own forwards");
  }

  // --- streams (only with DeviceInfo::streams) and shutdown ---
  // `waiting` does not run past what `recorded` has queued so far (through `event`).
  virtual void join_streams(int32_t /*event*/, int32_t /*recorded*/, int32_t /*waiting*/) {}
  virtual void synchronize(int32_t /*stream*/) {}
  virtual void teardown() {}
};

}  // namespace met
