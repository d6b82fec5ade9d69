// Owns: what a gated speculative step drafts: a model of what a decode step costs by its row
// count, fitted to the steps the scheduler timed, and each draft token's expected worth from
// its sequence's own acceptance record.
// Called by: the speculative decode strategy (scheduler_spec.cpp): plan() before a speculating
// step, record() after each draft row is verified, observe_step() once a step's time is known.
// Invariants: deterministic in its inputs (time is passed in); a planned draft is a prefix of the
// proposal, never longer; a draft token is kept only while the step it joins delivers more
// expected tokens per predicted second with it than without it.
#pragma once

#include <cstdint>
#include <vector>

namespace met {

// A sequence's record of its drafts: accepted draft tokens and drafts that ended in a rejected
// token, both decayed so that recent drafts count most. Read as the chance p that a draft token
// is accepted given the one before it was, so a draft's j-th token stands with chance p^j.
struct DraftRecord {
  double accepted = 0;
  double rejected = 0;
};

struct PlannerConfig {
  double record_decay = 0.9;  // weight of a sequence's earlier drafts after each new one
  double prior_accepted = 1;  // pseudo-counts of a sequence without drafts yet: p = 1/2
  double prior_rejected = 1;
  double cost_decay = 0.99;      // weight of earlier steps in the cost fit after each new one
  double prior_row_share = 0.3;  // a row's share of a one-row step, the slope's prior, with
  double prior_weight = 1;       // the weight of one step that differs from the mean by a row
  double margin = 0.05;          // what a draft token must gain beyond what its row costs
};

class DraftPlanner {
 public:
  explicit DraftPlanner(PlannerConfig cfg = {}) : cfg_(cfg) {}

  // The draft lengths for one step: proposal i (of `proposed[i]` tokens, by a sequence with
  // record `records[i]`) keeps its first `result[i]` tokens. Tokens are taken best first (the
  // highest chance of standing) while each raises the step's expected tokens per second.
  // Before any step was timed every proposal is kept whole.
  std::vector<int32_t> plan(const std::vector<int32_t>& proposed,
                            const std::vector<const DraftRecord*>& records) const;
  // A draft verified, or a shadow draft checked against the tokens decoded after it: `accepted`
  // of its tokens stood, and `rejected` says whether the model refused the next one (false
  // when all stood or the request ended inside the draft).
  void record(DraftRecord& r, int32_t accepted, bool rejected) const;
  // A decode step of `rows` forward rows (every position of every row) took `seconds`.
  void observe_step(int32_t rows, double seconds);

  // The fitted cost: seconds = base + row * rows. A verify step's own overhead (its packing,
  // its rollbacks) is not a third term: at one row a verify step's row count and its being a
  // verify step go together, and on a noisy machine such a fit swung by 3x from step to step.
  struct Cost {
    double base = 0, row = 0;
    double seconds(int32_t rows) const { return base + row * rows; }
  };
  Cost cost() const;
  double chance(const DraftRecord& r) const;

 private:
  PlannerConfig cfg_;
  // Decayed sums of the least-squares fit.
  double w_ = 0, x_ = 0, y_ = 0, xx_ = 0, xy_ = 0;
};

}  // namespace met
