// The pybind11 trampoline that lets a Python class implement met::Backend, and the StepPlan it
// receives. Sequences and plans reach Python as references (pointers under the hood), never
// copies, so a backend's writes to seq.slot / seq_len / tokens / block_table are what the
// scheduler sees. A Python execute that raises _core.KvExhausted becomes the C++ KvExhausted
// the scheduler handles.
#include "met/backend.h"

#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstdint>

namespace py = pybind11;

namespace met::bindings {
namespace {

PyObject* g_kv_exhausted = nullptr;  // the Python type, owned by the module

class PyBackend : public Backend {
 public:
  DeviceInfo open() override { PYBIND11_OVERRIDE_PURE(DeviceInfo, Backend, open); }
  int32_t num_free_blocks() override { PYBIND11_OVERRIDE_PURE(int32_t, Backend, num_free_blocks); }
  int32_t match_prefix(Sequence& seq, const std::vector<int32_t>& prompt) override {
    PYBIND11_OVERRIDE_IMPL(int32_t, Backend, "match_prefix", &seq, prompt);
    return Backend::match_prefix(seq, prompt);
  }

  void alloc_sequence(Sequence& seq, int32_t budget) override {
    PYBIND11_OVERRIDE_PURE(void, Backend, alloc_sequence, &seq, budget);
  }
  void free_sequence(Sequence& seq) override {
    PYBIND11_OVERRIDE_PURE(void, Backend, free_sequence, &seq);
  }
  void compact_sequence(Sequence& seq, int64_t new_slot) override {
    PYBIND11_OVERRIDE_PURE(void, Backend, compact_sequence, &seq, new_slot);
  }

  std::vector<int32_t> execute(const StepPlan& plan) override {
    try {
      PYBIND11_OVERRIDE_PURE(std::vector<int32_t>, Backend, execute, &plan);
    } catch (py::error_already_set& e) {
      if (e.matches(g_kv_exhausted)) throw KvExhausted();
      throw;
    }
  }
  void commit_accepted_prefix(Sequence& seq, int32_t na, int32_t k) override {
    PYBIND11_OVERRIDE_PURE(void, Backend, commit_accepted_prefix, &seq, na, k);
  }

  int32_t argmax_on_device(int32_t row, int32_t stream) override {
    PYBIND11_OVERRIDE_PURE(int32_t, Backend, argmax_on_device, row, stream);
  }
  std::vector<int32_t> argmax_batch(int32_t row, int32_t n, int32_t stream) override {
    PYBIND11_OVERRIDE_PURE(std::vector<int32_t>, Backend, argmax_batch, row, n, stream);
  }
  std::vector<SampledToken> sample_rows(const std::vector<SampleRow>& rows) override {
    PYBIND11_OVERRIDE_PURE(std::vector<SampledToken>, Backend, sample_rows, rows);
  }
  // The logits' address as an int: the Python side views it without a copy.
  std::vector<SampledToken> sample_logits(const float* logits, int64_t n_logits, int64_t vocab,
                                          const std::vector<SampleRow>& rows) override {
    PYBIND11_OVERRIDE_IMPL(std::vector<SampledToken>, Backend, "sample_logits",
                           reinterpret_cast<uintptr_t>(logits), n_logits, vocab, rows);
    return Backend::sample_logits(logits, n_logits, vocab, rows);
  }

  void join_streams(int32_t event, int32_t recorded, int32_t waiting) override {
    PYBIND11_OVERRIDE(void, Backend, join_streams, event, recorded, waiting);
  }
  void synchronize(int32_t stream) override {
    PYBIND11_OVERRIDE(void, Backend, synchronize, stream);
  }
  void teardown() override { PYBIND11_OVERRIDE(void, Backend, teardown); }
};

void bind_plan(py::module_& m) {
  py::enum_<RowKind>(m, "RowKind")
      .value("PrefillChunk", RowKind::PrefillChunk)
      .value("Decode", RowKind::Decode)
      .value("Verify", RowKind::Verify);
  py::enum_<ReferenceCall>(m, "ReferenceCall")
      .value("Prefill", ReferenceCall::Prefill)
      .value("PrefillChunk", ReferenceCall::PrefillChunk)
      .value("MixedForward", ReferenceCall::MixedForward)
      .value("MixedForwardBatch", ReferenceCall::MixedForwardBatch)
      .value("PrefillBatchChunk", ReferenceCall::PrefillBatchChunk)
      .value("DecodeBatch", ReferenceCall::DecodeBatch)
      .value("DecodeVerifyBatched", ReferenceCall::DecodeVerifyBatched)
      .value("MixedVerifyBatch", ReferenceCall::MixedVerifyBatch);
  py::class_<PlanRow>(m, "PlanRow")
      .def_property_readonly(
          "seq", [](const PlanRow& r) { return r.seq; }, py::return_value_policy::reference)
      .def_readonly("kind", &PlanRow::kind)
      .def_readonly("start", &PlanRow::start)
      .def_readonly("tokens", &PlanRow::tokens)
      .def_readonly("draft", &PlanRow::draft)
      .def_readonly("last_chunk", &PlanRow::last_chunk);
  py::class_<StepPlan>(m, "StepPlan")
      .def_readonly("call", &StepPlan::call)
      .def_readonly("stream", &StepPlan::stream)
      .def_readonly("rows", &StepPlan::rows)
      .def_readonly("argmax", &StepPlan::argmax)
      .def_readonly("grammar", &StepPlan::grammar);
  py::class_<DeviceInfo>(m, "DeviceInfo")
      .def(py::init([](int32_t vocab, int32_t block_size, int32_t total_blocks, bool streams,
                       int32_t prefill_stream, int32_t prefill_event) {
             return DeviceInfo{vocab,   block_size,     total_blocks,
                               streams, prefill_stream, prefill_event};
           }),
           py::arg("vocab"), py::arg("block_size"), py::arg("total_blocks"),
           py::arg("streams") = false, py::arg("prefill_stream") = 1, py::arg("prefill_event") = 2)
      .def_readonly("vocab", &DeviceInfo::vocab)
      .def_readonly("block_size", &DeviceInfo::block_size)
      .def_readonly("total_blocks", &DeviceInfo::total_blocks)
      .def_readonly("streams", &DeviceInfo::streams);
}

}  // namespace

void bind_backend(py::module_& m) {
  g_kv_exhausted = py::register_exception<KvExhausted>(m, "KvExhausted", PyExc_RuntimeError).ptr();
  m.attr("MATCH_IN_CORE") = kMatchInCore;
  bind_plan(m);

  // Only the defaults are bound as callable methods: a Python subclass overrides by name and may
  // call super() for them; pure methods have no C++ body to call.
  py::class_<Backend, PyBackend>(m, "Backend")
      .def(py::init<>())
      .def("match_prefix", &Backend::match_prefix)
      .def("join_streams", &Backend::join_streams)
      .def("synchronize", &Backend::synchronize)
      .def("teardown", &Backend::teardown);
}

}  // namespace met::bindings
