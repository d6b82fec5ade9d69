// The pybind11 trampoline that lets a Python class implement met::Backend.
// Sequences reach Python as references (pointers under the hood), never copies, so a backend's
// writes to seq.slot / seq_len / tokens / block_table are what the scheduler sees. A Python
// decode_batch or decode_verify_batched that raises _core.KvExhausted becomes the C++ KvExhausted
// the scheduler handles.
#include "met/backend.h"

#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

namespace py = pybind11;

namespace met::bindings {
namespace {

PyObject* g_kv_exhausted = nullptr;  // the Python type, owned by the module

// Overrides of methods with a C++ default call the default when Python does not define them.
#define MET_OVERRIDE_SEQ(name, ...)                                  \
  PYBIND11_OVERRIDE_IMPL(void, Backend, #name, &seq, ##__VA_ARGS__); \
  Backend::name(seq, ##__VA_ARGS__)

class PyBackend : public Backend {
 public:
  int32_t vocab_size() override { PYBIND11_OVERRIDE_PURE(int32_t, Backend, vocab_size); }
  int32_t block_size() override { PYBIND11_OVERRIDE_PURE(int32_t, Backend, block_size); }
  int32_t num_total_blocks() override {
    PYBIND11_OVERRIDE_PURE(int32_t, Backend, num_total_blocks);
  }
  int32_t snapshot_pool_occupancy() override {
    PYBIND11_OVERRIDE(int32_t, Backend, snapshot_pool_occupancy);
  }
  int32_t match_prefix(Sequence& seq, const std::vector<int32_t>& prompt) override {
    PYBIND11_OVERRIDE_IMPL(int32_t, Backend, "match_prefix", &seq, prompt);
    return Backend::match_prefix(seq, prompt);
  }
  std::vector<SampledToken> sample_rows(const std::vector<SampleRow>& rows) override {
    PYBIND11_OVERRIDE_PURE(std::vector<SampledToken>, Backend, sample_rows, rows);
  }

  void bind_gpu_to_thread() override { PYBIND11_OVERRIDE(void, Backend, bind_gpu_to_thread); }
  int32_t create_stream() override { PYBIND11_OVERRIDE_PURE(int32_t, Backend, create_stream); }
  int32_t create_event() override { PYBIND11_OVERRIDE_PURE(int32_t, Backend, create_event); }
  void record_event(int32_t event, int32_t stream) override {
    PYBIND11_OVERRIDE(void, Backend, record_event, event, stream);
  }
  void stream_wait_event(int32_t stream, int32_t event) override {
    PYBIND11_OVERRIDE(void, Backend, stream_wait_event, stream, event);
  }
  void synchronize(int32_t stream) override {
    PYBIND11_OVERRIDE(void, Backend, synchronize, stream);
  }
  void teardown() override { PYBIND11_OVERRIDE(void, Backend, teardown); }

  void alloc_sequence(Sequence& seq) override {
    PYBIND11_OVERRIDE_PURE(void, Backend, alloc_sequence, &seq);
  }
  void alloc_sequence_for(Sequence& seq, int32_t budget) override {
    PYBIND11_OVERRIDE_PURE(void, Backend, alloc_sequence_for, &seq, budget);
  }
  void free_sequence(Sequence& seq) override {
    PYBIND11_OVERRIDE_PURE(void, Backend, free_sequence, &seq);
  }
  void cache_sequence(Sequence& seq) override { MET_OVERRIDE_SEQ(cache_sequence); }
  void compact_sequence(Sequence& seq, int64_t new_slot) override {
    PYBIND11_OVERRIDE_PURE(void, Backend, compact_sequence, &seq, new_slot);
  }
  int32_t num_free_blocks() override { PYBIND11_OVERRIDE_PURE(int32_t, Backend, num_free_blocks); }

  int32_t adapter_id_for(int32_t slot) override {
    PYBIND11_OVERRIDE(int32_t, Backend, adapter_id_for, slot);
  }
  int32_t acquire_adapter_slot(int32_t slot) override {
    PYBIND11_OVERRIDE(int32_t, Backend, acquire_adapter_slot, slot);
  }

  void ep_broadcast_cmd_for_seq(uint32_t seq, uint32_t cmd) override {
    PYBIND11_OVERRIDE(void, Backend, ep_broadcast_cmd_for_seq, seq, cmd);
  }
  void ep_broadcast_cmd(uint32_t word) override {
    PYBIND11_OVERRIDE(void, Backend, ep_broadcast_cmd, word);
  }
  void ep_broadcast_tokens(const std::vector<int32_t>& tokens) override {
    PYBIND11_OVERRIDE(void, Backend, ep_broadcast_tokens, tokens);
  }
  void ep_sync_vision_embeds(int32_t n) override {
    PYBIND11_OVERRIDE(void, Backend, ep_sync_vision_embeds, n);
  }

  void prefill(Sequence& seq, const std::vector<int32_t>& prompt, int32_t stream) override {
    PYBIND11_OVERRIDE_PURE(void, Backend, prefill, &seq, prompt, stream);
  }
  void prefill_chunk(Sequence& seq, const std::vector<int32_t>& prompt, int32_t start, int32_t len,
                     bool last, int32_t stream) override {
    PYBIND11_OVERRIDE_PURE(void, Backend, prefill_chunk, &seq, prompt, start, len, last, stream);
  }
  void mixed_forward(const std::vector<Sequence*>& decode_seqs,
                     const std::vector<int32_t>& decode_tokens, const PrefillSlice& slice,
                     int32_t stream) override {
    PYBIND11_OVERRIDE_PURE(void, Backend, mixed_forward, decode_seqs, decode_tokens, slice, stream);
  }
  void mixed_forward_batch(const std::vector<Sequence*>& decode_seqs,
                           const std::vector<int32_t>& decode_tokens,
                           const std::vector<PrefillSlice>& slices, int32_t stream) override {
    PYBIND11_OVERRIDE_PURE(void, Backend, mixed_forward_batch, decode_seqs, decode_tokens, slices,
                           stream);
  }
  void prefill_batch_chunk(const std::vector<PrefillSlice>& slices, int32_t stream) override {
    PYBIND11_OVERRIDE_PURE(void, Backend, prefill_batch_chunk, slices, stream);
  }
  void decode_batch(const std::vector<int32_t>& tokens, const std::vector<Sequence*>& seqs,
                    int32_t stream) override {
    try {
      PYBIND11_OVERRIDE_PURE(void, Backend, decode_batch, tokens, seqs, stream);
    } catch (py::error_already_set& e) {
      if (e.matches(g_kv_exhausted)) throw KvExhausted();
      throw;
    }
  }
  void commit_ctx(Sequence& seq, int32_t n, int32_t base, int32_t row) override {
    MET_OVERRIDE_SEQ(commit_ctx, n, base, row);
  }
  std::vector<int32_t> decode_verify_batched(const std::vector<int32_t>& tokens,
                                             const std::vector<int32_t>& ks,
                                             const std::vector<Sequence*>& seqs, int32_t stream,
                                             bool argmax) override {
    try {
      PYBIND11_OVERRIDE_PURE(std::vector<int32_t>, Backend, decode_verify_batched, tokens, ks, seqs,
                             stream, argmax);
    } catch (py::error_already_set& e) {
      if (e.matches(g_kv_exhausted)) throw KvExhausted();
      throw;
    }
  }
  void mixed_verify_batch(const std::vector<int32_t>& tokens, const std::vector<int32_t>& ks,
                          const std::vector<Sequence*>& seqs,
                          const std::vector<PrefillSlice>& slices, int32_t stream) override {
    try {
      PYBIND11_OVERRIDE_PURE(void, Backend, mixed_verify_batch, tokens, ks, seqs, slices, stream);
    } catch (py::error_already_set& e) {
      if (e.matches(g_kv_exhausted)) throw KvExhausted();
      throw;
    }
  }
  void commit_accepted_prefix(Sequence& seq, int32_t na, int32_t k) override {
    PYBIND11_OVERRIDE_PURE(void, Backend, commit_accepted_prefix, &seq, na, k);
  }
  void normalize_ssm_states(Sequence& seq, int32_t stream) override {
    MET_OVERRIDE_SEQ(normalize_ssm_states, stream);
  }
  void poll_innerq() override { PYBIND11_OVERRIDE(void, Backend, poll_innerq); }
  void decode_marconi_checkpoint(Sequence& seq) override {
    MET_OVERRIDE_SEQ(decode_marconi_checkpoint);
  }

  int32_t argmax_on_device(int32_t row, int32_t stream) override {
    PYBIND11_OVERRIDE_PURE(int32_t, Backend, argmax_on_device, row, stream);
  }
  std::vector<int32_t> argmax_batch(int32_t row, int32_t n, int32_t stream) override {
    PYBIND11_OVERRIDE_PURE(std::vector<int32_t>, Backend, argmax_batch, row, n, stream);
  }
  void copy_logits_to_host(int32_t row, int32_t n) override {
    PYBIND11_OVERRIDE_PURE(void, Backend, copy_logits_to_host, row, n);
  }
};

}  // namespace

void bind_backend(py::module_& m) {
  g_kv_exhausted = py::register_exception<KvExhausted>(m, "KvExhausted", PyExc_RuntimeError).ptr();

  // Only the defaults are bound as callable methods: a Python subclass overrides by name and may
  // call super() for them; pure methods have no C++ body to call.
  py::class_<Backend, PyBackend>(m, "Backend")
      .def(py::init<>())
      .def("snapshot_pool_occupancy", &Backend::snapshot_pool_occupancy)
      .def("match_prefix", &Backend::match_prefix)
      .def("bind_gpu_to_thread", &Backend::bind_gpu_to_thread)
      .def("record_event", &Backend::record_event)
      .def("stream_wait_event", &Backend::stream_wait_event)
      .def("synchronize", &Backend::synchronize)
      .def("teardown", &Backend::teardown)
      .def("cache_sequence", &Backend::cache_sequence)
      .def("adapter_id_for", &Backend::adapter_id_for)
      .def("acquire_adapter_slot", &Backend::acquire_adapter_slot)
      .def("ep_broadcast_cmd_for_seq", &Backend::ep_broadcast_cmd_for_seq)
      .def("ep_broadcast_cmd", &Backend::ep_broadcast_cmd)
      .def("ep_broadcast_tokens", &Backend::ep_broadcast_tokens)
      .def("ep_sync_vision_embeds", &Backend::ep_sync_vision_embeds)
      .def("commit_ctx", &Backend::commit_ctx)
      .def("normalize_ssm_states", &Backend::normalize_ssm_states)
      .def("poll_innerq", &Backend::poll_innerq)
      .def("decode_marconi_checkpoint", &Backend::decode_marconi_checkpoint);
}

}  // namespace met::bindings
