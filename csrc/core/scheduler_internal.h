// Owns: the scheduler's per-request record (Live) and the decode-strategy seam.
// Called by: the scheduler*.cpp files only.
// Invariants: a Live lives in a unique_ptr from admission to release, so `seq` keeps its address
// for the backend across list moves; `output` holds every emitted output token, so the remaining
// budget is derived, never counted separately.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

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

  int32_t prompt_len() const { return static_cast<int32_t>(req.prompt.size()); }
  int32_t remaining() const { return req.params.max_tokens - static_cast<int32_t>(output.size()); }
};

// One decode step over the active rows. The plain step is the only one today; speculative,
// beam or LoRA-rotating steps are further strategies chosen when the scheduler is built, not
// flags polled inside the tick.
class DecodeStrategy {
 public:
  virtual ~DecodeStrategy() = default;
  // `rows` are the unfinished active sequences in slot order; the step must hand each row's
  // token to Scheduler::accept_token, or preempt the row.
  virtual void step(Scheduler& sched, std::vector<Live*> rows) = 0;
};

std::unique_ptr<DecodeStrategy> make_plain_decode();

}  // namespace met
