// The speculation gate of met/spec_gate.h.
#include "met/spec_gate.h"

#include <algorithm>
#include <cmath>

namespace met {
namespace {

GateMode other(GateMode m) { return m == GateMode::Spec ? GateMode::Plain : GateMode::Spec; }

}  // namespace

int32_t SpecGate::bucket(int32_t width) {
  int32_t b = 0;
  while ((1 << b) < width) ++b;
  return b;
}

int32_t SpecGate::draft_len(int32_t width, int32_t k) {
  return std::max(0, k - std::max(0, bucket(width) - 1));
}

SpecGate::Bucket& SpecGate::at(int32_t bucket) {
  if (static_cast<size_t>(bucket) >= buckets_.size()) {
    buckets_.resize(static_cast<size_t>(bucket) + 1);
  }
  Bucket& b = buckets_[static_cast<size_t>(bucket)];
  if (b.probe_every == 0) b.probe_every = 1;  // a fresh bucket probes after its first window
  return b;
}

GateMode SpecGate::mode(int32_t bucket) const {
  if (static_cast<size_t>(bucket) >= buckets_.size()) return GateMode::Spec;
  return buckets_[static_cast<size_t>(bucket)].mode;
}

GateMode SpecGate::choose(int32_t bucket) {
  Bucket& b = at(bucket);
  return b.phase == Phase::Probe ? other(b.mode) : b.mode;
}

// A step whose mode no longer matches what the bucket is measuring (it was chosen before a
// probe began or ended) is dropped rather than credited to the wrong side.
void SpecGate::observe(int32_t bucket, GateMode used, int32_t tokens, double seconds) {
  Bucket& b = at(bucket);
  const bool probing = b.phase == Phase::Probe;
  if ((used != b.mode) != probing) return;
  Window& w = probing ? b.probe : b.current;
  ++w.steps;
  w.tokens += tokens;
  w.seconds += seconds;
  if (probing) {
    probe_step(b);
    return;
  }
  if (w.steps < cfg_.window_steps) return;
  const Window full = w;
  w = {};
  if (b.phase == Phase::After) {
    judge(b, full);
    return;
  }
  b.before = full;
  if (++b.windows >= b.probe_every) {
    b.windows = 0;
    b.phase = Phase::Probe;
    ++probes_;
  }
}

// A probe that is clearly losing ends early (what a probe of the slower mode costs is bounded
// by abort_steps). A full one waits for the window after it, except a plain probe clearly
// beating speculation: plain is what `off` runs, so the bucket leaves speculation at once.
void SpecGate::probe_step(Bucket& b) {
  const double before = b.before.rate();
  if (b.probe.steps >= cfg_.abort_steps && b.probe.rate() < before * cfg_.abort_below) {
    const double share = before > 0 ? b.probe.rate() / before : 1.0;
    b.probe = {};
    b.phase = Phase::Measure;
    keep(b, share);
    return;
  }
  if (b.probe.steps < cfg_.window_steps) return;
  if (b.mode == GateMode::Spec && b.probe.rate() * cfg_.abort_below > before) {
    b.probe = {};
    b.phase = Phase::Measure;
    flip(b);
    return;
  }
  b.phase = Phase::After;
}

// The probe against the mean of the windows on either side of it, so a load that drifts during
// the probe moves both sides alike; how far the two sides disagree is the noise the way back to
// speculation must clear on top of its margin.
void SpecGate::judge(Bucket& b, const Window& after) {
  const double ref = 0.5 * (b.before.rate() + after.rate());
  const double spread = ref > 0 ? std::abs(b.before.rate() - after.rate()) / ref : 0;
  const double margin =
      b.mode == GateMode::Spec ? cfg_.to_plain_margin : cfg_.to_spec_margin + spread;
  const bool won = b.probe.rate() > ref * (1.0 + margin);
  const double share = ref > 0 ? b.probe.rate() / ref : 1.0;
  b.probe = {};
  b.before = after;
  b.windows = 1;
  b.phase = Phase::Measure;
  if (!won) {
    keep(b, share);
    return;
  }
  b.probe_every = cfg_.min_probe_every;
  if (++b.losses < cfg_.losses_to_switch) return;
  flip(b);
}

// The current mode won its probe, in which the other one ran at `share` of its rate: probes
// come less often. A plain bucket also spaces its probes so that they cost at most
// `probe_budget` of its time: a probe step at `share` costs 1 / share - 1 plain steps more.
void SpecGate::keep(Bucket& b, double share) {
  b.losses = 0;
  if (b.mode == GateMode::Spec) {
    b.probe_every = std::min(cfg_.max_probe_every_spec, b.probe_every * 2);
    return;
  }
  const double extra = (1.0 / std::max(share, 0.01) - 1.0) * cfg_.abort_steps;
  const auto afford = static_cast<int32_t>(
      std::ceil(extra / (cfg_.probe_budget * static_cast<double>(cfg_.window_steps))));
  const int32_t every = std::max(std::min(cfg_.max_probe_every_plain, b.probe_every * 2), afford);
  b.probe_every = std::min(every, cfg_.max_probe_every_costly);
}

void SpecGate::flip(Bucket& b) {
  b.mode = other(b.mode);
  b.losses = 0;
  b.before = {};
  b.windows = 0;
  b.probe_every = cfg_.min_probe_every;
  ++switches_;
}

}  // namespace met
