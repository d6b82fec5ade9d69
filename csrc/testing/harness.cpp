#include "harness.h"

#include <map>
#include <stdexcept>
#include <utility>

namespace met::testing {
namespace {

// Far more ticks than any scenario needs: a scheduler that never shuts down is a bug, not a hang.
constexpr int32_t kMaxTicks = 100000;

Request build_request(const ScenarioRequest& r) {
  Request req;
  req.id = r.id;
  req.prompt = scenario_prompt(r);
  req.params.max_tokens = r.max_tokens.value_or(static_cast<int32_t>(r.toks.size()));
  req.params.min_tokens = r.min_tokens;
  req.params.temperature = r.temperature;
  req.params.top_logprobs = r.top_logprobs > 0 ? r.top_logprobs : -1;
  req.streaming = r.streaming;
  // Built before the run starts, at time 0; the first tick runs at time 1, so it is past.
  req.has_deadline = r.expired_deadline;
  req.deadline = 0.0;
  return req;
}

std::string token_list(const std::vector<int32_t>& v) {
  std::string out = "[";
  for (size_t i = 0; i < v.size(); ++i) out += (i ? ", " : "") + std::to_string(v[i]);
  return out + "]";
}

std::string render_stream(const std::vector<ClientEvent>& events, int32_t top_logprobs) {
  std::string out;
  for (const ClientEvent& e : events) {
    if (!out.empty()) out += " ";
    if (e.kind == ClientEvent::Kind::Token) {
      out += e.with_logprobs
                 ? "TL" + std::to_string(e.token.token) + ":" + std::to_string(top_logprobs)
                 : "T" + std::to_string(e.token.token);
    } else if (e.kind == ClientEvent::Kind::Error) {
      out += "Error(" + e.error + ")";
    } else {
      const std::string guard = e.guard.empty() ? "None" : "Some(\"" + e.guard + "\")";
      out += "Done(" + e.finish_reason + ", n=" + std::to_string(e.n) +
             ", think=" + std::to_string(e.think) + ", cached=" + std::to_string(e.cached) +
             ", acc=" + std::to_string(e.acc) + ", guard=" + guard + ")";
    }
  }
  return out;
}

std::string render_blocking(const std::vector<ClientEvent>& events) {
  for (const ClientEvent& e : events) {
    if (e.kind == ClientEvent::Kind::Error) return "Err(" + e.error + ")";
    if (e.kind == ClientEvent::Kind::Done) {
      return "Response(tokens=" + token_list(e.output) + ", " + e.finish_reason +
             ", think=" + std::to_string(e.think) + ", cached=" + std::to_string(e.cached) +
             ", acc=" + std::to_string(e.acc) + ", logprobs=" + std::to_string(e.logprobs) + ")";
    }
  }
  return "dropped";
}

}  // namespace

std::vector<int32_t> scenario_prompt(const ScenarioRequest& r) {
  std::vector<int32_t> p;
  for (int32_t i = 0; i < r.prompt_len; ++i) {
    p.push_back(i == 0 ? static_cast<int32_t>(r.id) : 2 + i % 7);
  }
  return p;
}

std::string run_scenario(const ScenarioSpec& spec) {
  RecordingBackend backend(spec.model);
  backend.trace().line("# scenario " + spec.name);
  std::map<int32_t, std::vector<const ScenarioRequest*>> arrivals;  // by tick, scenario order
  for (const auto& r : spec.requests) {
    backend.add_script(r.id, Script{r.prompt_len, r.toks, r.cancel_at.value_or(-1)});
    if (r.arrive_at_tick) arrivals[*r.arrive_at_tick].push_back(&r);
  }
  Scheduler sched(backend, spec.options, &backend.trace(), &backend);
  for (const auto& r : spec.requests) {
    if (!r.arrive_at_tick) sched.add_request(build_request(r));
  }
  auto deliver = [&](std::map<int32_t, std::vector<const ScenarioRequest*>>::iterator it) {
    for (const ScenarioRequest* r : it->second) sched.add_request(build_request(*r));
    arrivals.erase(it);
  };
  backend.set_tick_gate([&](int32_t t) {
    auto it = arrivals.find(t);
    if (it != arrivals.end()) deliver(it);
  });
  backend.set_cancel_hook([&](uint64_t id) { sched.abort_request(id); });

  std::map<uint64_t, std::vector<ClientEvent>> events;
  for (int32_t tick = 1;; ++tick) {
    if (tick > kMaxTicks) throw std::runtime_error("scenario " + spec.name + " never shut down");
    // The real drain would block here: the next arrivals come in, or every client is done.
    if (!sched.has_work()) {
      if (arrivals.empty()) {
        sched.close_inbox();
      } else {
        deliver(arrivals.begin());
      }
    }
    const TickResult res = sched.tick(static_cast<double>(tick));
    for (auto& e : sched.take_events()) events[e.request_id].push_back(std::move(e));
    if (res.shutdown) break;
  }

  std::string out = backend.trace().text();
  for (const auto& r : spec.requests) {
    const auto& evs = events[r.id];
    out += "out s" + std::to_string(r.id) + ": " +
           (r.streaming ? render_stream(evs, r.top_logprobs) : render_blocking(evs)) + "\n";
  }
  return out;
}

ScenarioSpec batched_mixed_spec() {
  ScenarioSpec spec;
  spec.name = "batched_mixed";
  spec.options.max_prefill_tokens = 8;
  ScenarioRequest s1;
  s1.id = 1;
  s1.prompt_len = 4;
  s1.toks = {10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 63};
  ScenarioRequest s2;
  s2.id = 2;
  s2.prompt_len = 20;
  s2.toks = {20, 21, 63};
  s2.arrive_at_tick = 2;
  ScenarioRequest s3;
  s3.id = 3;
  s3.prompt_len = 18;
  s3.toks = {30, 31, 63};
  s3.arrive_at_tick = 2;
  spec.requests = {s1, s2, s3};
  return spec;
}

}  // namespace met::testing
