// Owns: the speculation gate: per batch-width bucket, which decode mode runs (speculative or
// plain), the delivered-tokens/s windows it measured for each, its probe credit, and the
// draft-length ladder.
// Called by: the speculative decode strategy (scheduler_spec.cpp): choose() before a step,
// observe() once that step's wall time is known (the next tick's time minus this one's).
// Invariants: deterministic in its inputs (the scheduler passes time in, the gate reads no
// clock); only steps that verified drafts are evidence about speculation (a speculating step
// in which no row had a draft ran plain decoding and cost what plain costs); a bucket switches
// mode only after `losses_to_switch` consecutive probes in which the other mode beat the mean
// of the windows on either side of the probe by more than its margin, or one probe that beat
// it by far.
#pragma once

#include <cstdint>
#include <vector>

namespace met {

// The margins are asymmetric on purpose: plain decoding is what `--speculative off` runs, so
// leaving speculation for plain can never make the server slower than off, while the way back
// must be beyond the noise. Probing plain is as cheap for the same reason, so a speculating
// bucket probes often; a plain bucket's probes of speculation are paid for from a credit of
// `probe_budget` of its time (a probe that verified nothing cost nothing), and a probe that is
// clearly losing ends after `abort_steps` verify steps.
struct GateConfig {
  int32_t window_steps = 8;          // steps of evidence per measured window (and per probe)
  int32_t max_window_steps = 64;     // ... or this many steps in all where drafts are rare
  int32_t min_probe_every = 2;       // windows between probes, right after a switch or a loss
  int32_t max_probe_every_spec = 4;  // ... doubling up to this while speculation keeps winning
  double to_plain_margin = 0.01;     // plain must beat speculation by this share
  double to_spec_margin = 0.05;      // speculation must beat plain by this share plus the spread
                                     // between the windows either side of the probe ...
  double to_spec_at_once = 0.25;     // ... twice, or once by this share plus the spread
  double abort_below = 0.75;         // a probe below this share of the window before it ...
  int32_t abort_steps = 1;           // ... after this many steps of evidence ends, lost
  int32_t losses_to_switch = 2;      // consecutive winning probes of the other mode to switch
  double probe_budget = 0.01;        // share of a plain bucket's time its probes may cost ...
  int32_t credit_steps = 400;        // ... saved up over at most this many plain steps
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
  // One step of `bucket` ran in `used` mode, `verified` drafts (false for every plain step,
  // and for a speculating step in which no row had a draft) and delivered `tokens` in
  // `seconds`.
  void observe(int32_t bucket, GateMode used, bool verified, int32_t tokens, double seconds);

  GateMode mode(int32_t bucket) const;
  int64_t switches() const { return switches_; }
  int64_t probes() const { return probes_; }

 private:
  struct Window {
    int32_t steps = 0;
    int64_t tokens = 0;
    double seconds = 0;
    void add(int32_t t, double s) {
      ++steps;
      tokens += t;
      seconds += s;
    }
    double rate() const { return seconds > 0 ? static_cast<double>(tokens) / seconds : 0; }
  };
  // Measure: windows of the current mode; Probe: one window of the other mode; After: the
  // current mode's window right after the probe, the second bracket it is judged against.
  enum class Phase { Measure, Probe, After };
  struct Bucket {
    GateMode mode = GateMode::Spec;
    Phase phase = Phase::Measure;
    Window current, before, probe;  // their evidence steps only
    int32_t current_steps = 0;      // every step of the current window (of the probe)
    int32_t probe_steps = 0;
    int32_t windows = 0;      // full windows since the last probe
    int32_t probe_every = 1;  // a fresh bucket probes after its first window
    int32_t losses = 0;
    double credit = 0;  // seconds a plain bucket's probes may still cost
  };
  Bucket& at(int32_t bucket);
  void window_step(Bucket& b, bool evidence, int32_t tokens, double seconds);
  void probe_step(Bucket& b, bool evidence, int32_t tokens, double seconds);
  void end_probe(Bucket& b);
  void judge(Bucket& b, const Window& after);
  void keep(Bucket& b);
  void flip(Bucket& b);

  GateConfig cfg_;
  std::vector<Bucket> buckets_;
  int64_t switches_ = 0;
  int64_t probes_ = 0;
};

}  // namespace met
