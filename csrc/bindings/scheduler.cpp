// Python view of the scheduler: the engine thread builds Requests, ticks, and drains events.
// tick() runs with the GIL held: a Python backend is called back on the same thread.
#include "met/scheduler.h"

#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <optional>

namespace py = pybind11;

namespace met::bindings {
namespace {

void bind_spec(py::module_& m) {
  py::enum_<SpecMode>(m, "SpecMode")
      .value("Off", SpecMode::Off)
      .value("Ngram", SpecMode::Ngram)
      .value("NgramForced", SpecMode::NgramForced);
  py::class_<SpecStats>(m, "SpecStats")
      .def_readonly("drafted", &SpecStats::drafted)
      .def_readonly("accepted", &SpecStats::accepted)
      .def_readonly("verify_steps", &SpecStats::verify_steps)
      .def_readonly("verify_rows", &SpecStats::verify_rows)
      .def_readonly("plain_steps", &SpecStats::plain_steps)
      .def_readonly("fused_verify_steps", &SpecStats::fused_verify_steps)
      .def_readonly("withheld", &SpecStats::withheld)
      .def_readonly("gate_switches", &SpecStats::gate_switches)
      .def_readonly("gate_probes", &SpecStats::gate_probes)
      .def_readonly("proposer_seconds", &SpecStats::proposer_seconds)
      .def_readonly("gate_plain_buckets", &SpecStats::gate_plain_buckets);
  m.def("spec_off_reason", &spec_off_reason, py::arg("mode"), py::arg("params"));
}

void bind_values(py::module_& m) {
  bind_spec(m);
  py::class_<SchedulerConfig>(m, "SchedulerConfig")
      .def(py::init([](int32_t max_batch_size, int32_t max_prefill_tokens, int32_t max_batch_tokens,
                       int32_t max_seq_len, std::vector<int32_t> eos) {
             return SchedulerConfig{max_batch_size, max_prefill_tokens, max_batch_tokens,
                                    max_seq_len, std::move(eos)};
           }),
           py::arg("max_batch_size") = 8, py::arg("max_prefill_tokens") = 0,
           py::arg("max_batch_tokens") = 8192, py::arg("max_seq_len") = 4096,
           py::arg("eos_tokens") = std::vector<int32_t>{63})
      .def_readwrite("max_batch_size", &SchedulerConfig::max_batch_size)
      .def_readwrite("max_prefill_tokens", &SchedulerConfig::max_prefill_tokens)
      .def_readwrite("max_batch_tokens", &SchedulerConfig::max_batch_tokens)
      .def_readwrite("max_seq_len", &SchedulerConfig::max_seq_len)
      .def_readwrite("eos_tokens", &SchedulerConfig::eos_tokens)
      // The speculation knobs, flat (SpecConfig and its parts are plain values in C++).
      .def_property(
          "speculative", [](const SchedulerConfig& c) { return c.spec.mode; },
          [](SchedulerConfig& c, SpecMode m) { c.spec.mode = m; })
      .def_property(
          "num_speculative_tokens", [](const SchedulerConfig& c) { return c.spec.k; },
          [](SchedulerConfig& c, int32_t k) { c.spec.k = k; })
      .def_property(
          "ngram_min_match", [](const SchedulerConfig& c) { return c.spec.ngram.min_n; },
          [](SchedulerConfig& c, int32_t n) { c.spec.ngram.min_n = n; })
      .def_property(
          "ngram_max_match", [](const SchedulerConfig& c) { return c.spec.ngram.max_n; },
          [](SchedulerConfig& c, int32_t n) { c.spec.ngram.max_n = n; });

  py::class_<Request>(m, "Request")
      .def(py::init([](uint64_t id, std::vector<int32_t> prompt, SamplingParams params,
                       bool streaming, std::optional<double> deadline) {
             Request r;
             r.id = id;
             r.prompt = std::move(prompt);
             r.params = std::move(params);
             r.streaming = streaming;
             r.has_deadline = deadline.has_value();
             r.deadline = deadline.value_or(0.0);
             return r;
           }),
           py::arg("id"), py::arg("prompt"), py::arg("params") = SamplingParams{},
           py::arg("streaming") = true, py::arg("deadline") = std::nullopt)
      .def_readwrite("id", &Request::id)
      .def_readwrite("prompt", &Request::prompt)
      .def_readwrite("params", &Request::params)
      .def_readwrite("has_deadline", &Request::has_deadline)
      .def_readwrite("deadline", &Request::deadline)
      .def_readwrite("streaming", &Request::streaming);

  py::class_<ClientEvent> event(m, "ClientEvent");
  py::enum_<ClientEvent::Kind>(event, "Kind")
      .value("Token", ClientEvent::Kind::Token)
      .value("Done", ClientEvent::Kind::Done)
      .value("Error", ClientEvent::Kind::Error);
  event.def_readonly("kind", &ClientEvent::kind)
      .def_readonly("request_id", &ClientEvent::request_id)
      .def_readonly("token", &ClientEvent::token)
      // The id alone, read once per generated token: no SampledToken wrapper to build.
      .def_property_readonly("token_id", [](const ClientEvent& e) { return e.token.token; })
      .def_readonly("with_logprobs", &ClientEvent::with_logprobs)
      .def_readonly("finish_reason", &ClientEvent::finish_reason)
      .def_readonly("n", &ClientEvent::n)
      .def_readonly("think", &ClientEvent::think)
      .def_readonly("cached", &ClientEvent::cached)
      .def_readonly("acc", &ClientEvent::acc)
      .def_property_readonly("guard",
                             [](const ClientEvent& e) -> std::optional<std::string> {
                               if (e.guard.empty()) return std::nullopt;
                               return e.guard;
                             })
      .def_readonly("error", &ClientEvent::error)
      .def_readonly("spec_off", &ClientEvent::spec_off)
      .def_readonly("output", &ClientEvent::output)
      .def_readonly("logprobs", &ClientEvent::logprobs);

  py::class_<TickResult>(m, "TickResult").def_readonly("shutdown", &TickResult::shutdown);

  py::class_<SchedulerStats>(m, "SchedulerStats")
      .def_readonly("running", &SchedulerStats::running)
      .def_readonly("prefilling", &SchedulerStats::prefilling)
      .def_readonly("waiting", &SchedulerStats::waiting)
      .def_readonly("requeued", &SchedulerStats::requeued)
      .def_readonly("preemptions", &SchedulerStats::preemptions);
}

}  // namespace

void bind_scheduler(py::module_& m) {
  bind_values(m);
  m.def("plan_chunk_len", &plan_chunk_len, py::arg("off"), py::arg("total"), py::arg("proposed"),
        py::arg("block_size"));
  // keep_alive: the scheduler holds the backend, the block manager and the state pool by
  // reference. With a block manager the scheduler owns the KV bookkeeping (met/kv_ledger.h), with
  // a state pool (which needs one) a hybrid model's state slots too.
  py::class_<Scheduler>(m, "Scheduler")
      .def(py::init(
               [](Backend& backend, SchedulerConfig cfg, BlockManager* blocks, StatePool* states) {
                 if (states != nullptr && blocks == nullptr) {
                   throw py::value_error("Scheduler: a state pool needs a block manager");
                 }
                 return std::make_unique<Scheduler>(backend, std::move(cfg), nullptr, nullptr,
                                                    blocks, states);
               }),
           py::arg("backend"), py::arg("config") = SchedulerConfig{}, py::arg("blocks") = nullptr,
           py::arg("states") = nullptr, py::keep_alive<1, 2>(), py::keep_alive<1, 4>(),
           py::keep_alive<1, 5>())
      .def("add_request", &Scheduler::add_request, py::arg("request"))
      .def("abort_request", &Scheduler::abort_request, py::arg("id"))
      .def("close_inbox", &Scheduler::close_inbox)
      .def("has_work", &Scheduler::has_work)
      .def("tick", &Scheduler::tick, py::arg("now"))
      .def("take_events", &Scheduler::take_events)
      .def("stats", &Scheduler::stats)
      .def("spec_stats", &Scheduler::spec_stats);
}

}  // namespace met::bindings
