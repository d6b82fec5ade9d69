// The speculation gate: buckets, the draft ladder, probes, switching only on repeated real
// losses; and, on a synthetic machine with noise, drift and load bursts, the property the gate
// exists for: never more than 3% slower than speculation off, while keeping most of a gain.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>

#include "met/mix64.h"
#include "met/spec_gate.h"

namespace met {
namespace {

TEST(SpecGate, BucketsDoubleInWidth) {
  EXPECT_EQ(SpecGate::bucket(1), 0);
  EXPECT_EQ(SpecGate::bucket(2), 1);
  EXPECT_EQ(SpecGate::bucket(3), 2);
  EXPECT_EQ(SpecGate::bucket(4), 2);
  EXPECT_EQ(SpecGate::bucket(5), 3);
  EXPECT_EQ(SpecGate::bucket(8), 3);
  EXPECT_EQ(SpecGate::bucket(64), 6);
}

TEST(SpecGate, LadderShortensDraftsWithWidthDownToZero) {
  EXPECT_EQ(SpecGate::draft_len(1, 4), 4);
  EXPECT_EQ(SpecGate::draft_len(2, 4), 4);
  EXPECT_EQ(SpecGate::draft_len(4, 4), 3);
  EXPECT_EQ(SpecGate::draft_len(8, 4), 2);
  EXPECT_EQ(SpecGate::draft_len(16, 4), 1);
  EXPECT_EQ(SpecGate::draft_len(32, 4), 0);
  EXPECT_EQ(SpecGate::draft_len(256, 4), 0);
}

// What one speculative step is worth next to a plain one (cost 1, 1 token): its true rate
// relative to plain is tokens / cost. Only a share `drafts` of the speculating steps has a
// draft to verify; the others run the plain step (cost 1, 1 token), as in the scheduler.
struct World {
  double cost = 1;
  double tokens = 1;
  double drafts = 1;
};

// The machine's load at each step, a function of the step and the seed alone, so a gated run
// and an off run meet the same machine: noise (about lognormal with `sigma`), a slow drift of
// +-40% and, with `bursts`, 40-step spells at 1.8x the cost (someone else's build).
struct Machine {
  double sigma = 0;
  bool bursts = false;
  uint64_t seed = 1;

  double uniform(int step, int k) const {
    const uint64_t h = mix64(seed * 0x100000001b3ULL + static_cast<uint64_t>(step) * 8 + k);
    return static_cast<double>(h >> 11) * 0x1.0p-53;
  }
  double load(int step) const {
    double z = 0;
    for (int k = 0; k < 4; ++k) z += uniform(step, k);
    double f = std::exp(sigma * (z - 2.0) * std::sqrt(3.0));
    f *= 1.0 + 0.4 * std::sin(2.0 * M_PI * step / 700.0);
    for (int s = std::max(0, step - 39); bursts && s <= step; ++s) {
      if (uniform(s, 5) < 0.005) return f * 1.8;
    }
    return f;
  }
  bool drafts(int step, const World& w) const { return uniform(step, 6) < w.drafts; }
};

struct Outcome {
  double tokens = 0;
  double seconds = 0;
  int spec_steps = 0;  // steps that verified drafts
  double rate() const { return tokens / seconds; }
};

// How a lane decides: `--speculative off`, the gate, or `ngram-forced`.
enum class Lane { Off, Gated, Forced };

// Steps [from, to) of one bucket; 100 tokens per plain step so a speculative step's share
// rounds finely.
Outcome drive(Lane lane, SpecGate* gate, const Machine& m, int from, int to,
              const std::function<World(int)>& world) {
  Outcome r;
  for (int i = from; i < to; ++i) {
    GateMode mode = lane == Lane::Forced ? GateMode::Spec : GateMode::Plain;
    if (lane == Lane::Gated) mode = gate->choose(0);
    const World w = world(i);
    const bool verify = mode == GateMode::Spec && m.drafts(i, w);
    const double seconds = (verify ? w.cost : 1.0) * m.load(i);
    const auto tokens = static_cast<int32_t>(std::lround(100.0 * (verify ? w.tokens : 1.0)));
    if (lane == Lane::Gated) gate->observe(0, mode, verify, tokens, seconds);
    r.tokens += tokens;
    r.seconds += seconds;
    r.spec_steps += verify;
  }
  return r;
}

Outcome gated(SpecGate& gate, const Machine& m, int from, int to,
              const std::function<World(int)>& world) {
  return drive(Lane::Gated, &gate, m, from, to, world);
}
Outcome off(const Machine& m, int from, int to, const std::function<World(int)>& world) {
  return drive(Lane::Off, nullptr, m, from, to, world);
}
Outcome forced(const Machine& m, int from, int to, const std::function<World(int)>& world) {
  return drive(Lane::Forced, nullptr, m, from, to, world);
}
std::function<World(int)> always(World w) {
  return [w](int) { return w; };
}

// Every machine the property is checked on: quiet to very noisy, with and without bursts.
std::vector<Machine> machines() {
  std::vector<Machine> out;
  for (double sigma : {0.0, 0.1, 0.25}) {
    for (bool bursts : {false, true}) {
      for (uint64_t seed = 1; seed <= 6; ++seed) out.push_back({sigma, bursts, seed});
    }
  }
  return out;
}

// About the steps of one benchmark class at concurrency 1 (20 prompts of 128 tokens), for
// speculation that loses on every step it drafts, drafting always or rarely.
TEST(SpecGate, NeverMoreThanThreePercentSlowerThanOff) {
  const World worlds[] = {{1.02, 1.0},      {1.05, 1.0},     {1.1, 1.07},     {1.3, 1.2},
                          {1.3, 1.0},       {2.0, 1.5},      {2.0, 1.0},      {3.0, 1.0},
                          {5.0, 1.2},       {1.0, 1.0},      {2.0, 1.0, 0.3}, {3.0, 1.0, 0.1},
                          {3.0, 1.0, 0.05}, {1.3, 1.0, 0.5}, {1.1, 1.0, 0.2}};
  for (const World& w : worlds) {
    for (const Machine& m : machines()) {
      SpecGate gate;
      const Outcome g = gated(gate, m, 0, 3000, always(w));
      EXPECT_GE(g.rate(), 0.97 * off(m, 0, 3000, always(w)).rate())
          << "spec cost " << w.cost << " tokens " << w.tokens << " drafts " << w.drafts << " sigma "
          << m.sigma << " verify steps " << g.spec_steps << " probes " << gate.probes()
          << " bursts " << m.bursts << " seed " << m.seed;
    }
  }
}

// Kept: at least 85% of what always drafting gains over off, drafting always or half the time.
TEST(SpecGate, KeepsMostOfAGain) {
  for (const World w : {World{1.2, 1.8}, World{1.3, 3.2}, World{1.3, 3.2, 0.5}}) {
    for (const Machine& m : machines()) {
      SpecGate gate;
      const double g = gated(gate, m, 0, 3000, always(w)).rate();
      const double o = off(m, 0, 3000, always(w)).rate();
      const double f = forced(m, 0, 3000, always(w)).rate();
      EXPECT_GE(g, o + 0.85 * (f - o))
          << "cost " << w.cost << " tokens " << w.tokens << " drafts " << w.drafts << " sigma "
          << m.sigma << " bursts " << m.bursts << " seed " << m.seed;
      EXPECT_EQ(gate.switches(), 0);
    }
  }
}

// A workload that stops copying its prompt (the same bucket, a new class of requests): the gate
// leaves speculation within a few windows, and finds its way back within a few hundred steps
// when copying resumes.
TEST(SpecGate, FollowsAWorkloadThatTurns) {
  const World win{1.2, 2.4}, lose{2.0, 1.0};
  for (const Machine& m : machines()) {
    SpecGate gate;
    gated(gate, m, 0, 1500, always(win));
    ASSERT_EQ(gate.mode(0), GateMode::Spec);
    const Outcome turned = gated(gate, m, 1500, 1700, always(lose));
    EXPECT_EQ(gate.mode(0), GateMode::Plain) << "sigma " << m.sigma << " seed " << m.seed;
    const Outcome rest = gated(gate, m, 1700, 3000, always(lose));
    EXPECT_GE(rest.rate(), 0.97 * off(m, 1700, 3000, always(lose)).rate());
    EXPECT_LT(turned.spec_steps, 120);
    gated(gate, m, 3000, 3500, always(win));
    EXPECT_EQ(gate.mode(0), GateMode::Spec) << "sigma " << m.sigma << " seed " << m.seed;
  }
}

// The benchmark's turn: requests that draft nothing (a story) before requests that copy. Steps
// without drafts are no evidence, so the gate never leaves speculation for them, and the
// copying requests get the gain from their first step.
TEST(SpecGate, StepsWithoutDraftsAreNoEvidence) {
  const World none{1.0, 1.0, 0.0}, copy{1.3, 3.2};
  for (const Machine& m : machines()) {
    SpecGate gate;
    gated(gate, m, 0, 1500, always(none));
    EXPECT_EQ(gate.probes(), 0);
    const double g = gated(gate, m, 1500, 3000, always(copy)).rate();
    const double o = off(m, 1500, 3000, always(copy)).rate();
    const double f = forced(m, 1500, 3000, always(copy)).rate();
    EXPECT_EQ(gate.switches(), 0) << "sigma " << m.sigma << " seed " << m.seed;
    EXPECT_GE(g, o + 0.85 * (f - o)) << "sigma " << m.sigma << " seed " << m.seed;
  }
}

// Drafts that lose (a first-turn chat drafting a little, all rejected) turn the bucket plain
// and keep it within 3% of off over a class; then a stretch that drafts nothing, then copying:
// the plain bucket's probes cost nothing in between, so the turn to copying is noticed within a
// few hundred steps and most of the gain kept.
TEST(SpecGate, ReturnsToSpeculationWhenTheWorkloadTurnsToCopying) {
  const World lose{2.0, 1.0, 0.3}, none{1.0, 1.0, 0.0}, copy{1.2, 2.4};
  const auto workload = [&](int i) { return i < 3000 ? lose : i < 4000 ? none : copy; };
  for (const Machine& m : machines()) {
    SpecGate gate;
    const Outcome losing = gated(gate, m, 0, 3000, workload);
    EXPECT_GE(losing.rate(), 0.97 * off(m, 0, 3000, workload).rate())
        << "sigma " << m.sigma << " seed " << m.seed;
    ASSERT_EQ(gate.mode(0), GateMode::Plain) << "sigma " << m.sigma << " seed " << m.seed;
    gated(gate, m, 3000, 4300, workload);
    EXPECT_EQ(gate.mode(0), GateMode::Spec) << "sigma " << m.sigma << " seed " << m.seed;
    const double g = gated(gate, m, 4300, 5500, workload).rate();
    const double o = off(m, 4300, 5500, workload).rate();
    const double f = forced(m, 4300, 5500, workload).rate();
    EXPECT_GE(g, o + 0.85 * (f - o)) << "sigma " << m.sigma << " seed " << m.seed;
  }
}

// Steps of one bucket at fixed rates (tokens/s) in each mode, without noise.
void run(SpecGate& gate, int bucket, int steps, double spec, double plain) {
  for (int i = 0; i < steps; ++i) {
    const GateMode m = gate.choose(bucket);
    gate.observe(bucket, m, m == GateMode::Spec, 10, 10.0 / (m == GateMode::Spec ? spec : plain));
  }
}

TEST(SpecGate, SwitchesOffAfterTwoWinningProbesOfPlain) {
  SpecGate gate;
  EXPECT_EQ(gate.mode(0), GateMode::Spec);
  run(gate, 0, 8 + 8 + 8, 90.0, 100.0);     // a window, a probe, the window after it
  EXPECT_EQ(gate.mode(0), GateMode::Spec);  // one winning probe of plain is not enough
  run(gate, 0, 8 + 8 + 8, 90.0, 100.0);     // another window, the second probe, the after
  EXPECT_EQ(gate.mode(0), GateMode::Plain);
  EXPECT_EQ(gate.switches(), 1);
  EXPECT_EQ(gate.mode(1), GateMode::Spec);  // other buckets are measured on their own
}

TEST(SpecGate, AClearlyLosingProbeEndsEarly) {
  SpecGate gate;
  run(gate, 0, 200, 80.0, 100.0);
  ASSERT_EQ(gate.mode(0), GateMode::Plain);
  const int64_t probes = gate.probes();
  int spec_steps = 0;
  for (int i = 0; i < 2000; ++i) {
    const GateMode m = gate.choose(0);
    spec_steps += m == GateMode::Spec;
    gate.observe(0, m, m == GateMode::Spec, 10, 10.0 / (m == GateMode::Spec ? 50.0 : 100.0));
  }
  EXPECT_EQ(gate.mode(0), GateMode::Plain);
  EXPECT_GT(gate.probes(), probes);                     // it keeps probing ...
  EXPECT_LE(spec_steps, 2 * (gate.probes() - probes));  // ... two steps a probe
}

TEST(SpecGate, AStepOfTheWrongModeIsNotCounted) {
  SpecGate gate;
  for (int i = 0; i < 100; ++i) gate.observe(0, GateMode::Plain, false, 1000, 0.001);
  EXPECT_EQ(gate.probes(), 0);  // plain steps while measuring speculation are dropped
  EXPECT_EQ(gate.mode(0), GateMode::Spec);
}

// However slow, speculating steps in which no row had a draft never make a window.
TEST(SpecGate, ASpeculatingStepWithoutDraftsIsNoEvidence) {
  SpecGate gate;
  for (int i = 0; i < 1000; ++i) gate.observe(0, GateMode::Spec, false, 1, 1.0 + i % 7);
  EXPECT_EQ(gate.probes(), 0);
  EXPECT_EQ(gate.mode(0), GateMode::Spec);
}

// A plain bucket's probes that find nothing to draft cost nothing, so they keep coming: every
// two plain windows, each probe lasting max_window_steps.
TEST(SpecGate, ProbesThatDraftNothingCostNoCredit) {
  SpecGate gate;
  run(gate, 0, 48, 80.0, 100.0);
  ASSERT_EQ(gate.mode(0), GateMode::Plain);
  const int64_t probes = gate.probes();
  for (int i = 0; i < 800; ++i) {
    const GateMode m = gate.choose(0);
    gate.observe(0, m, false, 10, 0.1);
  }
  EXPECT_EQ(gate.mode(0), GateMode::Plain);
  EXPECT_GE(gate.probes() - probes, 800 / (16 + 64));
}

}  // namespace
}  // namespace met
