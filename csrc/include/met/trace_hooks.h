// Owns: nothing; the reference engine's calls that do nothing in met, reported where the
// reference makes them.
// Called by: the scheduler and its effect applier, only when a TraceHooks is installed (the
// recording harness installs the fake; production installs none, so none of these costs a
// virtual call, let alone a crossing into Python). Implemented by RecordingBackend.
// Invariants: each call is reported at the exact point of the reference's call sequence, after
// every backend call before it, so a fake that records both into one buffer prints them in true
// call order (trace spec section 2.7).
#pragma once

#include <cstdint>
#include <vector>

#include "met/types.h"

namespace met {

class TraceHooks {
 public:
  virtual ~TraceHooks() = default;

  // --- lifecycle and streams (a backend without streams runs none of these) ---
  virtual void bind_gpu_to_thread() = 0;
  virtual void stream_created(int32_t stream) = 0;  // create_stream() -> stream
  virtual void event_created(int32_t event) = 0;    // create_event() -> event
  virtual void record_event(int32_t event, int32_t stream) = 0;
  virtual void stream_wait_event(int32_t stream, int32_t event) = 0;
  // synchronize(stream) and teardown(), named apart from the Backend calls of the same words.
  virtual void stream_synchronized(int32_t stream) = 0;
  virtual void torn_down() = 0;

  // The per-tick status snapshot: num_free_blocks, then the occupancy query twice.
  virtual void status_snapshot() = 0;
  // LoRA adapter cohorts (met has none: every slot is -1).
  virtual void adapter_id_for(int32_t slot) = 0;
  virtual void acquire_adapter_slot(int32_t slot) = 0;

  // The EP word protocol of a prefill announcement, a released slot and shutdown (trace spec
  // section 7); met's tensor-parallel backend derives its words from the plans instead.
  virtual void ep_broadcast_cmd_for_seq(uint32_t seq, uint32_t cmd) = 0;
  virtual void ep_broadcast_cmd(uint32_t word) = 0;
  virtual void ep_broadcast_tokens(const std::vector<int32_t>& tokens) = 0;
  virtual void ep_sync_vision_embeds(int32_t n) = 0;

  // Recurrent-state bookkeeping of SSM models (met's hybrid state moves with its forwards).
  virtual void poll_innerq() = 0;
  virtual void normalize_ssm_states(const Sequence& seq, int32_t stream) = 0;
  virtual void decode_marconi_checkpoint(const Sequence& seq) = 0;

  // After a decode forward: each row's context commit, then its readback.
  virtual void commit_ctx(const Sequence& seq, int32_t n, int32_t base, int32_t row) = 0;
  // A greedy step's argmax came back with its forward (StepPlan::argmax); reported here where
  // the reference reads it.
  virtual void argmax_batch(int32_t row, int32_t n, int32_t stream,
                            const std::vector<int32_t>& tokens) = 0;
  // Rows [row, row + n) are read on the host next (met samples where the logits live).
  virtual void copy_logits_to_host(int32_t row, int32_t n) = 0;

  // Offered to the prefix cache before its release (met's free_sequence caches full blocks).
  virtual void cache_sequence(const Sequence& seq) = 0;
};

}  // namespace met
