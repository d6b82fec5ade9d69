// The speculation gate of met/spec_gate.h.
//
// A bucket's transitions (mode in capitals, phase after the slash):
//   SPEC/Measure  -> SPEC/Probe    after probe_every windows, each of window_steps steps that
//                                  verified drafts (or max_window_steps steps in all, if any
//                                  verified); steps without drafts only age the window
//   SPEC/Probe    -> SPEC/Measure  a plain probe step below abort_below of the speculation
//                                  before it (speculation wins at once: probes spaced out)
//                 -> PLAIN/Measure the full plain probe beats that window by a third (flip)
//                 -> SPEC/After    otherwise
//   SPEC/After    -> PLAIN/Measure the second consecutive probe in which plain beat the mean
//                                  of the windows around it by to_plain_margin (flip)
//                 -> SPEC/Measure  otherwise (one win counted, or the losses cleared)
//   PLAIN/Measure -> PLAIN/Probe   after probe_every windows of plain steps, once the credit
//                                  (probe_budget of the bucket's time) is positive
//   PLAIN/Probe   -> PLAIN/Measure a verify step below abort_below of plain (lost), or a probe
//                                  that ran max_window_steps without verifying anything (no
//                                  evidence: nothing drafted, so speculation cost nothing)
//                 -> PLAIN/After   once window_steps steps verified drafts
//   PLAIN/After   -> SPEC/Measure  a probe beating the mean of the windows around it by
//                                  to_spec_at_once plus their spread, or the second in a row
//                                  beating it by to_spec_margin plus the spread (flip)
//                 -> PLAIN/Measure otherwise
// Only steps that verified drafts measure speculation: a speculating step in which no row had
// a draft ran the plain step, so it is evidence neither way. A workload that drafts nothing
// therefore leaves a speculating bucket speculating at no cost, and a plain bucket's probes
// there cost nothing, so they keep coming every few windows and notice within one probe when
// the workload turns to copying.
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
  return buckets_[static_cast<size_t>(bucket)];
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
void SpecGate::observe(int32_t bucket, GateMode used, bool verified, int32_t tokens,
                       double seconds) {
  Bucket& b = at(bucket);
  const bool probing = b.phase == Phase::Probe;
  if ((used != b.mode) != probing) return;
  if (b.mode == GateMode::Plain && b.before.steps > 0) {
    const double step = b.before.seconds / b.before.steps;
    b.credit = std::min(b.credit + cfg_.probe_budget * seconds,
                        cfg_.probe_budget * cfg_.credit_steps * step);
  }
  const bool evidence = used == GateMode::Plain || verified;
  if (probing) {
    probe_step(b, evidence, tokens, seconds);
  } else {
    window_step(b, evidence, tokens, seconds);
  }
}

void SpecGate::window_step(Bucket& b, bool evidence, int32_t tokens, double seconds) {
  ++b.current_steps;
  if (evidence) b.current.add(tokens, seconds);
  if (b.current.steps < cfg_.window_steps && b.current_steps < cfg_.max_window_steps) return;
  const Window full = b.current;
  b.current = {};
  b.current_steps = 0;
  if (full.steps == 0) return;  // nothing drafted: no window
  if (b.phase == Phase::After) {
    judge(b, full);
    return;
  }
  b.before = full;
  if (++b.windows < b.probe_every) return;
  if (b.mode == GateMode::Plain && b.credit <= 0) return;
  b.windows = 0;
  b.phase = Phase::Probe;
  ++probes_;
}

// A probe that is clearly losing ends early (what a probe of the slower mode costs is bounded
// by abort_steps). A full one waits for the window after it, except a plain probe clearly
// beating speculation: plain is what `off` runs, so the bucket leaves speculation at once.
// A probe of speculation is charged what its verify steps cost beyond plain's rate.
void SpecGate::probe_step(Bucket& b, bool evidence, int32_t tokens, double seconds) {
  ++b.probe_steps;
  const double before = b.before.rate();
  if (evidence) {
    b.probe.add(tokens, seconds);
    if (b.mode == GateMode::Plain && before > 0) b.credit -= seconds - tokens / before;
    if (b.probe.steps >= cfg_.abort_steps && b.probe.rate() < before * cfg_.abort_below) {
      end_probe(b);
      keep(b);
      return;
    }
  }
  if (b.probe.steps < cfg_.window_steps && b.probe_steps < cfg_.max_window_steps) return;
  if (b.probe.steps == 0) {  // nothing drafted: no evidence, the next probe as if none ran
    end_probe(b);
    return;
  }
  if (b.mode == GateMode::Spec && b.probe.rate() * cfg_.abort_below > before) {
    end_probe(b);
    flip(b);
    return;
  }
  b.phase = Phase::After;
}

void SpecGate::end_probe(Bucket& b) {
  b.probe = {};
  b.probe_steps = 0;
  b.phase = Phase::Measure;
}

// The probe against the mean of the windows on either side of it, so a load that drifts during
// the probe moves both sides alike; how far the two sides disagree is the noise the way back to
// speculation must clear on top of its margin.
void SpecGate::judge(Bucket& b, const Window& after) {
  const double ref = 0.5 * (b.before.rate() + after.rate());
  const double spread = ref > 0 ? std::abs(b.before.rate() - after.rate()) / ref : 0;
  const double rate = b.probe.rate();
  const bool to_spec = b.mode == GateMode::Plain;
  const bool won =
      rate > ref * (1.0 + (to_spec ? cfg_.to_spec_margin + spread : cfg_.to_plain_margin));
  const bool at_once = to_spec && rate > ref * (1.0 + cfg_.to_spec_at_once + spread);
  b.probe = {};
  b.probe_steps = 0;
  b.before = after;
  b.windows = 1;
  b.phase = Phase::Measure;
  if (!won) {
    keep(b);
    return;
  }
  b.probe_every = cfg_.min_probe_every;
  if (at_once || ++b.losses >= cfg_.losses_to_switch) flip(b);
}

// The current mode won its probe: a speculating bucket probes less often; a plain bucket's
// probes are spaced by what they cost (the credit), not by their count.
void SpecGate::keep(Bucket& b) {
  b.losses = 0;
  if (b.mode == GateMode::Spec) {
    b.probe_every = std::min(cfg_.max_probe_every_spec, b.probe_every * 2);
  } else {
    b.probe_every = cfg_.min_probe_every;
  }
}

void SpecGate::flip(Bucket& b) {
  b.mode = other(b.mode);
  b.losses = 0;
  b.before = {};
  b.current = {};
  b.current_steps = 0;
  b.windows = 0;
  b.probe_every = cfg_.min_probe_every;
  b.credit = 0;
  ++switches_;
}

}  // namespace met
