// Owns: the speculation gate: per batch-width bucket, which decode mode runs (speculative or
// plain), the delivered-tokens/s windows it measured for each, and the draft-length ladder.
// Called by: the speculative decode strategy (scheduler_spec.cpp): choose() before a step,
// observe() once that step's wall time is known (the next tick's time minus this one's).
// Invariants: deterministic in its inputs (the scheduler passes time in, the gate reads no
// clock); a bucket switches mode only after `losses_to_switch` consecutive probes in which the
// other mode delivered more than (1 + noise) times the tokens/s of the window before the probe.
#pragma once

#include <cstdint>
#include <vector>

namespace met {

struct GateConfig {
  int32_t window_steps = 8;      // decode steps per measured window (and per probe)
  int32_t min_probe_every = 2;   // windows between probes, right after a switch or a loss
  int32_t max_probe_every = 32;  // ... doubling up to this while the current mode keeps winning
  double noise = 0.05;           // a probe must beat the current mode by more than this share
  int32_t losses_to_switch = 2;  // consecutive losing probes before the bucket switches
};

enum class GateMode { Spec, Plain };

class SpecGate {
 public:
  explicit SpecGate(GateConfig cfg = {}) : cfg_(cfg) {}

  // Bucket of a decode step's width: 0 for 1 row, 1 for 2, 2 for 3-4, 3 for 5-8, ...
  static int32_t bucket(int32_t width);
  // The ladder: the full k up to 2 rows, one token fewer per doubling of the width after that,
  // down to 0 (wide steps are compute-bound, where a rejected draft row costs a real row).
  static int32_t draft_len(int32_t width, int32_t k);

  // The mode the next step of this bucket runs: its current mode, or the other one while a
  // probe is under way.
  GateMode choose(int32_t bucket);
  // One step of `bucket` ran in `used` mode and delivered `tokens` in `seconds`.
  void observe(int32_t bucket, GateMode used, int32_t tokens, double seconds);

  GateMode mode(int32_t bucket) const;
  int64_t switches() const { return switches_; }
  int64_t probes() const { return probes_; }

 private:
  struct Window {
    int32_t steps = 0;
    int64_t tokens = 0;
    double seconds = 0;
    double rate() const { return seconds > 0 ? static_cast<double>(tokens) / seconds : 0; }
  };
  struct Bucket {
    GateMode mode = GateMode::Spec;
    bool probing = false;
    Window current, last, probe;
    int32_t windows = 0;  // full windows since the last probe
    int32_t probe_every = 0;
    int32_t losses = 0;
  };
  Bucket& at(int32_t bucket);
  void evaluate(Bucket& b);

  GateConfig cfg_;
  std::vector<Bucket> buckets_;
  int64_t switches_ = 0;
  int64_t probes_ = 0;
};

}  // namespace met
