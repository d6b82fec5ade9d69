// Owns: the scenario runner of the trace spec (sections 4 and 9.2): builds the recording fake and
// a scheduler, feeds requests at their arrival ticks, renders every client's output.
// Called by: the `met trace` command (through bindings/testing.cpp) and the C++ tests.
// Invariants: single-threaded and deterministic; the real engine's blocking drain is emulated by
// delivering the next arrival group (or closing the inbox) whenever the scheduler would idle, and
// the arrival gate by delivering a tick's requests from inside that tick's snapshot query.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "met/scheduler.h"
#include "recording_backend.h"

namespace met::testing {

struct ScenarioRequest {
  uint64_t id = 1;  // also the session hash and the first prompt token
  int32_t prompt_len = 1;
  std::vector<int32_t> toks;              // the fake's script
  std::optional<int32_t> max_tokens;      // default: toks.size()
  bool streaming = true;                  // false: a blocking client
  std::optional<int32_t> arrive_at_tick;  // default: queued before the scheduler starts
  bool expired_deadline = false;
  int32_t min_tokens = 0;
  float temperature = 0.0f;
  int32_t top_logprobs = 0;  // 0: no logprobs; k > 0: logprobs with k alternatives
  std::optional<int32_t> cancel_at;
};

struct ScenarioSpec {
  std::string name;
  FakeModelConfig model;
  SchedulerConfig options;
  std::vector<ScenarioRequest> requests;
};

// Position 0 is the id; then 3, 4, 5, 6, 7, 8, 2, ... (trace spec 4.1).
std::vector<int32_t> scenario_prompt(const ScenarioRequest& r);

// The whole trace: header, model-call and fx lines, then one `out s<id>:` line per request.
std::string run_scenario(const ScenarioSpec& spec);

// The built-in scenario of the golden trace.
ScenarioSpec batched_mixed_spec();

}  // namespace met::testing
