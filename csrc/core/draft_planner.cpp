// Draft planning for gated speculation: the cost fit and the best-first draft choice of
// met/draft_planner.h.
//
// Why per token: a verify row costs about the same whether its draft then stands or not, so
// the k-th draft token is worth its row only if the chance it stands beats what the row costs
// in tokens of the step it joins. On a 2-core CPU at one row a draft row costs about a quarter
// of the step, at eight rows most of a token, on a big device almost nothing; the fit measures
// which of these this machine is.
#include "met/draft_planner.h"

#include <algorithm>
#include <tuple>

namespace met {

double DraftPlanner::chance(const DraftRecord& r) const {
  const double a = r.accepted + cfg_.prior_accepted;
  return a / (a + r.rejected + cfg_.prior_rejected);
}

void DraftPlanner::record(DraftRecord& r, int32_t accepted, bool rejected) const {
  r.accepted = cfg_.record_decay * r.accepted + accepted;
  r.rejected = cfg_.record_decay * r.rejected + (rejected ? 1 : 0);
}

void DraftPlanner::observe_step(int32_t rows, double seconds) {
  const double d = cfg_.cost_decay;
  const double x = rows;
  w_ = d * w_ + 1;
  x_ = d * x_ + x;
  y_ = d * y_ + seconds;
  xx_ = d * xx_ + x * x;
  xy_ = d * xy_ + x * seconds;
}

// Least squares with a ridge toward the prior slope: until the timed steps' row counts have
// varied (a plain lane at one width), the prior decides; from then on the steps do. Clamped so
// that neither the row cost nor the base is negative.
DraftPlanner::Cost DraftPlanner::cost() const {
  Cost c;
  if (w_ <= 0) return c;
  const double mx = x_ / w_, my = y_ / w_;
  const double one_row = my / (1 - cfg_.prior_row_share + cfg_.prior_row_share * mx);
  const double prior = cfg_.prior_row_share * one_row;
  const double sxx = xx_ - x_ * mx, sxy = xy_ - x_ * my;
  c.row = std::clamp((sxy + cfg_.prior_weight * prior) / (sxx + cfg_.prior_weight), 0.0, my / mx);
  c.base = my - c.row * mx;
  return c;
}

// Candidates are (sequence, depth) pairs worth p^depth tokens; taken best first, each must
// raise the step's expected tokens per predicted second by the margin: p^j * T > (1 + margin)
// * tokens * row cost. A sequence's chances fall with depth, so what is taken is always a
// prefix of each proposal, and once one candidate fails every later one would.
std::vector<int32_t> DraftPlanner::plan(const std::vector<int32_t>& proposed,
                                        const std::vector<const DraftRecord*>& records) const {
  if (w_ <= 0) return proposed;
  std::vector<std::tuple<double, size_t, int32_t>> candidates;
  for (size_t i = 0; i < proposed.size(); ++i) {
    const double p = chance(*records[i]);
    double q = 1;
    for (int32_t j = 1; j <= proposed[i]; ++j) {
      q *= p;
      candidates.emplace_back(q, i, j);
    }
  }
  std::stable_sort(candidates.begin(), candidates.end(),
                   [](const auto& a, const auto& b) { return std::get<0>(a) > std::get<0>(b); });
  const Cost c = cost();
  const auto width = static_cast<int32_t>(proposed.size());
  if (c.seconds(width) <= 0) return proposed;
  const double gain = 1 + cfg_.margin;
  double tokens = width;
  int32_t rows = width;
  std::vector<int32_t> out(proposed.size(), 0);
  for (const auto& [q, i, j] : candidates) {
    if (q * c.seconds(rows) <= gain * tokens * c.row) break;
    out[i] = j;
    tokens += q;
    ++rows;
  }
  return out;
}

}  // namespace met
