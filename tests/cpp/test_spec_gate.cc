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
// relative to plain is tokens / cost.
struct World {
  double cost = 1;
  double tokens = 1;
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
};

struct Outcome {
  double tokens = 0;
  double seconds = 0;
  int spec_steps = 0;
  double rate() const { return tokens / seconds; }
};

// Steps [from, to) of one bucket, gated (or plain throughout with no gate: `--speculative
// off`); 100 tokens per plain step so a speculative step's share rounds finely.
Outcome drive(SpecGate* gate, const Machine& m, int from, int to,
              const std::function<World(int)>& world) {
  Outcome r;
  for (int i = from; i < to; ++i) {
    const GateMode mode = gate != nullptr ? gate->choose(0) : GateMode::Plain;
    const bool spec = mode == GateMode::Spec;
    const World w = world(i);
    const double seconds = (spec ? w.cost : 1.0) * m.load(i);
    const auto tokens = static_cast<int32_t>(std::lround(100.0 * (spec ? w.tokens : 1.0)));
    if (gate != nullptr) gate->observe(0, mode, tokens, seconds);
    r.tokens += tokens;
    r.seconds += seconds;
    r.spec_steps += spec;
  }
  return r;
}

Outcome steady(SpecGate* gate, const Machine& m, World w, int steps = 3000) {
  return drive(gate, m, 0, steps, [w](int) { return w; });
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

// About the steps of one benchmark class at concurrency 1 (20 prompts of 128 tokens).
TEST(SpecGate, NeverMoreThanThreePercentSlowerThanOff) {
  const World worlds[] = {{1.02, 1.0}, {1.05, 1.0}, {1.1, 1.07}, {1.3, 1.2}, {1.3, 1.0},
                          {2.0, 1.5},  {2.0, 1.0},  {3.0, 1.0},  {5.0, 1.2}, {1.0, 1.0}};
  for (const World& w : worlds) {
    for (const Machine& m : machines()) {
      SpecGate gate;
      const Outcome gated = steady(&gate, m, w);
      const Outcome off = steady(nullptr, m, w);
      EXPECT_GE(gated.rate(), 0.97 * off.rate())
          << "spec cost " << w.cost << " tokens " << w.tokens << " sigma " << m.sigma
          << " spec steps " << gated.spec_steps << " probes " << gate.probes() << " bursts "
          << m.bursts << " seed " << m.seed;
    }
  }
}

TEST(SpecGate, KeepsMostOfAGain) {
  for (const World w : {World{1.2, 1.8}, World{1.3, 3.2}}) {
    const double gain = w.tokens / w.cost;
    for (const Machine& m : machines()) {
      SpecGate gate;
      const Outcome gated = steady(&gate, m, w);
      const Outcome off = steady(nullptr, m, w);
      EXPECT_GE(gated.rate(), off.rate() * (1.0 + 0.85 * (gain - 1.0)))
          << "gain " << gain << " sigma " << m.sigma << " bursts " << m.bursts << " seed "
          << m.seed;
      EXPECT_EQ(gate.switches(), 0);
    }
  }
}

// A workload that stops copying its prompt (the same bucket, a new class of requests): the gate
// leaves speculation within a few windows, and finds its way back when copying resumes.
TEST(SpecGate, FollowsAWorkloadThatTurns) {
  const World win{1.2, 2.4}, lose{2.0, 1.0};
  for (const Machine& m : machines()) {
    SpecGate gate;
    drive(&gate, m, 0, 1500, [&](int) { return win; });
    ASSERT_EQ(gate.mode(0), GateMode::Spec);
    const Outcome turned = drive(&gate, m, 1500, 1700, [&](int) { return lose; });
    EXPECT_EQ(gate.mode(0), GateMode::Plain) << "sigma " << m.sigma << " seed " << m.seed;
    const Outcome rest = drive(&gate, m, 1700, 3000, [&](int) { return lose; });
    const Outcome off = drive(nullptr, m, 1700, 3000, [&](int) { return lose; });
    EXPECT_GE(rest.rate(), 0.97 * off.rate());
    EXPECT_LT(turned.spec_steps, 120);
    drive(&gate, m, 3000, 4000, [&](int) { return win; });
    EXPECT_EQ(gate.mode(0), GateMode::Spec) << "sigma " << m.sigma << " seed " << m.seed;
  }
}

// Steps of one bucket at fixed rates (tokens/s) in each mode, without noise.
void run(SpecGate& gate, int bucket, int steps, double spec, double plain) {
  for (int i = 0; i < steps; ++i) {
    const GateMode m = gate.choose(bucket);
    gate.observe(bucket, m, 10, 10.0 / (m == GateMode::Spec ? spec : plain));
  }
}

TEST(SpecGate, SwitchesOffAfterTwoWinningProbesOfPlain) {
  SpecGate gate;
  EXPECT_EQ(gate.mode(0), GateMode::Spec);
  run(gate, 0, 16 + 8 + 8, 90.0, 100.0);    // two windows, a probe, the window after it
  EXPECT_EQ(gate.mode(0), GateMode::Spec);  // one winning probe of plain is not enough
  run(gate, 0, 8 + 8 + 8, 90.0, 100.0);
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
    gate.observe(0, m, 10, 10.0 / (m == GateMode::Spec ? 50.0 : 100.0));
  }
  EXPECT_EQ(gate.mode(0), GateMode::Plain);
  EXPECT_GT(gate.probes(), probes);                     // it keeps probing ...
  EXPECT_LE(spec_steps, 2 * (gate.probes() - probes));  // ... two steps a probe
}

TEST(SpecGate, AStepOfTheWrongModeIsNotCounted) {
  SpecGate gate;
  for (int i = 0; i < 100; ++i) gate.observe(0, GateMode::Plain, 1000, 0.001);
  EXPECT_EQ(gate.probes(), 0);  // plain steps while measuring speculation are dropped
  EXPECT_EQ(gate.mode(0), GateMode::Spec);
}

}  // namespace
}  // namespace met
