// Owns: the plain values that cross the scheduler <-> backend boundary.
// Called by: the scheduler, every backend (recording fake, torch backend through pybind11).
// Invariants: a Sequence's block_table never shrinks while the sequence lives; seq_len counts
// tokens whose KV is written (the next token goes to position seq_len).
#pragma once

#include <cstdint>
#include <limits>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace met {

// A slot value that means "no dense batch row"; prints as usize::MAX (18446744073709551615).
constexpr int64_t kDetachedSlot = -1;

// KV-owning core state of one request. Owned by the scheduler; its KvLedger (with a block
// manager) or else the backend itself advances tokens, seq_len and block_table over forwards, and
// the backend sets slot on alloc/compact.
struct Sequence {
  uint64_t session_hash = 0;  // the request id once stamped by the scheduler
  int64_t slot = kDetachedSlot;
  int32_t seq_len = 0;
  int32_t prompt_len = 0;
  std::vector<int32_t> tokens;       // every token whose KV is written, prompt first
  std::vector<int32_t> block_table;  // KV pages, in position order
  int32_t cached_len = 0;            // prompt tokens whose KV came from the prefix cache
  // Its recurrent-state slot (a hybrid model's; the scheduler's StatePool), -1: none.
  int32_t state_slot = -1;
};

// What a user asked for: the sampler reads it, the scheduler reads the stop/length fields.
struct SamplingParams {
  float temperature = 0.0f;
  int32_t top_k = 0;  // 0: off
  float top_p = 1.0f;
  float min_p = 0.0f;
  uint64_t seed = 42;
  float repetition_penalty = 1.0f;
  float presence_penalty = 0.0f;
  float frequency_penalty = 0.0f;
  std::vector<std::pair<int32_t, float>> logit_bias;
  int32_t top_logprobs = -1;  // -1: no logprobs; 0: logprob of the sampled token only
  int32_t max_tokens = 16;
  int32_t min_tokens = 0;
  std::vector<int32_t> stop_token_ids;  // in addition to the scheduler's eos tokens
  bool ignore_eos = false;
  // Structured output (a grammar): the host sampler masks every token with the grammar's
  // bitmask (python/met/constraints/), so no pick may bypass it.
  bool constrained = false;

  bool greedy() const { return temperature <= 0.0f; }
  // A device argmax picks the same token only when nothing reshapes the logits first.
  bool plain_argmax() const {
    return greedy() && logit_bias.empty() && repetition_penalty == 1.0f &&
           presence_penalty == 0.0f && frequency_penalty == 0.0f && !constrained;
  }
  bool wants_logprobs() const { return top_logprobs >= 0; }
};

// One row for host sampling (readback HostLogits, or a non-greedy first token).
struct SampleRow {
  uint64_t request_id = 0;
  int32_t row = 0;          // logits row of the last forward
  Sequence* seq = nullptr;  // token history for penalties; seq->tokens excludes the row's pick
  SamplingParams params;    // the request's own
  int32_t n_generated = 0;  // output tokens so far (seeds the per-step generator)
  bool mask_stop = false;   // min_tokens floor active: every stop token gets -inf first
  std::vector<int32_t> stop_tokens;  // eos tokens plus params.stop_token_ids

  // Whether met's draw (csrc/kernels/sampling.cu, cpu/sampling.h) takes this row as it is: only
  // temperature, top-k, top-p and min-p shape its logits, and it reports no logprob. Any other
  // row has its logits adjusted (bias, penalties, stop mask, grammar) and logprobs taken first.
  bool plain_draw() const {
    const SamplingParams& p = params;
    return !p.wants_logprobs() && p.logit_bias.empty() && p.repetition_penalty == 1.0f &&
           p.presence_penalty == 0.0f && p.frequency_penalty == 0.0f && !p.constrained &&
           !(mask_stop && !stop_tokens.empty());
  }
};

struct SampledToken {
  int32_t token = 0;
  float logprob = 0.0f;
  std::vector<std::pair<int32_t, float>> top;  // top_logprobs alternatives, best first
};

// One prefill slice of a batched forward: tokens prompt[start, start+len) of `seq`.
struct PrefillSlice {
  Sequence* seq = nullptr;
  const std::vector<int32_t>* prompt = nullptr;
  int32_t start = 0;
  int32_t len = 0;
  bool last = false;
};

// Thrown before a forward when no KV block is left for a row (by the KvLedger, or by a backend
// that keeps its own blocks); nothing advanced.
class KvExhausted : public std::runtime_error {
 public:
  KvExhausted() : std::runtime_error("KV cache exhausted") {}
};

}  // namespace met
