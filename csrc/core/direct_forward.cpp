// The decode and verify steps' shortcut past the device backend (met/direct_forward.h).
#include "met/direct_forward.h"

#include <limits>
#include <stdexcept>
#include <string>
#include <vector>

namespace met {

// A grammar row's masks are computed by the device backend while its forward runs, and prefill
// rows may carry host work of their own (prompt scoring): those plans go to the backend.
bool DirectForward::takes(const StepPlan& plan) const {
  if (plan.grammar) return false;
  for (const PlanRow& row : plan.rows) {
    if (row.kind == RowKind::PrefillChunk) return false;
  }
  return forward_.runs(plan);
}

std::vector<int32_t> DirectForward::execute(const StepPlan& plan) {
  last_direct_ = false;
  if (!takes(plan)) {
    ++device_steps_;
    return device_.execute(plan);
  }
  argmax_ = forward_.argmax_rows(plan);
  last_direct_ = true;
  ++direct_steps_;
  return plan.argmax ? argmax_ : std::vector<int32_t>{};
}

int32_t DirectForward::argmax_on_device(int32_t row, int32_t stream) {
  if (!last_direct_) return device_.argmax_on_device(row, stream);
  return argmax_.at(static_cast<size_t>(row));
}

std::vector<int32_t> DirectForward::argmax_batch(int32_t row, int32_t n, int32_t stream) {
  if (!last_direct_) return device_.argmax_batch(row, n, stream);
  if (row < 0 || n < 0 || static_cast<size_t>(row) + static_cast<size_t>(n) > argmax_.size()) {
    throw std::out_of_range("DirectForward: argmax rows " + std::to_string(row) + ".." +
                            std::to_string(row + n) + " of " + std::to_string(argmax_.size()));
  }
  return {argmax_.begin() + row, argmax_.begin() + row + n};
}

// The plain rows never leave C++; the others are adjusted and drawn (or scored) on the device
// backend's host sampler, which draws with the same function, so a row's token does not depend
// on which side drew it.
std::vector<SampledToken> DirectForward::sample_rows(const std::vector<SampleRow>& rows) {
  if (!last_direct_) return device_.sample_rows(rows);
  std::vector<SampleRow> part[2];  // drawn here, sampled by the device backend
  std::vector<size_t> where[2];
  for (size_t i = 0; i < rows.size(); ++i) {
    const int side = rows[i].plain_draw() ? 0 : 1;
    part[side].push_back(rows[i]);
    where[side].push_back(i);
  }
  std::vector<SampledToken> out(rows.size());
  if (!part[0].empty()) {
    const std::vector<int32_t> drawn = forward_.draw(part[0]);
    for (size_t j = 0; j < drawn.size(); ++j) {
      out[where[0][j]] = {drawn[j], std::numeric_limits<float>::quiet_NaN(), {}};
    }
  }
  if (part[1].empty()) return out;
  std::vector<SampledToken> sampled = device_.sample_logits(
      forward_.logits(), static_cast<int64_t>(argmax_.size()), forward_.vocab(), part[1]);
  if (sampled.size() != part[1].size()) {
    throw std::runtime_error("sample_logits returned " + std::to_string(sampled.size()) +
                             " tokens for " + std::to_string(part[1].size()) + " rows");
  }
  for (size_t j = 0; j < sampled.size(); ++j) out[where[1][j]] = std::move(sampled[j]);
  return out;
}

}  // namespace met
