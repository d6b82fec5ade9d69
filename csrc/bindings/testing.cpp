// Python view of the trace harness: `met trace` builds a ScenarioSpec and runs it here.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include "../testing/harness.h"
#include "../testing/recording_backend.h"

namespace py = pybind11;

namespace met::bindings {

void bind_testing(py::module_& m) {
  using testing::FakeModelConfig;
  using testing::ScenarioRequest;
  using testing::ScenarioSpec;

  py::class_<FakeModelConfig>(m, "FakeModelConfig")
      .def(py::init<>())
      .def_readwrite("vocab", &FakeModelConfig::vocab)
      .def_readwrite("block_size", &FakeModelConfig::block_size)
      .def_readwrite("total_blocks", &FakeModelConfig::total_blocks)
      .def_readwrite("held_blocks", &FakeModelConfig::held_blocks)
      .def_readwrite("reclaimable", &FakeModelConfig::reclaimable)
      .def_readwrite("kv_exhaust_at", &FakeModelConfig::kv_exhaust_at)
      .def_readwrite("verify_exhaust_at", &FakeModelConfig::verify_exhaust_at);

  py::class_<ScenarioRequest>(m, "ScenarioRequest")
      .def(py::init<>())
      .def_readwrite("id", &ScenarioRequest::id)
      .def_readwrite("prompt_len", &ScenarioRequest::prompt_len)
      .def_readwrite("toks", &ScenarioRequest::toks)
      .def_readwrite("max_tokens", &ScenarioRequest::max_tokens)
      .def_readwrite("streaming", &ScenarioRequest::streaming)
      .def_readwrite("arrive_at_tick", &ScenarioRequest::arrive_at_tick)
      .def_readwrite("expired_deadline", &ScenarioRequest::expired_deadline)
      .def_readwrite("min_tokens", &ScenarioRequest::min_tokens)
      .def_readwrite("temperature", &ScenarioRequest::temperature)
      .def_readwrite("top_logprobs", &ScenarioRequest::top_logprobs)
      .def_readwrite("cancel_at", &ScenarioRequest::cancel_at);

  py::class_<ScenarioSpec>(m, "ScenarioSpec")
      .def(py::init<>())
      .def_readwrite("name", &ScenarioSpec::name)
      .def_readwrite("model", &ScenarioSpec::model)
      .def_readwrite("options", &ScenarioSpec::options)
      .def_readwrite("requests", &ScenarioSpec::requests);

  m.def("run_scenario", &testing::run_scenario, py::arg("spec"));
  m.def("batched_mixed_spec", &testing::batched_mixed_spec);
}

}  // namespace met::bindings
