// Owns: nothing; the one interface through which the scheduler reaches a device.
// Called by: the scheduler (and the effect applier) only. Implemented by RecordingBackend (C++,
// golden traces) and TorchBackend (Python, through the pybind11 trampoline in bindings/).
// Invariants: one method per device call of the trace spec (section 2.7) on the paths met
// schedules; calls a backend has no use for are cheap no-ops, never skipped by the scheduler, so
// every backend sees the same call sequence. "Silent" methods are queries the fake does not
// record.
//
// Logits rows: each forward replaces the backend's logits rows. decode_batch: one row per input,
// in the order given. mixed_forward(_batch): decode rows first, then one row per prefill slice
// (row n_decode + i). prefill / prefill_chunk: row 0. prefill_batch_chunk: row i per slice.
// decode_verify_batched: one row per input token, every position of every sequence in order.
// mixed_verify_batch: those verify rows first, then one row per prefill slice.
#pragma once

#include <cstdint>
#include <vector>

#include "met/types.h"

namespace met {

class Backend {
 public:
  virtual ~Backend() = default;

  // --- silent queries ---
  virtual int32_t vocab_size() = 0;
  virtual int32_t block_size() = 0;
  virtual int32_t num_total_blocks() = 0;
  // Snapshot-pool occupancy of SSM models; -1 means "none". Asked twice per tick (used, total).
  virtual int32_t snapshot_pool_occupancy() { return -1; }
  // Prefix-cache lookup before the first chunk: writes the reused KV into `seq` (tokens,
  // seq_len, block_table, cached_len) and returns the number of prompt tokens reused. Never
  // covers the last prompt token. Default: no prefix cache.
  virtual int32_t match_prefix(Sequence& /*seq*/, const std::vector<int32_t>& /*prompt*/) {
    return 0;
  }
  // Host sampling of rows of the last forward (after copy_logits_to_host). Silent.
  virtual std::vector<SampledToken> sample_rows(const std::vector<SampleRow>& rows) = 0;

  // --- lifecycle, streams, events ---
  virtual void bind_gpu_to_thread() {}
  virtual int32_t create_stream() = 0;
  virtual int32_t create_event() = 0;
  virtual void record_event(int32_t /*event*/, int32_t /*stream*/) {}
  virtual void stream_wait_event(int32_t /*stream*/, int32_t /*event*/) {}
  virtual void synchronize(int32_t /*stream*/) {}
  virtual void teardown() {}

  // --- sequences and KV pool ---
  virtual void alloc_sequence(Sequence& seq) = 0;  // sets seq.slot
  virtual void alloc_sequence_for(Sequence& seq, int32_t budget) = 0;
  virtual void free_sequence(Sequence& seq) = 0;
  virtual void cache_sequence(Sequence& /*seq*/) {}
  virtual void compact_sequence(Sequence& seq, int64_t new_slot) = 0;
  virtual int32_t num_free_blocks() = 0;

  // --- adapters (LoRA cohorts; -1 is "no adapter") ---
  virtual int32_t adapter_id_for(int32_t /*slot*/) { return 0; }
  virtual int32_t acquire_adapter_slot(int32_t slot) { return slot; }

  // --- expert/tensor-parallel announcements to worker ranks ---
  virtual void ep_broadcast_cmd_for_seq(uint32_t /*seq*/, uint32_t /*cmd*/) {}
  virtual void ep_broadcast_cmd(uint32_t /*word*/) {}
  virtual void ep_broadcast_tokens(const std::vector<int32_t>& /*tokens*/) {}
  virtual void ep_sync_vision_embeds(int32_t /*n*/) {}

  // --- forwards ---
  virtual void prefill(Sequence& seq, const std::vector<int32_t>& prompt, int32_t stream) = 0;
  virtual void prefill_chunk(Sequence& seq, const std::vector<int32_t>& prompt, int32_t start,
                             int32_t len, bool last, int32_t stream) = 0;
  virtual void mixed_forward(const std::vector<Sequence*>& decode_seqs,
                             const std::vector<int32_t>& decode_tokens, const PrefillSlice& slice,
                             int32_t stream) = 0;
  virtual void mixed_forward_batch(const std::vector<Sequence*>& decode_seqs,
                                   const std::vector<int32_t>& decode_tokens,
                                   const std::vector<PrefillSlice>& slices, int32_t stream) = 0;
  virtual void prefill_batch_chunk(const std::vector<PrefillSlice>& slices, int32_t stream) = 0;
  // Throws KvExhausted (and advances nothing) when a row cannot get its next block.
  virtual void decode_batch(const std::vector<int32_t>& tokens, const std::vector<Sequence*>& seqs,
                            int32_t stream) = 0;
  virtual void commit_ctx(Sequence& /*seq*/, int32_t /*n*/, int32_t /*base*/, int32_t /*row*/) {}
  // Speculative verify: sequence i takes 1 + ks[i] input tokens (its pending token, then its
  // draft) from `tokens`, in order, written at positions seq_len.. of one forward; KV for every
  // position is reserved before the forward runs (KvExhausted otherwise, nothing advanced).
  // Every input position gets a logits row. With `argmax` the device argmax of every row comes
  // back; without it nothing does and the rows are read with copy_logits_to_host/sample_rows.
  // A draft row's tokens are not final: they must not enter the prefix cache before
  // commit_accepted_prefix says how many stand.
  virtual std::vector<int32_t> decode_verify_batched(const std::vector<int32_t>& tokens,
                                                     const std::vector<int32_t>& ks,
                                                     const std::vector<Sequence*>& seqs,
                                                     int32_t stream, bool argmax) = 0;
  // A verify forward fused with prefill chunks (a tick that continues chunked prefills while
  // decode rows carry drafts): the verify rows exactly as decode_verify_batched lays them out,
  // then one row per slice (row n_positions + i, n_positions = sum of 1 + ks[i]). KV for every
  // verify position is reserved before the forward (KvExhausted otherwise, nothing advanced).
  // Rows are read back as a mixed forward's are (argmax_batch, or copy_logits_to_host).
  virtual void mixed_verify_batch(const std::vector<int32_t>& tokens,
                                  const std::vector<int32_t>& ks,
                                  const std::vector<Sequence*>& seqs,
                                  const std::vector<PrefillSlice>& slices, int32_t stream) = 0;
  // After a verify of `k` drafts: the first `na` input tokens (1 + accepted drafts) stand; the
  // rest are rolled back (seq_len and tokens shrink by k + 1 - na, the block table keeps its
  // blocks and the rejected positions are overwritten by the next forward, never read).
  virtual void commit_accepted_prefix(Sequence& seq, int32_t na, int32_t k) = 0;
  virtual void normalize_ssm_states(Sequence& /*seq*/, int32_t /*stream*/) {}
  virtual void poll_innerq() {}
  virtual void decode_marconi_checkpoint(Sequence& /*seq*/) {}

  // --- readback ---
  virtual int32_t argmax_on_device(int32_t row, int32_t stream) = 0;
  virtual std::vector<int32_t> argmax_batch(int32_t row, int32_t n, int32_t stream) = 0;
  // Makes rows [row, row + n) available to sample_rows (a host copy where that is real work).
  virtual void copy_logits_to_host(int32_t row, int32_t n) = 0;
};

}  // namespace met
