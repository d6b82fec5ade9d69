// The recording fake's trace adapter: each plan spelled back as the reference forward call it
// stands for (its arguments rebuilt from the rows), and the reference engine's calls that do
// nothing in met (TraceHooks), each recorded as the reference spells it where it is reported.
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "recording_backend.h"
#include "recording_text.h"

namespace met::testing {
namespace {

constexpr uint16_t kBf16Thirty = 0x41F0;  // 30.0: the scripted id's logit on the host

// A plan's arguments as the reference's forward calls take them.
struct CallArgs {
  std::vector<Sequence*> seqs;  // decode or verify rows
  std::vector<int32_t> tokens;  // their input tokens, back to back
  std::vector<int32_t> ks;      // verify rows' draft lengths
  std::vector<PrefillSlice> slices;
};

CallArgs call_args(const StepPlan& plan) {
  CallArgs a;
  for (const PlanRow& row : plan.rows) {
    if (row.kind == RowKind::PrefillChunk) {
      const auto len = static_cast<int32_t>(row.tokens.size());
      a.slices.push_back(PrefillSlice{row.seq, row.prompt, row.start, len, row.last_chunk});
      continue;
    }
    a.seqs.push_back(row.seq);
    a.tokens.insert(a.tokens.end(), row.tokens.begin(), row.tokens.end());
    if (row.kind == RowKind::Verify) a.ks.push_back(row.draft);
  }
  return a;
}

}  // namespace

std::vector<int32_t> RecordingBackend::execute(const StepPlan& plan) {
  const CallArgs a = call_args(plan);
  const int32_t stream = plan.stream;
  switch (plan.call) {
    case ReferenceCall::Prefill:
      prefill(*a.slices.at(0).seq, *a.slices.at(0).prompt, stream);
      return {};
    case ReferenceCall::PrefillChunk: {
      const PrefillSlice& s = a.slices.at(0);
      prefill_chunk(*s.seq, *s.prompt, s.start, s.len, s.last, stream);
      return {};
    }
    case ReferenceCall::MixedForward:
      mixed_forward(a.seqs, a.tokens, a.slices.at(0), stream);
      return {};
    case ReferenceCall::MixedForwardBatch:
      mixed_forward_batch(a.seqs, a.tokens, a.slices, stream);
      return {};
    case ReferenceCall::PrefillBatchChunk:
      prefill_batch_chunk(a.slices, stream);
      return {};
    case ReferenceCall::DecodeBatch:
      return decode_batch(a.tokens, a.seqs, stream, plan.argmax);
    case ReferenceCall::DecodeVerifyBatched:
      return decode_verify_batched(a.tokens, a.ks, a.seqs, stream, plan.argmax);
    case ReferenceCall::MixedVerifyBatch:
      mixed_verify_batch(a.tokens, a.ks, a.seqs, a.slices, stream);
      return {};
  }
  throw std::logic_error("fake: unknown reference call");
}

void RecordingBackend::bind_gpu_to_thread() { record("bind_gpu_to_thread()"); }

void RecordingBackend::stream_created(int32_t stream) {
  record("create_stream() -> " + std::to_string(stream));
}

void RecordingBackend::event_created(int32_t event) {
  record("create_event() -> " + std::to_string(event));
}

void RecordingBackend::record_event(int32_t event, int32_t stream) {
  record("record_event(event=" + std::to_string(event) + ", stream=" + std::to_string(stream) +
         ")");
}

void RecordingBackend::stream_wait_event(int32_t stream, int32_t event) {
  record("stream_wait_event(stream=" + std::to_string(stream) + ", event=" + std::to_string(event) +
         ")");
}

void RecordingBackend::stream_synchronized(int32_t stream) {
  record("synchronize(stream=" + std::to_string(stream) + ")");
}

void RecordingBackend::torn_down() { record("teardown()"); }

void RecordingBackend::status_snapshot() {
  num_free_blocks();
  snapshot_pool_occupancy();
  snapshot_pool_occupancy();
}

// The pair of occupancy queries (used, total) marks each tick: the first of a pair.
int32_t RecordingBackend::snapshot_pool_occupancy() {
  if (++occupancy_calls_ % 2 == 1) {
    ++gate_tick_;
    if (gate_) gate_(gate_tick_);
    record("-- tick " + std::to_string(gate_tick_));
  }
  return -1;
}

void RecordingBackend::adapter_id_for(int32_t slot) {
  record("adapter_id_for(" + std::to_string(slot) + ")");
}

void RecordingBackend::acquire_adapter_slot(int32_t slot) {
  record("acquire_adapter_slot(" + std::to_string(slot) + ")");
}

void RecordingBackend::ep_broadcast_cmd_for_seq(uint32_t seq, uint32_t cmd) {
  record("ep_broadcast_cmd_for_seq(seq=" + std::to_string(seq) + ", cmd=" + hex(cmd) + ")");
}

void RecordingBackend::ep_broadcast_cmd(uint32_t word) {
  record("ep_broadcast_cmd(" + hex(word) + ")");
}

void RecordingBackend::ep_broadcast_tokens(const std::vector<int32_t>& tokens) {
  record("ep_broadcast_tokens(n=" + std::to_string(tokens.size()) + ")");
}

void RecordingBackend::ep_sync_vision_embeds(int32_t n) {
  record("ep_sync_vision_embeds(n=" + std::to_string(n) + ")");
}

void RecordingBackend::poll_innerq() { record("poll_innerq()"); }

void RecordingBackend::normalize_ssm_states(const Sequence& seq, int32_t stream) {
  record("normalize_ssm_states(" + sid(seq) + ", stream=" + std::to_string(stream) + ")");
}

void RecordingBackend::decode_marconi_checkpoint(const Sequence& seq) {
  record("decode_marconi_checkpoint(" + sid(seq) + ")");
}

void RecordingBackend::commit_ctx(const Sequence& seq, int32_t n, int32_t base, int32_t row) {
  record("commit_ctx(" + sid(seq) + ", n=" + std::to_string(n) + ", base=" + std::to_string(base) +
         ", row=" + std::to_string(row) + ")");
}

void RecordingBackend::argmax_batch(int32_t row, int32_t n, int32_t stream,
                                    const std::vector<int32_t>& tokens) {
  record("argmax_batch(row=" + std::to_string(row) + ", n=" + std::to_string(n) +
         ", stream=" + std::to_string(stream) + ") -> " + int_list(tokens));
}

void RecordingBackend::copy_logits_to_host(int32_t row, int32_t n) {
  for (int32_t i = 0; i < n; ++i) {
    std::vector<uint16_t> bf16(static_cast<size_t>(cfg_.vocab), 0);
    bf16.at(static_cast<size_t>(checked_row(row + i))) = kBf16Thirty;
    host_rows_[row + i] = std::move(bf16);
  }
  record("copy_logits_to_host(row=" + std::to_string(row) +
         ", off=0, bytes=" + std::to_string(n * cfg_.vocab * 2) + ")");
}

void RecordingBackend::cache_sequence(const Sequence& seq) {
  record("cache_sequence(" + sid(seq) + ")");
}

}  // namespace met::testing
