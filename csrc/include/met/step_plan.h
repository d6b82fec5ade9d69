// Owns: the value one scheduler tick hands the backend for its forward (StepPlan), and the
// reference-call variant each plan stands for.
// Called by: the scheduler builds plans; Backend::execute runs them; the recording fake spells
// each plan back as the reference engine's call line (trace spec section 2.7).
// Invariants: rows are in logits-row order: decode and verify rows first, then prefill chunks.
// A verify row gets a logits row per position, every other row one for its last position. A
// row's tokens go to positions start.. of its sequence, whose block table the backend grows.
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

#include "met/types.h"

namespace met {

enum class RowKind { PrefillChunk, Decode, Verify };

struct PlanRow {
  Sequence* seq = nullptr;  // the sequence id and slot the row writes (seq->session_hash, slot)
  RowKind kind = RowKind::Decode;
  int32_t start = 0;  // position of tokens[0]
  std::vector<int32_t> tokens;
  int32_t draft = 0;        // Verify: draft tokens after the pending one (tokens = 1 + draft)
  bool last_chunk = false;  // PrefillChunk: the chunk that ends the prompt
  // PrefillChunk: the whole prompt the chunk is cut from (the trace's EP announcement spells
  // it); null for other rows.
  const std::vector<int32_t>* prompt = nullptr;
};

// The reference engine's forward call a plan stands for; only traces read it.
enum class ReferenceCall {
  Prefill,
  PrefillChunk,
  MixedForward,
  MixedForwardBatch,
  PrefillBatchChunk,
  DecodeBatch,
  DecodeVerifyBatched,
  MixedVerifyBatch,
};

struct StepPlan {
  StepPlan() = default;
  StepPlan(ReferenceCall c, int32_t s, std::vector<PlanRow> r)
      : call(c), stream(s), rows(std::move(r)) {}

  ReferenceCall call = ReferenceCall::DecodeBatch;
  int32_t stream = 0;
  std::vector<PlanRow> rows;
  // Read back every logits row's device argmax in execute's result (a greedy decode or verify
  // step), so the step needs no second call for it; otherwise nothing comes back and the rows
  // are read with argmax_batch / sample_rows.
  bool argmax = false;
  // A row samples under a grammar: the device backend computes its masks while the forward runs,
  // so the plan must reach it (DirectForward passes it on).
  bool grammar = false;
};

PlanRow prefill_row(Sequence& seq, const std::vector<int32_t>& prompt, int32_t start, int32_t len,
                    bool last);
PlanRow slice_row(const PrefillSlice& slice);
PlanRow decode_row(Sequence& seq, int32_t token);
// Sequence i's pending token and its ks[i] drafts, taken in order from `tokens`.
std::vector<PlanRow> verify_rows(const std::vector<int32_t>& tokens, const std::vector<int32_t>& ks,
                                 const std::vector<Sequence*>& seqs);

}  // namespace met
