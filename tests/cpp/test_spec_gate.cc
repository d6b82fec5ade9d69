// The speculation gate: buckets, the draft ladder, probes, switching only on repeated real losses.
#include <gtest/gtest.h>

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

// Runs `steps` steps of one bucket where a step delivers `spec` tokens/s speculating and `plain`
// tokens/s without; returns how many steps ran speculating.
int run(SpecGate& gate, int steps, double spec, double plain) {
  int spec_steps = 0;
  for (int i = 0; i < steps; ++i) {
    const GateMode m = gate.choose(0);
    spec_steps += m == GateMode::Spec;
    gate.observe(0, m, 10, 10.0 / (m == GateMode::Spec ? spec : plain));
  }
  return spec_steps;
}

TEST(SpecGate, SwitchesOffAfterConsecutiveLosingProbes) {
  SpecGate gate;
  EXPECT_EQ(gate.mode(0), GateMode::Spec);
  run(gate, 200, 80.0, 100.0);
  EXPECT_EQ(gate.mode(0), GateMode::Plain);
  EXPECT_EQ(gate.switches(), 1);
  EXPECT_EQ(gate.mode(1), GateMode::Spec);  // other buckets are measured on their own
}

TEST(SpecGate, KeepsAWinningModeAndProbesLessOften) {
  SpecGate gate;
  const int spec_steps = run(gate, 2000, 150.0, 100.0);
  EXPECT_EQ(gate.mode(0), GateMode::Spec);
  EXPECT_EQ(gate.switches(), 0);
  EXPECT_GT(spec_steps, 2000 * 9 / 10);  // probes back off while speculation keeps winning
  EXPECT_LT(gate.probes(), 12);
}

TEST(SpecGate, DifferencesWithinTheNoiseNeverSwitch) {
  SpecGate gate;
  run(gate, 2000, 100.0, 103.0);
  EXPECT_EQ(gate.switches(), 0);
  EXPECT_EQ(gate.mode(0), GateMode::Spec);
}

TEST(SpecGate, SwitchesBackWhenSpeculationWinsAgain) {
  SpecGate gate;
  run(gate, 200, 80.0, 100.0);
  ASSERT_EQ(gate.mode(0), GateMode::Plain);
  run(gate, 400, 150.0, 100.0);
  EXPECT_EQ(gate.mode(0), GateMode::Spec);
  EXPECT_EQ(gate.switches(), 2);
}

TEST(SpecGate, OneLosingProbeAloneDoesNotSwitch) {
  SpecGate gate;
  run(gate, 16, 80.0, 100.0);  // two windows of speculation, then a probe starts
  run(gate, 8, 80.0, 100.0);   // the probe: plain wins once
  EXPECT_EQ(gate.mode(0), GateMode::Spec);
  run(gate, 400, 150.0, 100.0);  // then speculation wins every later probe
  EXPECT_EQ(gate.switches(), 0);
}

}  // namespace
}  // namespace met
