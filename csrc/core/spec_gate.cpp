// The speculation gate of met/spec_gate.h.
#include "met/spec_gate.h"

#include <algorithm>

namespace met {

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
  if (b.probe_every == 0) b.probe_every = cfg_.min_probe_every;
  return b;
}

GateMode SpecGate::mode(int32_t bucket) const {
  if (static_cast<size_t>(bucket) >= buckets_.size()) return GateMode::Spec;
  return buckets_[static_cast<size_t>(bucket)].mode;
}

GateMode SpecGate::choose(int32_t bucket) {
  Bucket& b = at(bucket);
  if (!b.probing) return b.mode;
  return b.mode == GateMode::Spec ? GateMode::Plain : GateMode::Spec;
}

// A step whose mode no longer matches what the bucket is measuring (it was chosen before a
// probe began or ended) is dropped rather than credited to the wrong side.
void SpecGate::observe(int32_t bucket, GateMode used, int32_t tokens, double seconds) {
  Bucket& b = at(bucket);
  const bool probe_step = used != b.mode;
  if (probe_step != b.probing) return;
  Window& w = probe_step ? b.probe : b.current;
  ++w.steps;
  w.tokens += tokens;
  w.seconds += seconds;
  if (w.steps < cfg_.window_steps) return;
  if (probe_step) {
    evaluate(b);
    return;
  }
  b.last = b.current;
  b.current = {};
  if (++b.windows >= b.probe_every) {
    b.windows = 0;
    b.probing = true;
    ++probes_;
  }
}

void SpecGate::evaluate(Bucket& b) {
  const bool lost = b.probe.rate() > b.last.rate() * (1.0 + cfg_.noise);
  b.probing = false;
  b.probe = {};
  if (!lost) {
    b.losses = 0;
    b.probe_every = std::min(cfg_.max_probe_every, b.probe_every * 2);
    return;
  }
  b.probe_every = cfg_.min_probe_every;
  if (++b.losses < cfg_.losses_to_switch) return;
  b.mode = b.mode == GateMode::Spec ? GateMode::Plain : GateMode::Spec;
  b.losses = 0;
  b.last = {};
  b.current = {};
  ++switches_;
}

}  // namespace met
