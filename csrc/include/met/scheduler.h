// Owns: every request from the inbox until its Done: the Sequences (heap-allocated, stable
// addresses for the backend), the waiting queue, the prefilling/active/requeued lists, and the
// client events of each tick.
// Called by: the engine thread (Python, through bindings/scheduler.cpp) and the trace harness.
// Invariants: never reads a clock (time comes in through tick), never touches a tensor; each tick
// is plan -> StartPrefills -> ContinuePrefills -> Decode -> end of tick (trace spec section 5);
// every forward is one StepPlan handed to Backend::execute, and every device call goes through
// the Backend or the EffectApplier, with the reference's no-op calls reported to TraceHooks, in
// the order the trace spec fixes. A sequence is in exactly one of prefilling / active / requeued.
#pragma once

#include <cstdint>
#include <deque>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "met/backend.h"
#include "met/block_manager.h"
#include "met/effects.h"
#include "met/kv_ledger.h"
#include "met/ngram_proposer.h"
#include "met/spec_gate.h"
#include "met/trace_hooks.h"
#include "met/types.h"

namespace met {

// Speculative decoding with prompt-lookup drafts: Off runs the plain decode strategy (the
// golden traces), Ngram lets the gate decide per batch width, NgramForced always drafts k.
enum class SpecMode { Off, Ngram, NgramForced };

struct SpecConfig {
  SpecMode mode = SpecMode::Off;
  int32_t k = 4;  // draft tokens per verify row at most
  NgramConfig ngram;
  GateConfig gate;
};

struct SchedulerConfig {
  int32_t max_batch_size = 8;
  int32_t max_prefill_tokens = 0;  // chunk length of chunked prefill; 0: whole prompts
  int32_t max_batch_tokens = 8192;
  int32_t max_seq_len = 4096;
  std::vector<int32_t> eos_tokens{63};
  SpecConfig spec;
};

// What speculation did so far (all zero with SpecMode::Off).
struct SpecStats {
  int64_t drafted = 0;             // draft tokens sent to verify forwards
  int64_t accepted = 0;            // of those, accepted
  int64_t verify_steps = 0;        // decode steps that verified at least one draft
  int64_t verify_rows = 0;         // decode rows that carried a draft
  int64_t plain_steps = 0;         // decode steps without any draft
  int64_t fused_verify_steps = 0;  // of the verify steps, those fused with prefill chunks
  int64_t withheld = 0;            // proposed draft tokens the gated planner did not send
  int64_t gate_switches = 0;
  int64_t gate_probes = 0;
  double proposer_seconds = 0;  // wall time spent proposing (a metric only: no decision reads it)
  std::vector<int32_t> gate_plain_buckets;  // width buckets the gate runs without speculation
};

struct Request {
  uint64_t id = 0;
  std::vector<int32_t> prompt;
  SamplingParams params;
  bool has_deadline = false;
  double deadline = 0;    // seconds, same clock as tick(now)
  bool streaming = true;  // false: no Token events, only the Done (which carries every token)
};

struct ClientEvent {
  enum class Kind { Token, Done, Error };
  Kind kind = Kind::Token;
  uint64_t request_id = 0;
  SampledToken token;          // Token
  bool with_logprobs = false;  // Token: the request asked for logprobs
  std::string finish_reason;   // Done: stop | length | timeout
  int32_t n = 0, think = 0, acc = 0;
  int32_t cached = 0;    // Token and Done: prompt tokens the request reused from the prefix cache
  std::string guard;     // Done: "" = None, else the guard that ended it (request_timeout)
  std::string spec_off;  // Done: why this request ran without speculation ("" if it did)
  std::string error;     // Error
  std::vector<int32_t> output;  // Done: every output token (incl. a final stop token)
  int32_t logprobs = 0;         // Done: output tokens that carried logprobs
};

struct TickResult {
  bool shutdown = false;
};

struct SchedulerStats {
  int32_t running = 0;
  int32_t prefilling = 0;
  int32_t waiting = 0;  // inbox + queue
  int32_t requeued = 0;
  int64_t preemptions = 0;  // sequences preempted (KV exhausted) since the scheduler started
};

// Chunk length for prompt tokens [off, total) given a proposed length (trace spec 5.4): a chunk
// that reaches the end is taken whole; otherwise its end moves down to a block boundary past
// `off` and the length is rounded down to a multiple of 4.
int32_t plan_chunk_len(int32_t off, int32_t total, int32_t proposed, int32_t block_size);

// KV blocks for `tokens` tokens plus the next position.
inline int32_t blocks_for(int32_t tokens, int32_t block_size) { return tokens / block_size + 1; }

// The admission KV gate: how many of `incoming` (prompt + max_tokens each, in order) fit next to
// `in_flight` (current tokens + remaining budget each) in `total_blocks`, reserving at most
// `watermark` future tokens per request. A lone request with nothing in flight always fits.
struct KvDemand {
  int32_t tokens = 0;
  int32_t budget = 0;
};
size_t admit_count(const std::vector<KvDemand>& in_flight, const std::vector<KvDemand>& incoming,
                   int32_t total_blocks, int32_t block_size, int32_t watermark);

// Slot compaction: for survivors holding `slots` (in active order) next to other live slots
// `pinned` (prefilling sequences), the target of each survivor (-1: stays). Survivors at a slot
// >= n move to the free slots of [0, n), highest first.
std::vector<int64_t> compaction_targets(const std::vector<int64_t>& slots,
                                        const std::vector<int64_t>& pinned);

struct Live;
class DecodeStrategy;
using Drafts = std::vector<std::vector<int32_t>>;  // one draft per decode row

// Why a request with these parameters runs without speculation under `mode` ("": it drafts).
std::string spec_off_reason(SpecMode mode, const SamplingParams& p);

class Scheduler {
 public:
  // `sink` and `hooks` are the recording harness's (fx lines, the reference's no-op calls).
  // With `blocks` the scheduler owns the KV bookkeeping: every backend call goes through a
  // KvLedger over it (tables grown before each forward, token history and prefix-cache commits
  // after it, release with the sequence), and with `states` (a hybrid model's) also each
  // sequence's recurrent-state slot. Without, the backend keeps its own (the recording fake's
  // block counter).
  Scheduler(Backend& backend, SchedulerConfig cfg, TraceSink* sink = nullptr,
            TraceHooks* hooks = nullptr, BlockManager* blocks = nullptr,
            StatePool* states = nullptr);
  ~Scheduler();
  Scheduler(const Scheduler&) = delete;
  Scheduler& operator=(const Scheduler&) = delete;

  void add_request(Request r);
  void abort_request(uint64_t id);
  void close_inbox();
  bool has_work() const;
  TickResult tick(double now);
  std::vector<ClientEvent> take_events();
  SchedulerStats stats() const;
  SpecStats spec_stats() const;

  // What a decode strategy may do to the tick it runs in (see scheduler_decode.cpp).
  Backend& backend() { return backend_; }
  TraceHooks* hooks() { return hooks_; }
  EffectApplier& effects() { return fx_; }
  Readback readback_plan(const std::vector<Live*>& rows) const;
  static bool any_grammar(const std::vector<Live*>& rows);  // StepPlan::grammar
  std::vector<SampledToken> read_rows(const std::vector<Live*>& rows, Readback plan,
                                      std::vector<int32_t> argmax);
  void accept_token(Live& live, const SampledToken& tok);
  void preempt(Live& victim);
  // The host-sampling row of `live`'s token `ahead` positions past its next one, read from
  // logits row `row` (a verify row samples each position with the request's own seed and step).
  SampleRow sample_row(const Live& live, int32_t row, int32_t ahead) const;
  const SchedulerConfig& config() const { return cfg_; }

 private:
  enum class Lane { Continue, SkipRest };
  using LivePtr = std::unique_ptr<Live>;

  // planning (scheduler.cpp)
  struct Plan {
    bool shutdown = false;
    std::vector<Request> admitted;
  };
  Plan plan_tick();
  void absorb_inbox();
  std::vector<Request> admit(std::vector<Request> taken);
  bool idle() const;

  // prefill lanes (scheduler_prefill.cpp)
  void start_prefill(Request r);
  Lane continue_prefills();
  void batched_step();
  void single_mixed_step();
  void head_chunk_step();
  PrefillSlice next_slice(Live& live);
  void announce(const Sequence& seq, int32_t len, int32_t start, const std::vector<int32_t>& toks);
  void sync_prefill_stream();
  int32_t fused_forward(const std::vector<Live*>& rows, const std::vector<PrefillSlice>& slices,
                        bool single, Drafts& drafts);
  void read_fused(const std::vector<Live*>& rows, const Drafts& drafts);
  SampledToken first_token(Live& live, int32_t row);
  void promote(LivePtr live, const SampledToken& tok);

  // decode lane (scheduler_decode.cpp)
  void decode_lane(bool alone);
  std::vector<Live*> decode_rows();
  std::vector<SampledToken> read_back_direct(const std::vector<Live*>& rows);
  bool floor_active(const Live& live, int32_t ahead = 0) const;
  bool is_stop(const Live& live, int32_t token) const;
  void emit_token(const Live& live, const SampledToken& tok, bool with_logprobs);

  // end of tick and shutdown (scheduler_end.cpp)
  void end_tick();
  void drop_cancelled();
  void retire_finished();
  void compact_slots();
  void resume_requeued();
  void finish();
  void emit_done(const Live& live);

  LivePtr make_live(Request r) const;
  bool at_ceiling(const Live& live) const;

  std::unique_ptr<KvLedger> ledger_;  // null without a block manager
  Backend& backend_;                  // the ledger when there is one, else the device backend
  TraceHooks* hooks_;
  SchedulerConfig cfg_;
  EffectApplier fx_;
  DeviceInfo info_;
  int32_t block_size_;
  int32_t prefill_stream_;
  int32_t prefill_event_;
  double now_ = 0;
  bool did_mixed_step_ = false;

  std::deque<Request> inbox_;
  std::deque<Request> queue_;
  bool inbox_closed_ = false;
  std::vector<LivePtr> prefilling_;
  std::vector<LivePtr> active_;
  std::vector<LivePtr> requeued_;
  int64_t preemptions_ = 0;
  std::set<uint64_t> cancelled_;
  std::vector<ClientEvent> events_;
  std::unique_ptr<DecodeStrategy> decode_;
};

}  // namespace met
