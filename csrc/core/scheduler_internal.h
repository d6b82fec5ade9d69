// Owns: the scheduler's per-request record (Live) and the decode-strategy seam.
// Called by: the scheduler*.cpp files only.
// Invariants: a Live lives in a unique_ptr from admission to release, so `seq` keeps its address
// for the backend across list moves; `output` holds every emitted output token, so the remaining
// budget is derived, never counted separately.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "met/draft_planner.h"
#include "met/ngram_proposer.h"
#include "met/scheduler.h"

namespace met {

constexpr int32_t kDecodeStream = 0;
constexpr int32_t kNoAdapter = -1;

struct Live {
  Request req;
  Sequence seq;
  std::vector<int32_t> stop_tokens;  // eos (unless ignore_eos) + the request's stop ids
  std::vector<int32_t> output;
  int32_t pending = 0;  // the next decode input: the last output token, KV not yet written
  int32_t offset = 0;   // prompt tokens whose KV is written (prefill progress)
  int32_t cached = 0;   // prompt tokens reused from the prefix cache
  int32_t logprobs = 0;
  bool finished = false;
  std::string guard;
  // The n-gram index of prompt + output (read from the two above), for drafts; null when this
  // request runs without speculation (then `spec_off` says why).
  std::unique_ptr<NgramProposer> proposer;
  std::string spec_off;
  int32_t acc = 0;     // accepted draft tokens
  DraftRecord drafts;  // how its drafts fared: what the gated mode's planner drafts by
  // The gated mode's shadow draft: what it would have drafted when it did not (the gate ran
  // plain, or the planner withheld the proposal), checked against the tokens decoded from
  // output position `shadow_at` on, so the record stays true while nothing is verified.
  std::vector<int32_t> shadow;
  size_t shadow_at = 0;
  // Steps left without drafting, and the next such pause (ngram-forced, which has no planner):
  // a sequence whose draft is rejected outright waits 1, 2, 4, ... up to 16 steps before
  // drafting again; one accepted token resets both.
  int32_t draft_pause = 0;
  int32_t draft_backoff = 0;

  int32_t prompt_len() const { return static_cast<int32_t>(req.prompt.size()); }
  int32_t remaining() const { return req.params.max_tokens - static_cast<int32_t>(output.size()); }
};

// One decode step over the active rows: the plain step, or the speculative one (drafts verified
// in one forward); beam or LoRA-rotating steps would be further strategies. Chosen when the
// scheduler is built, not flags polled inside the tick.
class DecodeStrategy {
 public:
  virtual ~DecodeStrategy() = default;
  // `rows` are the unfinished active sequences in slot order; the step must hand each row's
  // token(s) to Scheduler::accept_token, or preempt the row. `alone`: nothing but this step ran
  // on the device this tick (no prefill work), so the tick's wall time is the step's.
  virtual void step(Scheduler& sched, std::vector<Live*> rows, bool alone) = 0;
  // The decode rows of a tick that continues chunked prefills are fused into that tick's
  // forward: a draft per row (an empty one: a one-token row), or nothing at all for the plain
  // mixed forward (the plain strategy always).
  virtual Drafts fused_drafts(Scheduler& /*sched*/, const std::vector<Live*>& /*rows*/) {
    return {};
  }
  // After the fused verify forward (mixed_verify_batch) of those drafts: the decode rows'
  // positions are read back and accepted as a verify step's are.
  virtual void fused_accept(Scheduler& /*sched*/, const std::vector<Live*>& /*rows*/,
                            const Drafts& /*drafts*/) {}
  // A sequence finished its prefill and joins the decode rows with its first token.
  virtual void admit(Live& /*live*/) {}
  // The start of every tick, with its time (the end of the previous tick's work).
  virtual void begin_tick(double /*now*/) {}
  // The end of a tick's work; `continues`: the engine ticks again at once (something active).
  virtual void end_tick(bool /*continues*/) {}
  virtual SpecStats stats() const { return {}; }
};

std::unique_ptr<DecodeStrategy> make_plain_decode();
std::unique_ptr<DecodeStrategy> make_spec_decode(const SpecConfig& cfg);

}  // namespace met
